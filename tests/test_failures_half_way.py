"""Failures met half-way through a run: a store that fails while a shard is read is the run's
failure (exit 3, 'run again'), not a configuration error (2); a failed reshard leaves no temporary
or open file and names the shard and sample; an interrupted or repeated filter of a bucket's run
resumes; a bucket never holds a sizes.json naming a shard it lacks."""
import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

pytest.importorskip("fsspec")
pytest.importorskip("aiohttp")

from shardkit import image_bytes, write_shard  # noqa: E402
from wdsfilter.cli import main  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _scattered(path, text="caption"):
    keys = [f"k{i:03d}" for i in range(6)]
    members = [(f"{k}.txt", f"{text} {k}") for k in keys] + [(f"{k}.jpg", image_bytes()) for k in keys]
    return write_shard(str(path), members)


def test_sort_shard_of_a_remote_shard_that_changes_while_read_exits_3(web, tmp_path):
    path = _scattered(tmp_path / "scattered.tar")
    data = open(path, "rb").read()
    url = web.put("scattered.tar", data)
    # The first read breaks off; its resumed GET finds the object replaced (412 on its If-Match).
    other = open(_scattered(tmp_path / "other.tar", "other"), "rb").read()
    web.fail("scattered.tar", ("short", 2048), ("replace", other))
    result = CliRunner().invoke(main, ["sort-shard", url, str(tmp_path / "sorted.tar")])
    assert result.exit_code == 3, result.output
    assert "scattered.tar" in result.output
    assert not os.path.exists(tmp_path / "sorted.tar")


def test_a_reshard_that_fails_half_way_closes_and_removes_its_open_shard(tmp_path):
    """A source that lost a kept key stops the reshard (ReshardError) while the shard the earlier
    source's samples went to is still open: it is closed and its temporary removed at once, not
    left open until the interpreter collects it."""
    import gc
    import warnings

    from shardkit import image_text_members
    from wdsfilter.runfolder.rename import ReshardError
    from wdsfilter.runfolder.reshard import Resharder, Source
    a = write_shard(str(tmp_path / "a.tar"), image_text_members(3))
    b = write_shard(str(tmp_path / "b.tar"), image_text_members(2, start=3))
    out = tmp_path / "out"
    writer = Resharder(str(out), per_shard=10)
    writer.prepare({"run": 1}, overwrite=False, kept=6)
    sources = [Source(a, ["000000", "000001", "000002"]), Source(b, ["000003", "000004", "000009"])]
    gc.collect()  # what earlier tests left unclosed (sockets, pools) warns now, not in the window below
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        with pytest.raises(ReshardError, match="000009") as failed:
            writer.write(sources)
        # the traceback (which holds the writer's frame) is alive: nothing may wait for it to go
        assert sorted(os.listdir(out)) == ["filter_run.json"]
        del failed
        gc.collect()
    # only what this reshard opened counts: a file under tmp_path (a collected leftover of another
    # test names its own socket or file)
    assert not [str(w.message) for w in caught
                if issubclass(w.category, ResourceWarning) and str(tmp_path) in str(w.message)]


@pytest.mark.parametrize("unique_keys", [False, True])
def test_a_source_cut_inside_a_kept_member_is_named_with_its_sample(tmp_path, unique_keys):
    """A source shard that ends inside a member the score file keeps (a cut copy, a shard rewritten
    since; no marker to compare with) stops the reshard with one line naming the shard, the sample
    and what to do, as stored or renamed (--unique-keys)."""
    from shardkit import image_text_members
    from wdsfilter.runfolder.rename import ReshardError
    from wdsfilter.runfolder.reshard import Resharder, Source
    path = write_shard(str(tmp_path / "cut.tar"), image_text_members(3))
    import tarfile
    with tarfile.open(path) as tar:
        last = tar.getmembers()[-1]  # 000002.txt: its header kept, its data cut short
    with open(path, "r+b") as f:
        f.truncate(last.offset_data + 5)
    writer = Resharder(str(tmp_path / "out"), per_shard=10, unique_keys=unique_keys)
    writer.prepare({"run": 1}, overwrite=False, kept=3)
    with pytest.raises(ReshardError) as failed:
        writer.write([Source(path, ["000000", "000001", "000002"])])
    message = str(failed.value)
    assert "\n" not in message and path in message and "000002" in message and "score it again" in message and "ends inside a member" in message



def test_filter_from_a_bucket_resumes_its_shards_from_any_working_folder(tmp_path, monkeypatch):
    """filter's record of what the shards were made from names a score folder in a bucket by its
    URL: the same command run from another working folder resumes (the shards are whole) instead
    of refusing them as 'filtered with other settings' (os.path.abspath('s3://...') depends on
    the working folder)."""
    pytest.importorskip("moto")
    pytest.importorskip("s3fs")
    from remotekit import BUCKET, s3_server
    from scorekit import make_shards
    monkeypatch.setenv("WDSFILTER_CACHE", str(tmp_path / "cache"))
    shards, _ = make_shards(str(tmp_path / "src"), [6])
    with s3_server():
        run = f"s3://{BUCKET}/runs/cwd"
        r = CliRunner().invoke(main, ["score", shards[0], "--scorer", "scorekit:BrightnessScorer", "--out", run,
                                      "--device", "cpu", "--workers", "0", "--no-progress", "--format", "jsonl"])
        assert r.exit_code == 0, r.output
        out = str(tmp_path / "kept")
        for cwd in ("a", "b"):
            os.makedirs(tmp_path / cwd)
            monkeypatch.chdir(tmp_path / cwd)
            r = CliRunner().invoke(main, ["filter", run, "--min", "brightness=0.3", "--write-shards", out,
                                          "--no-report"])
            assert r.exit_code == 0, r.output
        assert "already whole" in r.output



def test_a_bucket_gets_sizes_json_and_stats_only_after_the_shards_they_count(tmp_path):
    """An output folder mirrored to a bucket (filter/score --write-shards s3://...): in each round
    the shards go up before the `_stats.json` and `sizes.json` that count them, whatever their
    names sort as ('train-...' after 'sizes.json'); an upload that fails leaves no sizes.json
    naming a shard the bucket lacks."""
    pytest.importorskip("moto")
    pytest.importorskip("s3fs")
    from remotekit import BUCKET, FailingProxy, s3_server
    from wdsfilter.storage.remote import RemoteOutputError
    from wdsfilter.runfolder.remote_out import RemoteFolder
    staging = tmp_path / "staging"
    os.makedirs(staging)
    (staging / "train-000000.tar").write_bytes(b"\0" * 10240)
    (staging / "train-000000_stats.json").write_text('{"successes": 1}')
    (staging / "sizes.json").write_text('{"train-000000.tar": 1}')
    with s3_server() as (endpoint, client):
        options = {"config_kwargs": {"retries": {"max_attempts": 1}}}
        with FailingProxy(endpoint, "train-000000.tar") as proxy:
            folder = RemoteFolder(f"s3://{BUCKET}/kept", dict(options, endpoint_url=proxy.url), str(staging))
            with pytest.raises(RemoteOutputError, match="train-000000.tar"):
                folder.sync()
        listed = client.list_objects_v2(Bucket=BUCKET, Prefix="kept/").get("Contents", [])
        assert [o["Key"] for o in listed] == []


def test_dedup_of_a_bucket_folder_rejects_its_options_before_taking_the_folder(tmp_path, monkeypatch):
    """A configuration error answers at once (exit 2) for a RUN_DIR in a bucket too: an unknown kind
    is named before the lock object is written and the folder pulled (a store that refuses the
    lock would otherwise be the error the user sees)."""
    pytest.importorskip("moto")
    pytest.importorskip("s3fs")
    from remotekit import BUCKET, FailingProxy, s3_server
    from wdsfilter.dedup import dedup
    from wdsfilter.core.errors import ConfigError
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    with s3_server() as (endpoint, client):
        client.put_object(Bucket=BUCKET, Key="runs/d/run.json", Body=b"{}")
        options = {"config_kwargs": {"retries": {"max_attempts": 1}}}
        with FailingProxy(endpoint, ".lock.json") as proxy:
            with pytest.raises(ConfigError, match="unknown dedup kind"):
                dedup(f"s3://{BUCKET}/runs/d", kinds=["nearish"], storage_options=dict(options, endpoint_url=proxy.url))
            assert proxy.failed == 0  # no lock object was asked for


def _python(code: str) -> str:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.path.join(ROOT, "tests"))
    return subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, env=env,
                          timeout=120).stdout


def test_ctrl_c_asks_only_the_stopped_command_whether_it_resumes():
    """On Ctrl-C the CLI asks whether the stopped command has --resume: by its name only, without
    importing every other command's module (the scoring engine) on the way out."""
    out = _python("import sys, json; from wdsfilter.cli import _resumable; "
                  "r = [_resumable('validate'), _resumable('nope'), _resumable(None)]; "
                  "print(json.dumps([r, sorted(m for m in sys.modules if m.endswith('.cli'))]))")
    answers, loaded = json.loads(out)
    assert answers == [False, False, False]
    assert "wdsfilter.validate.cli" in loaded
    assert not {"wdsfilter.score.cli", "wdsfilter.filtering.cli", "wdsfilter.dedup.cli"} & set(loaded), loaded


def _score(url, out, *extra):
    from click.testing import CliRunner
    from wdsfilter.cli import main
    return CliRunner().invoke(main, ["score", url, "--scorer", "scorekit:BrightnessScorer", "--out", str(out),
                                     "--device", "cpu", "--workers", "0", "--no-progress", "--format", "jsonl", *extra])


def test_filter_from_a_bucket_resumes_its_shards_with_a_fresh_cache(tmp_path, monkeypatch):
    """filter_run.json records each score file by its content (size, sha256), not its local copy's
    time: `filter --write-shards` of a bucket's score folder, run again with a fresh cache (another
    machine), resumes (the shards are whole) instead of refusing them as 'filtered with other
    settings'."""
    pytest.importorskip("moto")
    pytest.importorskip("s3fs")
    from click.testing import CliRunner
    from remotekit import BUCKET, s3_server
    from scorekit import make_shards
    from wdsfilter.cli import main
    shards, _ = make_shards(str(tmp_path / "src"), [6])
    with s3_server():
        run = f"s3://{BUCKET}/runs/fresh"
        monkeypatch.setenv("WDSFILTER_CACHE", str(tmp_path / "cache0"))
        assert _score(shards[0], run).exit_code == 0
        out = str(tmp_path / "kept")
        for cache in ("cache1", "cache2"):
            monkeypatch.setenv("WDSFILTER_CACHE", str(tmp_path / cache))
            r = CliRunner().invoke(main, ["filter", run, "--min", "brightness=0.3", "--write-shards", out,
                                          "--no-report"])
            assert r.exit_code == 0, r.output
        assert "already whole" in r.output
    assert "mtime" not in open(os.path.join(out, "filter_run.json")).read()
