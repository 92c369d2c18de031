"""Safe by default: no shell commands from pipe: URLs, no network, no unpickling."""
import os
import pickle

import pytest

from shardkit import image_bytes, image_text_members, write_shard
from wdsfilter import StageConfig, UnsafeInputError
from wdsfilter.stream.pipeline import sample_pipeline
from wdsfilter.storage.shards import expand_urls


def test_pipe_urls_are_refused_and_never_run(tmp_path):
    marker = tmp_path / "ran"
    with pytest.raises(UnsafeInputError, match="allow_pipe"):
        list(sample_pipeline([f"pipe:touch {marker}"]))
    assert not marker.exists()


def test_pipe_urls_work_when_allowed(tmp_path):
    url = write_shard(tmp_path / "a.tar", image_text_members(3))
    samples = list(sample_pipeline([f"pipe:cat {url}"], StageConfig(allow_pipe=True)))
    assert len(samples) == 3


def test_remote_urls_are_refused_when_network_reads_are_forbidden():
    # A URL the user names is read (docs/remote.md); allow_remote=False (--no-remote) forbids it.
    with pytest.raises(UnsafeInputError, match="allow_remote=False"):
        expand_urls(["https://example.com/shard-000000.tar"], allow_remote=False)


def test_unsafe_payload_kept_as_bytes_only_when_allowed(tmp_path):
    class Boom:
        def __reduce__(self):
            return (exec, ("raise RuntimeError('pickle was executed')",))
    payload = pickle.dumps(Boom())
    url = write_shard(tmp_path / "u.tar", [("0.jpg", image_bytes()), ("0.txt", "x"), ("0.pickle", payload)])
    from wdsfilter.stream.reading import group_samples, tar_members
    from wdsfilter.core.tally import Tally
    cfg = StageConfig(allow_unsafe=True)
    samples = list(group_samples(tar_members([{"url": url}], cfg, Tally()), cfg, Tally()))
    assert samples[0]["pickle"] == payload  # raw bytes: still nothing was unpickled


def test_expand_urls_folders_globs_braces_and_missing(tmp_path):
    for i in range(3):
        write_shard(tmp_path / f"s-{i:03d}.tar",
                    image_text_members(1))
    (tmp_path / "sub").mkdir()
    write_shard(tmp_path / "sub" / "t.tgz", image_text_members(1))
    assert [os.path.basename(u) for u in expand_urls(str(tmp_path))] == ["s-000.tar", "s-001.tar", "s-002.tar",
                                                                         "t.tgz"]
    assert len(expand_urls(str(tmp_path / "s-*.tar"))) == 3
    assert len(expand_urls(str(tmp_path / "s-{000..001}.tar"))) == 2
    from wdsfilter import ConfigError
    with pytest.raises(ConfigError, match="does not exist"):
        expand_urls(str(tmp_path / "nope.tar"))
    with pytest.raises(ConfigError, match="no shards found"):
        expand_urls(str(tmp_path / "*.zip"))
