"""Many `wdsfilter score --join` workers on one run folder (docs/scale.md): slices from the flags,
Slurm and Kubernetes; claims created atomically and taken over only from a stale worker, whose
lease is fenced (on a disk, S3 and GCS); a folder written by workers read as one written by one
run; settings that differ refused; the end of the run done once, redone by --resume; a failed
shard retried by a worker that starts later; --status. The runs under faults:
tests/test_score_join_faults.py."""
import json
import os
import time

import pytest
from click.testing import CliRunner

import workerkit
from scorekit import make_shards
from wdsfilter.cli import main
from wdsfilter.errors import ConfigError

TESTS = os.path.dirname(os.path.abspath(__file__))
NAMES = [f"shard-{i:04d}" for i in range(6)]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return make_shards(str(tmp_path_factory.mktemp("shards")), [7, 5, 6, 4, 8, 3], bad={1: (2,)},
                       no_caption={3: (0,)})[0]


@pytest.fixture(scope="module")
def reference(shards, tmp_path_factory):
    """The same shards and settings scored by one process, without --join."""
    out = str(tmp_path_factory.mktemp("reference") / "out")
    r = CliRunner().invoke(main, workerkit.worker_args(shards, out, "--write-shards", out + "-kept"),
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return out


@pytest.fixture(scope="module")
def s3():
    pytest.importorskip("moto")
    from remotekit import s3_server
    with s3_server() as (_, client):
        yield client


@pytest.fixture(scope="module")
def gcs():
    pytest.importorskip("gcsfs")
    from gcskit import gcs_server
    with gcs_server() as (_, fs):
        yield fs


def _env(**more):
    env = {k: v for k, v in os.environ.items() if k.startswith(("AWS_", "STORAGE_EMULATOR", "TMPDIR"))}
    return dict(env, PYTHONPATH=os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]), OMP_NUM_THREADS="1",
                WDSFILTER_LEASE_SECONDS="3", WDSFILTER_SYNC_SECONDS="0.2", **more)


# -- slices ---------------------------------------------------------------------------------------------
def test_a_slice_comes_from_the_flags_else_slurm_else_a_kubernetes_index_with_its_count():
    from wdsfilter.score.join import task_slice
    assert task_slice(None, None, {}) == (None, None)
    assert task_slice(1, 4, {"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_COUNT": "8"}) == (1, 4)
    slurm = {"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_MIN": "5", "SLURM_ARRAY_TASK_COUNT": "4"}
    assert task_slice(None, None, slurm) == (2, 4)  # --array=5-8: tasks 0..3
    assert task_slice(None, 3, {"JOB_COMPLETION_INDEX": "2"}) == (2, 3)
    with pytest.raises(ConfigError, match="give the number of tasks too"):
        task_slice(None, None, {"JOB_COMPLETION_INDEX": "2"})
    with pytest.raises(ConfigError, match="task index 4 is not in 0..3"):
        task_slice(4, 4, {})
    with pytest.raises(ConfigError, match="--task-count 2 without --task-index"):
        task_slice(None, 2, {})


def test_a_worker_takes_its_slice_first_then_the_others_from_their_ends():
    from wdsfilter.runfolder.claims import claim_order
    urls = [f"u{i}" for i in range(10)]
    assert claim_order(urls, "00000000", 1, 3) == (["u3", "u4", "u5"], ["u9", "u8", "u7", "u6", "u2", "u1", "u0"])
    assert claim_order(urls, "00000000", 1, 3, steal=False) == (["u3", "u4", "u5"], [])
    own, others = claim_order(urls, "00000007", None, None)  # no slice: the list from a point of its token
    assert own == urls[7:] + urls[:7] and others == []


# -- claims ---------------------------------------------------------------------------------------------
def _folder(kind, tmp_path, request):
    if kind == "local":
        return str(tmp_path / "run")
    if kind == "s3":
        from remotekit import BUCKET
        request.getfixturevalue("s3")
        return f"s3://{BUCKET}/claims-{request.node.name[-4:-1]}-{time.time_ns()}"
    from gcskit import BUCKET
    request.getfixturevalue("gcs")
    return f"gs://{BUCKET}/claims-{time.time_ns()}"


@pytest.mark.parametrize("kind", ["local", "s3", "gs"])
def test_a_claim_is_one_workers_and_is_taken_over_only_from_a_stale_worker_whose_lease_is_fenced(kind, tmp_path,
                                                                                               request):
    """Two workers claim the same shards: each shard is one's. Once one falls silent past its
    lease (its heartbeat stopped, as a stopped process's), the other takes its shard over, after
    fencing its lease: the silent one's next renewal fails, naming the taker."""
    from wdsfilter.runfolder.claims import Claims
    from wdsfilter.runfolder.lease import WORKERS, Lease, LeaseLostError
    folder = _folder(kind, tmp_path, request)
    names = {f"u{i}": f"s{i}" for i in range(3)}
    a = Lease(folder, name=f"{WORKERS}/aaaa.json", token="aaaa", stale=1.0).acquire()
    b = Lease(folder, name=f"{WORKERS}/bbbb.json", token="bbbb", stale=1.0).acquire()
    first = Claims(folder, names, a, "run1", ["u0", "u1", "u2"])
    second = Claims(folder, names, b, "run1", ["u0", "u1", "u2"])
    first.start()
    second.start()
    assert first.next() == "u0"
    theirs = second.next()  # not u0, first's: a claim is created only where none is
    mine = first.next()
    assert {theirs, mine} == {"u1", "u2"} and second.next() is None and first.next() is None
    survey = second.survey()
    assert survey.live == {"s0": "aaaa", names[mine]: "aaaa"} and not survey.takeable
    a._stop.set()  # first falls silent: its heartbeat stops, as a stopped process's does
    a._keeper.join()
    deadline = time.monotonic() + 30
    while not second.survey().takeable:  # the event: first's last heartbeat is older than its lease
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert {second.next(), second.next()} == {"u0", mine} and second.next() is None
    with pytest.raises(LeaseLostError, match=r"another wdsfilter score run \(pid \d+ on .*\) took it over"):
        a.renew()
    assert second.survey().live == {} and set(second.held) == {"s0", "s1", "s2"}
    second.fail("u0", "could not be opened")  # ended for the workers that started before now
    assert second.survey().failed == {"s0": "could not be opened"}
    third = Claims(folder, names, Lease(folder, name=f"{WORKERS}/cccc.json", token="cccc").acquire(), "run1", [])
    assert set(third.survey().takeable) == {"s0"}  # a failure before it started: it tries again
    for lease in (a, b, third.lease):
        lease.release()


def test_two_workers_score_a_run_as_one_process_does_and_every_reader_reads_it_the_same(shards, reference, tmp_path):
    """Two workers (--join) on one local folder, with --write-shards: the same rows, ledger,
    filtered shards and sizes.json as one process, one writer per shard, the run's end written
    once; `filter`, the report's reader and the loader's score filter read it as the one-process
    folder."""
    from wdsfilter.runfolder import ScoreRun
    out = str(tmp_path / "out")
    args = workerkit.worker_args(shards, out, "--join", "--write-shards", out + "-kept")
    workers = workerkit.run_all([args, args], _env(), str(tmp_path / "logs"))
    assert [w.proc.exitcode for w in workers] == [0, 0], [w.output() for w in workers]
    folder = workerkit.LocalFolder(out)
    assert workerkit._folder_violations(reference, NAMES, folder) == []
    writers = {folder.record(f"done/{n}.json")["writer"] for n in NAMES}
    assert writers <= {json.load(open(os.path.join(out, "workers", f)))["token"] for f in os.listdir(out + "/workers")}
    finishers = [w for w in workers if "the run's summary and report are written by" not in w.output()]
    assert len(finishers) == 1 and "scored 31 of 33 samples in 6 shard(s)" in finishers[0].output()
    for name in os.listdir(reference + "-kept"):  # filtered shards and their sidecars, byte for byte
        assert open(os.path.join(out + "-kept", name), "rb").read() == \
            open(os.path.join(reference + "-kept", name), "rb").read(), name
    ours, theirs = ScoreRun.open(out), ScoreRun.open(reference)
    assert [s.name for s in ours.shards] == NAMES == [s.name for s in theirs.shards] and not ours.unfinished
    counted = []
    for folder_ in (out, reference):
        r = CliRunner().invoke(main, ["filter", folder_, "--min", "brightness=0.3", "--dry-run"],
                               catch_exceptions=False)
        assert r.exit_code == 0, r.output
        counted.append([line for line in r.output.splitlines() if "kept" in line])
    assert counted[0] == counted[1] and counted[0]
    import wdsfilter
    keys = [[s["__key__"] for b in wdsfilter.loader(shards, scores=folder_, min_scores={"brightness": 0.3},
                                                    batch_size=2, output="dict") for s in b]
            for folder_ in (out, reference)]
    assert keys[0] == keys[1] and keys[0]


@pytest.mark.parametrize("kind", ["s3", "gs"])
def test_two_workers_on_a_bucket_run_folder_give_the_rows_of_one_process(kind, shards, reference, tmp_path,
                                                                          request, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    if kind == "s3":
        from remotekit import BUCKET
        client = request.getfixturevalue("s3")
        folder = workerkit.S3Folder(client, BUCKET, "two-workers")
    else:
        from gcskit import BUCKET
        folder = workerkit.GcsFolder(request.getfixturevalue("gcs"), BUCKET, "two-workers")
    args = workerkit.worker_args(shards, folder.out, "--join")
    workers = workerkit.run_all([args, args], _env(), str(tmp_path / "logs"))
    assert [w.proc.exitcode for w in workers] == [0, 0], [w.output() for w in workers]
    assert workerkit._folder_violations(reference, NAMES, folder) == []
    assert folder.finished(len(NAMES))
    assert not [n for n in os.listdir(tmp_path) if n.startswith("wdsfilter-out-")]  # no staging copy left


def test_settings_or_shards_that_differ_from_the_runs_are_refused_before_any_work(shards, tmp_path):
    out = str(tmp_path / "out")
    r = CliRunner().invoke(main, workerkit.worker_args(shards[:2], out, "--join"), catch_exceptions=False)
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, workerkit.worker_args(shards[:2], out, "--join", "--scorer-opt", "bright.size=4"))
    assert r.exit_code == 2 and "holds a run with other settings (scorers: was" in r.output, r.output
    assert "'size': 8" in r.output and "'size': 4" in r.output
    r = CliRunner().invoke(main, workerkit.worker_args(shards[:3], out, "--join"))
    assert r.exit_code == 2 and "shards: this worker was given 3 shard(s), the run" in r.output, r.output
    r = CliRunner().invoke(main, workerkit.worker_args(shards[:2], out, "--join", "--overwrite"))
    assert r.exit_code == 2 and "--join and --overwrite exclude each other" in r.output
    r = CliRunner().invoke(main, workerkit.worker_args(shards[:2], "hf://datasets/org/name/run", "--join"))
    assert r.exit_code == 2 and "the Hugging Face Hub is not written to directly" in r.output, r.output
    records = [json.load(open(os.path.join(out, "workers", f))) for f in os.listdir(os.path.join(out, "workers"))]
    assert len(records) == 3 and all(r["released"] for r in records)  # the refused ones: released at once
    assert sorted(os.listdir(os.path.join(out, "claims"))) == ["shard-0000.json", "shard-0001.json"]


def test_a_run_without_join_and_the_workers_of_a_joined_run_exclude_each_other(shards, tmp_path):
    from wdsfilter.runfolder.lease import WORKERS, Lease
    out = str(tmp_path / "out")
    with Lease(out, name=f"{WORKERS}/abcd.json", token="abcd"):  # a live worker
        r = CliRunner().invoke(main, workerkit.worker_args(shards[:2], out))
        assert r.exit_code == 2 and "is in use by the workers of a joined run" in r.output, r.output
        assert "wdsfilter score --status" in r.output
    with Lease(out):  # a live run without --join
        r = CliRunner().invoke(main, workerkit.worker_args(shards[:2], out, "--join"))
        assert r.exit_code == 2 and "is in use by a run without --join" in r.output, r.output


def test_slices_from_flags_and_slurm_each_worker_scores_its_own_with_no_steal(shards, tmp_path):
    out = str(tmp_path / "out")
    first = workerkit.worker_args(shards, out, "--task-index", "0", "--task-count", "2", "--no-steal")
    second = workerkit.worker_args(shards, out, "--join", "--no-steal")  # its slice from Slurm's variables
    w0, w1 = workerkit.run_all([first], _env(), str(tmp_path / "a"))[0], None
    env = _env(SLURM_ARRAY_TASK_ID="2", SLURM_ARRAY_TASK_MIN="1", SLURM_ARRAY_TASK_COUNT="2")
    assert "worker" in w0.output() and w0.proc.exitcode == 0, w0.output()
    assert "the run: 3 of 6 shard(s) done" in w0.output(), w0.output()
    w1 = workerkit.run_all([second], env, str(tmp_path / "b"))[0]
    assert w1.proc.exitcode == 0 and "scored 31 of 33 samples in 6 shard(s)" in w1.output(), w1.output()
    writers = [json.load(open(os.path.join(out, "done", f"{n}.json")))["writer"] for n in NAMES]
    assert writers[:3] == [writers[0]] * 3 and writers[3:] == [writers[3]] * 3 and writers[0] != writers[3]
    tasks = {json.load(open(os.path.join(out, "workers", f)))["task"] for f in os.listdir(os.path.join(out, "workers"))}
    assert tasks == {"0/2", "1/2"}


def test_the_end_of_the_run_is_done_once_and_redone_by_resume_when_its_worker_died(shards, reference, tmp_path):
    out = str(tmp_path / "out")
    r = CliRunner().invoke(main, workerkit.worker_args(shards, out, "--join"), catch_exceptions=False)
    assert r.exit_code == 0 and "scored 31 of 33 samples" in r.output, r.output
    end = json.load(open(os.path.join(out, ".finish.json")))
    assert end["finished"] and end["done"] == 6 and end["failed"] == 0
    again = CliRunner().invoke(main, workerkit.worker_args(shards, out, "--join"), catch_exceptions=False)
    assert again.exit_code == 0 and "written by another worker" in again.output  # nothing new: not redone
    # the worker that did the end died in it: its claim names a worker that is gone, no summary
    json.dump(dict(end, finished=None, worker="dead", pid=999999999), open(os.path.join(out, ".finish.json"), "w"))
    os.remove(os.path.join(out, "summary.json"))
    r = CliRunner().invoke(main, workerkit.worker_args(shards, out, "--resume"), catch_exceptions=False)
    assert r.exit_code == 0 and "all 6 shard(s) are already scored; summarising" in r.output, r.output
    assert json.load(open(os.path.join(out, "summary.json")))["scored"] == 31
    os.remove(os.path.join(out, "summary.json"))  # and a worker that joins later redoes it too
    r = CliRunner().invoke(main, workerkit.worker_args(shards, out, "--join"), catch_exceptions=False)
    assert r.exit_code == 0 and json.load(open(os.path.join(out, "summary.json")))["scored"] == 31, r.output


def test_a_shard_a_worker_cannot_read_is_failed_in_its_claim_and_retried_by_a_worker_started_later(shards,
                                                                                                  reference,
                                                                                                  tmp_path):
    import shutil
    folder = tmp_path / "in"
    folder.mkdir()
    for url in shards:
        shutil.copy(url, folder / os.path.basename(url))
    (folder / "shard-0002.tar").write_bytes(b"version https://git-lfs.github.com/spec/v1\n")  # not a tar
    mine = sorted(str(folder / os.path.basename(u)) for u in shards)
    out = str(tmp_path / "out")
    r = CliRunner().invoke(main, workerkit.worker_args(mine, out, "--join"), catch_exceptions=False)
    assert r.exit_code == 3 and "1 shard(s) FAILED" in r.output, r.output
    claim = json.load(open(os.path.join(out, "claims", "shard-0002.json")))
    assert "is it a tar" in claim["failed"]
    assert [e["index"] for e in workerkit.rows_of(open(os.path.join(out, "failures", "shard-0002.parquet"),
                                                       "rb").read())] == [-1]
    status = CliRunner().invoke(main, ["score", out, "--status"], catch_exceptions=False)
    assert status.exit_code == 0 and "6 shard(s): 5 done" in status.output and "1 failed" in status.output
    assert "shard shard-0002 FAILED" in status.output and "0 alive, 1 ended" in status.output, status.output
    shutil.copy(shards[2], folder / "shard-0002.tar")  # fixed: the next worker tries it again
    r = CliRunner().invoke(main, workerkit.worker_args(mine, out, "--join"), catch_exceptions=False)
    assert r.exit_code == 0 and "scored 31 of 33 samples in 6 shard(s)" in r.output, r.output
    assert workerkit._folder_violations(reference, NAMES, workerkit.LocalFolder(out), ignored=("shard",)) == []


def test_a_score_file_a_stalled_worker_put_back_after_the_marker_vouches_for_nothing(shards, tmp_path):
    """On a disk a worker stopped past its claim in the moment between its fence and its rename
    puts its score file back over the new holder's when it continues: the marker's worker is not
    the file's writer, so readers count the shard unfinished and --resume scores it again, even
    when the stray file has the same size."""
    import pyarrow.parquet as pq
    from wdsfilter.runfolder import ScoreRun
    out = str(tmp_path / "out")
    r = CliRunner().invoke(main, workerkit.worker_args(shards, out, "--join"), catch_exceptions=False)
    assert r.exit_code == 0, r.output
    path = os.path.join(out, "scores", "shard-0001.parquet")
    size, table = os.path.getsize(path), pq.read_table(path)
    pq.write_table(table.replace_schema_metadata({**table.schema.metadata, b"wdsfilter.writer": b"0123456789abcdef"}),
                   path)
    assert os.path.getsize(path) == size  # the sizes the marker recorded cannot tell it
    assert ScoreRun.open(out).unfinished == [shards[1]]
    r = CliRunner().invoke(main, workerkit.worker_args(shards, out, "--resume"), catch_exceptions=False)
    assert r.exit_code == 0 and "resume: 5 of 6 shard(s) already done, 1 to score" in r.output, r.output
    assert not ScoreRun.open(out).unfinished


@pytest.mark.slow  # three CLIP runs (the tiny model): one process and two workers
def test_workers_save_the_embeddings_of_one_process(tiny_clip, tmp_path):
    """--save-embeddings with two workers: every shard's image and caption embeddings and their
    metadata as one process writes them (clip-retrieval's layout: vector i is metadata row i)."""
    import numpy as np
    import pyarrow.parquet as pq
    root = os.path.dirname(TESTS)
    shards = [os.path.join(root, "sample_shards", f) for f in ("images-000000.tar", "images-000001.tar",
                                                                "json-captions-000000.tar")]
    args = ["score", *shards, "--scorer", "clip", "--model", f"local-dir:{tiny_clip}", "--caption-key",
            "txt;json:description", "--save-embeddings", "--device", "cpu", "--batch-size", "8", "--workers", "0",
            "--no-progress"]
    one = str(tmp_path / "one")
    r = CliRunner().invoke(main, [*args, "--out", one], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    out = str(tmp_path / "out")
    workers = workerkit.run_all([[*args, "--out", out, "--join"]] * 2, _env(), str(tmp_path / "logs"))
    assert [w.proc.exitcode for w in workers] == [0, 0], [w.output() for w in workers]
    for name in ("images-000000", "images-000001", "json-captions-000000"):
        for kind in ("img_emb", "text_emb"):
            mine, theirs = (np.load(os.path.join(f, "embeddings", kind, f"{name}.npy")) for f in (out, one))
            assert mine.shape == theirs.shape and np.allclose(mine, theirs, atol=2e-3), (name, kind)
        meta = [pq.read_table(os.path.join(f, "embeddings", "metadata", f"{name}.parquet")).to_pylist()
                for f in (out, one)]
        assert [m["key"] for m in meta[0]] == [m["key"] for m in meta[1]] and meta[0]


def test_one_retry_failed_process_retries_the_failures_of_a_run_two_workers_scored(shards, reference, tmp_path):
    """--retry-failed is one process's (with --join it is refused): on a folder two workers wrote,
    it scores again the samples the ledger lists, in place, and the rows become one run's."""
    raise_file = tmp_path / "raise"
    raise_file.write_text("s0_00004 s3_00002\n")  # score_batch raises on them while the file lists them
    args = workerkit.worker_args(shards, str(tmp_path / "out"), "--join")
    args[args.index(workerkit.SCORER)] = "faultkit:FlakyScorer"
    args += ["--scorer-opt", f"bright.raise_file={raise_file}"]
    workers = workerkit.run_all([args, args], _env(), str(tmp_path / "logs"))
    assert [w.proc.exitcode for w in workers] == [0, 0], [w.output() for w in workers]
    r = CliRunner().invoke(main, [*args, "--retry-failed"])
    assert r.exit_code == 2 and "--join and --retry-failed exclude each other" in r.output, r.output
    raise_file.write_text("")
    args.remove("--join")
    r = CliRunner().invoke(main, [*args, "--retry-failed"], catch_exceptions=False)
    assert r.exit_code == 0 and "retried 2 failed sample(s): 2 now scored" in r.output, r.output
    assert workerkit._folder_violations(reference, NAMES, workerkit.LocalFolder(str(tmp_path / "out"))) == []
