"""`wdsfilter filter` on the output folder of the Ray engine: the same counts, cut values, written
shards and report as on the local engine's folder for the same shards."""
import json
import os

import pytest

ray = pytest.importorskip("ray", reason="the Ray engine is tested where wdsfilter[ray] is installed")

from filterkit import run_cli  # noqa: E402
from wdsfilter.score import score  # noqa: E402
from wdsfilter.score.ray_runner import score_on_ray  # noqa: E402
from raykit import local_ray  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SS = os.path.join(REPO, "sample_shards")
SHARDS = [os.path.join(SS, p) for p in ("images-000000.tar", "images-000001.tar", "json-captions-000000.tar",
                                        "broken/corrupt-jpeg-000000.tar")]
OPTIONS = dict(caption_key="txt;json:description", progress=False, save_embeddings=True)

pytestmark = pytest.mark.slow


def test_filter_reads_a_ray_run_like_a_local_one(tiny_clip, tmp_path):
    model = "local-dir:" + tiny_clip
    score(SHARDS, out=str(tmp_path / "local"), model=model, device="cpu", workers=0, **OPTIONS)
    with local_ray():
        score_on_ray(SHARDS, out=str(tmp_path / "ray"), model=model, batch_size=8, **OPTIONS)
    outputs = {}
    for engine in ("local", "ray"):
        folder = str(tmp_path / engine)
        assert os.path.exists(os.path.join(folder, "report.html"))  # score wrote it on both engines
        for sub, ext in (("img_emb", ".npy"), ("text_emb", ".npy"), ("metadata", ".parquet")):  # clip-retrieval's layout
            assert sorted(os.listdir(os.path.join(folder, "embeddings", sub))) == sorted(
                os.path.basename(s)[:-4] + ext for s in SHARDS)
        r = run_cli("filter", folder, "--top", "clip_score=40%", "--write-shards", str(tmp_path / f"{engine}-kept"),
                    "--samples-per-shard", "16", "--no-report")
        assert r.returncode == 0, r.stderr
        lines = [line.split("(")[0] for line in r.stdout.splitlines() if " kept" in line]
        outputs[engine] = (lines, json.load(open(os.path.join(folder, "thresholds.json"))))
    assert outputs["ray"][0] == outputs["local"][0] and len(outputs["ray"][0]) == 2
    cut_ray = outputs["ray"][1]["min_scores"]["clip_score"]
    cut_local = outputs["local"][1]["min_scores"]["clip_score"]
    assert abs(cut_ray - cut_local) < 1e-4  # the same row, scored on two engines
    local_kept, ray_kept = tmp_path / "local-kept", tmp_path / "ray-kept"
    names = sorted(f for f in os.listdir(local_kept) if f.endswith(".tar") or f == "sizes.json")
    assert names == sorted(f for f in os.listdir(ray_kept) if f.endswith(".tar") or f == "sizes.json")
    for name in names:
        assert (ray_kept / name).read_bytes() == (local_kept / name).read_bytes(), name
