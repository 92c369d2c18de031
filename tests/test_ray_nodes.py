"""The Ray engine on a cluster of three nodes that share no filesystem (issue 33 item 2): a head
node (the driver's) and two worker nodes, each with its own CPUs, object store, temporary and
working folder, made by ray.cluster_utils.Cluster (tests/raykit.py). The worker nodes do not see
the driver's folders: a path that exists only on the driver is missing there, as on a real
cluster. Shards come from moto's S3 server on 127.0.0.1, or from a folder only the driver has;
run folders are a folder only the driver has, or a bucket. Each run's markers say which nodes
read and scored each shard: the work is spread over the nodes, and the rows are those of a
one-machine run of the same shards."""
import glob
import json
import os

import pytest

ray = pytest.importorskip("ray", reason="the Ray engine is tested where wdsfilter[ray] is installed")
pytest.importorskip("ray.data")
pytest.importorskip("s3fs")
pytest.importorskip("moto")

from raykit import multi_node_cluster  # noqa: E402
from remotekit import BUCKET, s3_server, upload  # noqa: E402
from scorekit import make_shards  # noqa: E402
from wdsfilter.runfolder.tables import read_rows  # noqa: E402
from wdsfilter.score import score  # noqa: E402
from wdsfilter.score.ray_runner import score_on_ray  # noqa: E402

pytestmark = pytest.mark.slow
SCORER = "scorekit:BrightnessScorer"
COUNTS = [7, 6, 6, 5, 6, 4]
# Two model actors of 1.5 CPUs: one fits on each worker node (3 CPUs), none on the head (1 CPU),
# so the rows are scored on two nodes; the read tasks (1 CPU) fit beside them on every node.
ACTORS = dict(actors=2, cpus_per_actor=1.5)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """(cluster, driver folder, bucket client): a folder only the driver sees holds the shards and
    the local runs; the same shards are in the bucket under set/."""
    driver = tmp_path_factory.mktemp("driver-only")
    make_shards(str(driver / "shards"), COUNTS, bad={2: (3,)})
    with s3_server() as (_, client):  # first: the nodes inherit the AWS variables that point at it
        upload(client, str(driver / "shards"), "set")
        with multi_node_cluster([str(driver)], head_cpus=1, cpus=3) as nodes:
            # Ray Data starts feeding its actor pool when the first actor is up; so that both
            # actors score, whatever the load, it waits here for both (a Ray Data setting).
            context = ray.data.DataContext.get_current()
            saved, context.wait_for_min_actors_s = context.wait_for_min_actors_s, 600
            try:
                yield nodes, driver, client
            finally:
                context.wait_for_min_actors_s = saved


@pytest.fixture(scope="module")
def one_machine(cluster):
    """The shards scored by the local engine: the rows every Ray run must give."""
    _, driver, _ = cluster
    out = str(driver / "one-machine")
    score(str(driver / "shards"), out=out, scorers=[SCORER], device="cpu", workers=0, progress=False,
          batch_size=4, format="jsonl")
    return rows(out)


def rows(out: str) -> dict:
    return {os.path.basename(p): [{k: v for k, v in r.items() if k != "shard"} for r in read_rows(p)]
            for p in sorted(glob.glob(os.path.join(out, "scores", "*.jsonl")))}


def markers(out: str) -> list:
    found = []
    for path in sorted(glob.glob(os.path.join(out, "done", "*.json"))):
        with open(path) as f:
            found.append(json.load(f))
    return found


def download(client, prefix: str, folder: str) -> str:
    """Every object under prefix in the test bucket, as files under folder."""
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    for item in (obj for page in pages for obj in page.get("Contents", ())):
        path = os.path.join(folder, item["Key"][len(prefix):])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        client.download_file(BUCKET, item["Key"], path)
    return folder


def test_shards_in_a_bucket_scored_on_every_node_into_a_folder_only_the_driver_has(cluster, one_machine):
    nodes, driver, _ = cluster
    out, kept = str(driver / "run-local"), str(driver / "kept")
    summary = score_on_ray(f"s3://{BUCKET}/set/", out=out, scorers=[SCORER], write_shards=kept, progress=False,
                           batch_size=4, format="jsonl", remote_backoff_seconds=0.01, **ACTORS)
    assert summary.shards_failed == [] and summary.rows == sum(COUNTS)
    assert rows(out) == one_machine
    assert sorted(os.listdir(kept)) == sorted(f"shard-{i:04d}.tar" for i in range(len(COUNTS))) + ["sizes.json"] \
        or {f"shard-{i:04d}.tar" for i in range(len(COUNTS))} <= set(os.listdir(kept))
    done = markers(out)
    assert len(done) == len(COUNTS) and all(m["engine"] == "ray" for m in done)
    read_on = {m["nodes"]["read"] for m in done}
    scored_on = {n for m in done for n in m["nodes"]["scored"]}
    # read and scored on at least two nodes each, every one a node of this cluster
    assert len(read_on) >= 2 and len(scored_on) >= 2, (read_on, scored_on)
    assert read_on | scored_on <= {nodes.head, *nodes.worker_ids}
    # the run folder stayed on the driver: no node wrote into its own copy of the path
    assert not any(glob.glob(os.path.join(home, "**", "*.jsonl"), recursive=True) for home in nodes.node_homes)
