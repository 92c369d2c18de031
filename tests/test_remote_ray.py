"""The Ray engine on shards in a bucket: its workers open their shards themselves (the driver
reads none), from moto's S3 server on 127.0.0.1; the rows are the local engine's."""
import glob
import json
import os

import pytest

ray = pytest.importorskip("ray", reason="the Ray engine is tested where wdsfilter[ray] is installed")
pytest.importorskip("s3fs")
pytest.importorskip("moto")

from remotekit import BUCKET, s3_server, upload  # noqa: E402
from scorekit import make_shards  # noqa: E402
from wdsfilter.score import score  # noqa: E402
from wdsfilter.runfolder.tables import read_rows  # noqa: E402
from wdsfilter.score.ray_runner import score_on_ray  # noqa: E402
from raykit import local_ray  # noqa: E402

pytestmark = pytest.mark.slow
SCORER = "scorekit:BrightnessScorer"


def test_ray_workers_read_their_shards_from_s3(tmp_path):
    folder = str(tmp_path / "shards")
    make_shards(folder, [10, 7, 5], bad={1: (2,)})
    with s3_server() as (endpoint, client):
        upload(client, folder, "set")
        with local_ray({k: os.environ[k] for k in os.environ if k.startswith("AWS_")}):
            on_ray = score_on_ray(f"s3://{BUCKET}/set/", out=str(tmp_path / "ray"), scorers=[SCORER],
                                  progress=False, batch_size=4, format="jsonl", remote_backoff_seconds=0.01)
            # the run folder and filtered shards in the bucket too (written through the driver's staging)
            in_bucket = score_on_ray(f"s3://{BUCKET}/set/", out=f"s3://{BUCKET}/runs/ray", scorers=[SCORER],
                                     write_shards=f"s3://{BUCKET}/kept/ray", progress=False, batch_size=4,
                                     format="jsonl", remote_backoff_seconds=0.01)
            objects = {o["Key"]: client.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read()
                       for o in client.list_objects_v2(Bucket=BUCKET, Prefix="runs/ray/")["Contents"]}
            kept = [o["Key"] for o in client.list_objects_v2(Bucket=BUCKET, Prefix="kept/ray/")["Contents"]]
    local = score(folder, out=str(tmp_path / "local"), scorers=[SCORER], device="cpu", workers=0, progress=False,
                  batch_size=4, format="jsonl")
    assert on_ray.shards_failed == [] and on_ray.rows == local.rows == 22

    def rows(out):
        return {os.path.basename(p): [{k: v for k, v in r.items() if k != "shard"} for r in read_rows(p)]
                for p in sorted(glob.glob(os.path.join(out, "scores", "*.jsonl")))}
    assert rows(str(tmp_path / "ray")) == rows(str(tmp_path / "local"))
    assert in_bucket.shards_failed == [] and in_bucket.rows == 22 and in_bucket.out == f"s3://{BUCKET}/runs/ray"
    assert {f"kept/ray/shard-000{i}.tar" for i in range(3)} <= set(kept)
    bucket_rows = {k.rsplit("/", 1)[1]: [{c: v for c, v in json.loads(line).items() if c != "shard"}
                                         for line in body.decode().splitlines() if line.strip()]
                   for k, body in objects.items() if "/scores/" in k}
    assert bucket_rows == rows(str(tmp_path / "local"))
    assert "runs/ray/done/shard-0002.json" in objects and json.loads(objects["runs/ray/.lock.json"])["released"]
