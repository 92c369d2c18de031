"""`wdsfilter dedup` on a Ray run: the hash scorer goes through the shared scorer interface, so the
Ray engine's score files give the same groups and survivors as the local engine's."""
import os

import pyarrow.parquet as pq
import pytest

ray = pytest.importorskip("ray", reason="the Ray engine is tested where wdsfilter[ray] is installed")

from dedupkit import build  # noqa: E402
from wdsfilter.dedup import dedup  # noqa: E402
from wdsfilter.score import score  # noqa: E402
from wdsfilter.score.ray_runner import score_on_ray  # noqa: E402
from raykit import local_ray  # noqa: E402

pytestmark = pytest.mark.slow


def marks(run):
    return {(f, r["key"]): (r["group"], r["kind"], r["survivor"]) for f in sorted(os.listdir(os.path.join(run, "dedup")))
            if f.endswith(".parquet") for r in pq.read_table(os.path.join(run, "dedup", f)).to_pylist()}


def test_ray_and_local_runs_dedup_alike(tmp_path):
    shards, truth = build(tmp_path / "shards", bases=("coffee", "rocket", "camera"),
                          variants=("copy", "jpeg_q30", "resize_50", "png"), alikes=["brick", "grass"])
    with local_ray():
        score_on_ray(shards, out=str(tmp_path / "ray"), scorers=["hash"], image_key="jpg;png", progress=False)
    score(shards, out=str(tmp_path / "local"), scorers=["hash"], image_key="jpg;png", progress=False, workers=0,
          device="cpu")
    on_ray, local = dedup(str(tmp_path / "ray")), dedup(str(tmp_path / "local"))
    assert on_ray.groups == local.groups >= 3 and on_ray.duplicates == local.duplicates
    assert marks(str(tmp_path / "ray")) == marks(str(tmp_path / "local"))
