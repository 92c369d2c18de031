"""Faults on `--engine ray` (issue 8 item 14), on a local Ray cluster: a batch that kills its model
actor is retried once, not forever; when it kills the actor again its rows are lost, its shard is
failed without a marker, the other shards finish, and --resume completes the run. Shard and output
paths reach the Ray workers absolute."""
import gc
import json
import os

import pytest

ray = pytest.importorskip("ray", reason="the Ray engine is tested where wdsfilter[ray] is installed")

from scorekit import make_shards  # noqa: E402
from wdsfilter.score.ray_runner import score_on_ray  # noqa: E402
import raykit  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

pytestmark = pytest.mark.slow


def cpus_free_within(cpus: float, seconds: float) -> bool:
    import time
    deadline = time.monotonic() + seconds
    while ray.available_resources().get("CPU", 0) < cpus:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


@pytest.fixture(scope="module")
def local_ray():
    # The test scorers live in tests/: the workers import them from there.
    with raykit.local_ray():
        yield


def test_a_batch_that_kills_its_actor_twice_fails_its_shard_and_resume_completes_it(local_ray, tmp_path,
                                                                                    monkeypatch, request):
    from faultkit import ExitScorer
    monkeypatch.chdir(tmp_path)  # relative shard and output paths: the workers get them absolute
    make_shards(tmp_path / "shards", [6, 6, 6])
    urls = [os.path.join("shards", f"shard-{s:04d}.tar") for s in range(3)]
    trip = tmp_path / "trip"
    trip.touch()
    scorer = ExitScorer(kill_key="s1_00003", trip_file=str(trip))  # every batch holding it kills the actor
    from wdsfilter.score import NothingScoredError
    # The run ended (no endless retry). The shard of the killing batch failed, without a marker;
    # a shard whose batch was in flight on the same actor when it died may have failed with it,
    # and when that was every shard the run says nothing was scored (its summary.json is written).
    gc.disable()  # only the run's own collection may free the last actor pool (checked below)
    request.addfinalizer(gc.enable)
    try:
        summary = score_on_ray(urls, out="out", scorers=[scorer], actors=1, batch_size=3, progress=False,
                               write_shards="kept")
        failed, scored = {f["url"]: f["reason"] for f in summary.shards_failed}, summary.status.get("scored", 0)
    except NothingScoredError:
        written = json.load(open(tmp_path / "out" / "summary.json"))
        failed, scored = {f["url"]: f["reason"] for f in written["shards_failed"]}, 0
    assert urls[1] in failed and "a batch failed twice (its model actor died" in failed[urls[1]]
    done = sorted(os.listdir(tmp_path / "out" / "done"))
    assert "shard-0001.json" not in done
    assert len(done) + len(failed) == 3 and scored == 6 * len(done)
    assert sorted(f for f in os.listdir(tmp_path / "kept") if f.endswith(".tar")) == [d[:-5] + ".tar" for d in done]
    # the failure ledger lists each failed shard whole, as a transient failure (a dead model worker)
    from wdsfilter.score.ledger import read_entries
    whole = {e["shard"]: e for e in read_entries(str(tmp_path / "out" / "failures.parquet")) if e["index"] == -1}
    assert set(whole) == set(failed) and whole[urls[1]]["reason"] == "worker_died" and whole[urls[1]]["transient"]

    # The run gave its actors back (a restarted one too): else the --resume below waits for ever
    # for a CPU that the last run's actor pool still holds.
    freed = cpus_free_within(2.0, seconds=15)
    gc.enable()
    assert freed

    trip.unlink()  # the host has memory again
    again = score_on_ray(urls, out="out", scorers=[scorer], actors=1, batch_size=3, progress=False,
                         write_shards="kept", resume=True)
    assert again.shards_failed == [] and again.shards_resumed == len(done) and again.status == {"scored": 18}
    marker = json.load(open(tmp_path / "out" / "done" / "shard-0001.json"))
    assert marker["url"] == urls[1] and marker["engine"] == "ray"


def test_a_full_disk_stops_a_ray_run_with_a_clear_error(local_ray, tmp_path):
    from faultkit import big_shards, small_tmpfs, temporaries
    from wdsfilter.score.faults import DiskFullError
    with small_tmpfs(tmp_path / "small") as (mnt, _):
        urls = big_shards(tmp_path / "shards", 4)  # two filtered shards fit, not four
        with pytest.raises(DiskFullError, match="no space left on the device"):
            score_on_ray(urls, out=str(tmp_path / "out"), scorers=["scorekit:BrightnessScorer"], actors=1,
                         batch_size=6, progress=False, write_shards=str(mnt / "kept"))
        done = sorted(os.listdir(tmp_path / "out" / "done"))
        assert len(done) < 4 and temporaries(str(tmp_path / "out"), str(mnt / "kept")) == []
        assert sorted(f for f in os.listdir(mnt / "kept") if f.endswith(".tar")) == [d[:-5] + ".tar" for d in done]


def test_ray_ledger_and_retry_failed_give_the_one_shot_rows(local_ray, tmp_path):
    """On Ray: the ledger lists the transient and the data failures as the local engine does;
    --retry-failed scores only the transient ones again, in place, filtered shards included."""
    from faultkit import FlakyScorer
    from wdsfilter.score import score
    from wdsfilter.score.ledger import read_entries
    from wdsfilter.runfolder.tables import read_rows
    urls, _ = make_shards(tmp_path / "shards", [8, 7], refused={0: (3,)}, bad={1: (2,)})
    files = {k: tmp_path / k for k in ("raise", "oom", "prep")}
    files["raise"].write_text("s0_00005\n")
    files["oom"].write_text("s1_00001\n")
    files["prep"].write_text("s1_00006\n")
    log = tmp_path / "log"

    def scorer():
        return FlakyScorer(raise_file=str(files["raise"]), oom_file=str(files["oom"]), prepare_file=str(files["prep"]),
                           fail_word="refuse-me", log=str(log))

    out = str(tmp_path / "ray")
    score_on_ray(urls, out=out, scorers=[scorer()], actors=1, batch_size=4, progress=False, write_shards=out + "-kept",
                 min_scores={"brightness": 0.3})
    listed = {e["key"]: (e["reason"], e["stage"], e["transient"]) for e in read_entries(out + "/failures.parquet")}
    assert listed == {"s0_00005": ("score_error", "score", True), "s1_00001": ("out_of_memory", "score", True),
                      "s1_00006": ("prepare_error", "prepare", True), "s0_00003": ("caption_refused", "prepare", False),
                      "s1_00002": ("corrupt_image", "decode", False)}
    for f in files.values():
        f.write_text("")
    log.write_text("")
    again = score_on_ray(urls, out=out, scorers=[scorer()], actors=1, batch_size=4, progress=False,
                         write_shards=out + "-kept", min_scores={"brightness": 0.3}, retry_failed=True)
    assert again.retried == {"samples": 3, "scored": 3} and again.shards_failed == []
    assert set(log.read_text().split()) == {"s0_00005", "s1_00001", "s1_00006"}
    assert {e["key"] for e in read_entries(out + "/failures.parquet")} == {"s0_00003", "s1_00002"}
    clean = str(tmp_path / "clean")  # the same shards scored once, without the faults, by the local engine
    score(urls, out=clean, scorers=[scorer()], device="cpu", progress=False, workers=0, write_shards=clean + "-kept",
          min_scores={"brightness": 0.3})
    for name in sorted(os.listdir(clean + "/scores")):
        got, want = read_rows(f"{out}/scores/{name}"), read_rows(f"{clean}/scores/{name}")
        assert [(r["key"], r["index"], r["status"], r["kept"]) for r in got] == \
               [(r["key"], r["index"], r["status"], r["kept"]) for r in want]
        assert [r["brightness"] for r in got] == pytest.approx([r["brightness"] for r in want], abs=1e-6)
        stem = name[:-len(".parquet")]
        assert open(f"{out}-kept/{stem}.tar", "rb").read() == open(f"{clean}-kept/{stem}.tar", "rb").read()
