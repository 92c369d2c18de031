"""Without network, a hub model is one ConfigError at once, not a minute of retry warnings."""
from __future__ import annotations

import socket

import pytest

pytest.importorskip("open_clip")
constants = pytest.importorskip("huggingface_hub.constants")

from wdsfilter.core.errors import ConfigError  # noqa: E402
from wdsfilter.score import models  # noqa: E402


LOOKUPS = []  # each DNS lookup tried: a download retried looks the host up again each time


def _no_dns(host, *args, **kwargs):
    LOOKUPS.append(host)
    raise socket.gaierror(-2, "Name or service not known")


@pytest.fixture
def offline(monkeypatch, tmp_path):
    monkeypatch.setattr(socket, "getaddrinfo", _no_dns)
    LOOKUPS.clear()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    for name in models.PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "hf-cache"  # empty: nothing cached


def test_hub_model_without_network_is_one_quick_config_error(offline):
    with pytest.raises(ConfigError) as e:
        models.ClipSource.resolve("hf-hub:laion/CLIP-ViT-B-32-laion2B-s34B-b79K", cache_dir=str(offline))
    # Counted, not timed (a time limit failed on a busy machine): one look-up, no retried download.
    assert LOOKUPS == ["huggingface.co"], "retried the download instead of reading the cache only"
    message = str(e.value)
    assert "no network: huggingface.co does not resolve" in message and "local-dir:" in message
    assert "\n" not in message
    assert constants.HF_HUB_OFFLINE is False  # offline only inside the download


def test_pretrained_tag_without_network_is_one_quick_config_error(offline):
    source = models.ClipSource.resolve("ViT-B-32", "laion2b_s34b_b79k")
    with pytest.raises(ConfigError, match="no network: huggingface.co does not resolve"):
        models.load_model(source, "cpu", cache_dir=str(offline))
    assert LOOKUPS == ["huggingface.co"]


def test_behind_a_proxy_the_hub_is_not_judged_by_local_dns(offline, monkeypatch):
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    assert models.hub_unreachable() is None
