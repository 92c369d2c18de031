"""The Ray engine on a cluster of three nodes that share no filesystem (issue 33 item 2): a head
node (the driver's) and two worker nodes, each with its own CPUs, object store, temporary and
working folder, made by ray.cluster_utils.Cluster (tests/raykit.py). The worker nodes do not see
the driver's folders: a path that exists only on the driver is missing there, as on a real
cluster. Shards come from moto's S3 server on 127.0.0.1, or from a folder only the driver has;
run folders are a folder only the driver has, or a bucket. Each run's markers say which nodes
read and scored each shard: the work is spread over the nodes, and the rows are those of a
one-machine run of the same shards."""
import concurrent.futures
import glob
import json
import os
import shutil

import pytest

ray = pytest.importorskip("ray", reason="the Ray engine is tested where wdsfilter[ray] is installed")
pytest.importorskip("ray.data")
pytest.importorskip("s3fs")
pytest.importorskip("moto")

from raykit import multi_node_cluster, wait_until  # noqa: E402
from remotekit import BUCKET, s3_server, upload  # noqa: E402
from scorekit import make_shards  # noqa: E402
from wdsfilter.core.errors import ConfigError  # noqa: E402
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


def in_thread(during, after, function, *args, **kwargs):
    """function(*args, **kwargs) in a thread while during(its future) runs here, then after(); its
    result, or a failure after 600 s instead of a hang (the thread is left behind: the end of the
    module's cluster ends it)."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        run = pool.submit(function, *args, **kwargs)
        try:
            during(run)
        finally:
            after()
        return run.result(timeout=600)
    finally:
        pool.shutdown(wait=False)


def download(client, prefix: str, folder: str) -> str:
    """Every object under prefix in the test bucket, as files under folder."""
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    for item in (obj for page in pages for obj in page.get("Contents", ())):
        path = os.path.join(folder, item["Key"][len(prefix):])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        client.download_file(BUCKET, item["Key"], path)
    return folder


def test_shards_in_a_bucket_scored_on_every_node_into_a_folder_only_the_driver_has(cluster, one_machine,
                                                                                    tmp_path_factory):
    nodes, driver, _ = cluster
    out, kept = str(driver / "run-local"), str(driver / "kept")
    # Every batch waits (faultkit.HoldScorer) until both actors hold one: Ray Data gives a batch to
    # the least busy actor, so the second goes to the other one, whatever the timing.
    shared = tmp_path_factory.mktemp("shared")  # the test's own signals, seen by every node
    hold, held = shared / "hold", shared / "held"
    hold.touch()
    held.mkdir()
    summary = in_thread(lambda run: wait_until(lambda: len(os.listdir(held)) >= 2 or run.done(),
                                               "a batch held by each actor", 300),
                        lambda: hold.unlink(missing_ok=True),
                        score_on_ray, f"s3://{BUCKET}/set/", out=out, scorers=["faultkit:HoldScorer"],
                        scorer_options={"bright": {"hold_file": str(hold), "held_dir": str(held)}},
                        write_shards=kept, progress=False, batch_size=4, format="jsonl",
                        remote_backoff_seconds=0.01, **ACTORS)
    assert len(os.listdir(held)) == 2  # two actors held a batch each
    assert summary.shards_failed == [] and summary.rows == sum(COUNTS)
    assert rows(out) == one_machine
    names = [f"shard-{i:04d}.tar" for i in range(len(COUNTS))]
    assert set(names) <= set(os.listdir(kept))
    done = markers(out)
    assert len(done) == len(COUNTS) and all(m["engine"] == "ray" for m in done)
    read_on = {m["nodes"]["read"] for m in done}
    scored_on = {n for m in done for n in m["nodes"]["scored"]}
    # read on at least two nodes (Ray Data spreads its read tasks), scored on both worker nodes
    # (one actor fits on each), every one a node of this cluster
    assert len(read_on) >= 2 and scored_on == set(nodes.worker_ids), (read_on, scored_on)
    assert read_on <= {nodes.head, *nodes.worker_ids}


def test_local_shards_only_the_driver_has_are_read_on_its_node_and_scored_on_the_others(cluster, one_machine):
    nodes, driver, _ = cluster
    out = str(driver / "run-local-shards")
    summary = score_on_ray(str(driver / "shards"), out=out, scorers=[SCORER], progress=False, batch_size=4,
                           format="jsonl", **ACTORS)
    assert summary.shards_failed == [] and rows(out) == one_machine
    done = markers(out)
    assert {m["nodes"]["read"] for m in done} == {nodes.head}  # the only node that has them
    scored_on = {n for m in done for n in m["nodes"]["scored"]}
    assert scored_on and scored_on <= set(nodes.worker_ids)  # where the actors are: none fits on the head


def test_a_model_folder_only_the_driver_has_is_sent_to_the_nodes_that_lack_it(cluster, tiny_clip, tmp_path_factory):
    nodes, driver, client = cluster
    model = str(driver / "tiny-clip")  # the tiny CLIP where only the driver has it
    if not os.path.isdir(model):
        shutil.copytree(tiny_clip, model)
    options = dict(model="local-dir:" + model, min_clip=0.1, progress=False, batch_size=4, format="jsonl")
    one = str(tmp_path_factory.mktemp("one-machine-clip"))
    score(str(driver / "shards"), out=one, device="cpu", workers=0, **options)
    out = f"s3://{BUCKET}/runs/clip"  # the run folder in the bucket (staged on the driver)
    summary = score_on_ray(f"s3://{BUCKET}/set/", out=out, **options, **ACTORS)
    assert summary.shards_failed == [] and summary.scored > 0
    fetched = download(client, "runs/clip/", str(tmp_path_factory.mktemp("fetched")))
    got, expected = rows(fetched), rows(one)
    assert sorted(got) == sorted(expected) and len(got) == len(COUNTS)
    for name, want in expected.items():  # batches differ between engines: scores agree to float rounding
        assert [(r["key"], r["status"], r["reason"], r["kept"]) for r in got[name]] == \
               [(r["key"], r["status"], r["reason"], r["kept"]) for r in want], name
        for a, b in zip(got[name], want):
            assert (a["clip_score"] is None) == (b["clip_score"] is None)
            assert b["clip_score"] is None or abs(a["clip_score"] - b["clip_score"]) < 1e-4, (name, a["key"])
    done = markers(fetched)
    scored_on = {n for m in done for n in m["nodes"]["scored"]}
    assert scored_on and scored_on <= set(nodes.worker_ids)
    # each worker node read its own copy, from its own cache: the driver's folder is not theirs
    copies = [glob.glob(os.path.join(os.path.dirname(home), "tmp", "wdsfilter-ray-files", "*", "tiny-clip"))
              for home in nodes.node_homes]
    assert all(len(c) == 1 and sorted(os.listdir(c[0])) == sorted(os.listdir(model)) for c in copies), copies


def test_a_scorer_that_cannot_read_a_copy_of_its_file_is_refused_naming_it(cluster, tmp_path):
    nodes, driver, _ = cluster
    weights = driver / "weights.bin"
    weights.write_bytes(b"only on the driver")
    with pytest.raises(ConfigError, match=r"weights\.bin.*(no shared filesystem)"):
        score_on_ray(f"s3://{BUCKET}/set/", out=str(tmp_path / "refused"), progress=False, format="jsonl",
                     scorers=["scorekit:LocalFileScorer"], scorer_options={"bright": {"path": str(weights)}})
    assert not os.path.exists(tmp_path / "refused" / "done") or not os.listdir(tmp_path / "refused" / "done")


def test_local_shards_larger_than_the_object_store_stream_without_spilling_or_waiting(cluster, tmp_path):
    """The bound, small: 289 MB of prepared inputs (480 rows of 3 x 448 x 448 pixels) made on
    the driver's node, whose object store holds 80 MB. Every read runs there (only it has the
    shards), so its store holds every block: none may be spilled to disk, and no task may wait
    for object store memory. With Ray Data's defaults 138 MB were spilled."""
    nodes, driver, _ = cluster
    make_shards(str(driver / "big"), [60] * 8)
    before, most = nodes.spilled(), [0]

    def watch(run):  # the raylets dump their state every 0.5 s
        while not run.done():
            most[0] = max(most[0], nodes.waiting_for_plasma())
            concurrent.futures.wait([run], timeout=0.2)
    summary = in_thread(watch, lambda: None, score_on_ray, str(driver / "big"), out=str(driver / "run-big"),
                        scorers=[SCORER], scorer_options={"bright": {"size": 448}}, progress=False, batch_size=16,
                        format="jsonl", **ACTORS)
    assert summary.rows == 480 and summary.shards_failed == []
    assert nodes.spilled() - before == 0 and most[0] == 0, (nodes.spilled() - before, most[0])
