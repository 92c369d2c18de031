"""Exit codes and cleanup on failures met half-way through a run (review of the remote writers and
the resharder): a store that fails while a shard is read is the run's failure (exit 3, 'run
again'), not a configuration error (2); a failed reshard leaves no temporary or open file."""
import os

import pytest
from click.testing import CliRunner

pytest.importorskip("fsspec")
pytest.importorskip("aiohttp")

from shardkit import image_bytes, write_shard  # noqa: E402
from wdsfilter.cli import main  # noqa: E402


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
    from wdsfilter.filtering.rename import ReshardError
    from wdsfilter.filtering.reshard import Resharder, Source
    a = write_shard(str(tmp_path / "a.tar"), image_text_members(3))
    b = write_shard(str(tmp_path / "b.tar"), image_text_members(2, start=3))
    out = tmp_path / "out"
    writer = Resharder(str(out), per_shard=10)
    writer.prepare({"run": 1}, overwrite=False, kept=6)
    sources = [Source(a, ["000000", "000001", "000002"]), Source(b, ["000003", "000004", "000009"])]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        with pytest.raises(ReshardError, match="000009") as failed:
            writer.write(sources)
        # the traceback (which holds the writer's frame) is alive: nothing may wait for it to go
        assert sorted(os.listdir(out)) == ["filter_run.json"]
        del failed
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)]


@pytest.mark.parametrize("unique_keys", [False, True])
def test_a_source_cut_inside_a_kept_member_is_named_with_its_sample(tmp_path, unique_keys):
    """A source shard that ends inside a member the score file keeps (a cut copy, a shard rewritten
    since; no marker to compare with) stops the reshard with one line naming the shard, the sample
    and what to do, as stored or renamed (--unique-keys)."""
    from shardkit import image_text_members
    from wdsfilter.filtering.rename import ReshardError
    from wdsfilter.filtering.reshard import Resharder, Source
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


def test_reshard_errors_never_show_a_source_urls_password_or_query(web, tmp_path):
    """A source URL's user:password@ and query string (a presigned signature) stay out of the
    reshard's error lines, as out of every other message (remote.redact_url)."""
    from shardkit import image_text_members
    from wdsfilter.filtering.rename import ReshardError
    from wdsfilter.filtering.reshard import Resharder, Source
    path = write_shard(str(tmp_path / "a.tar"), image_text_members(2))
    # (the test server keeps the object under its path and query)
    url = web.put("a.tar?sig=t0ken", open(path, "rb").read()).replace("http://", "http://reader:s3cret@")
    writer = Resharder(str(tmp_path / "out"), per_shard=10, allow_remote=True)
    writer.prepare({"run": 1}, overwrite=False, kept=3)
    with pytest.raises(ReshardError) as failed:
        writer.write([Source(url, ["000000", "000001", "000007"])])
    message = str(failed.value)
    assert "000007" in message and "a.tar" in message
    assert "s3cret" not in message and "t0ken" not in message
    # and the written shards' _stats.json (published with them) name the source the same way
    writer.write([Source(url, ["000000", "000001"])])
    written = "".join(open(os.path.join(tmp_path, "out", f), errors="replace").read() for f in os.listdir(tmp_path / "out"))
    assert "a.tar" in written and "s3cret" not in written and "t0ken" not in written


def test_sort_shard_errors_never_show_the_urls_password_or_query(web, tmp_path):
    path = _scattered(tmp_path / "scattered.tar")
    other = open(_scattered(tmp_path / "other.tar", "other"), "rb").read()
    url = web.put("s.tar?sig=t0ken", open(path, "rb").read()).replace("http://", "http://reader:s3cret@")
    web.fail("s.tar?sig=t0ken", ("short", 2048), ("replace", other))
    result = CliRunner().invoke(main, ["sort-shard", url, str(tmp_path / "sorted.tar")])
    assert result.exit_code == 3 and "s.tar" in result.output, result.output
    assert "s3cret" not in result.output and "t0ken" not in result.output


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


def test_unique_keys_renames_samples_whose_text_is_not_valid_unicode(tmp_path):
    """--unique-keys adds source_key/source_shard to each .json. A caption cut inside a surrogate
    pair (a lone "\\ud83d" escape: scraped captions have them) and a key that is not UTF-8 (a
    latin-1 file name) are written as JSON escapes, not a UnicodeEncodeError that stops the run."""
    import json
    import tarfile

    from shardkit import image_bytes
    from wdsfilter.filtering.reshard import Resharder, Source
    members = [("000000.jpg", image_bytes()), ("000000.json", b'{"caption": "cut \\ud83d", "uid": "u0"}'),
               ("caf\udce9.jpg", image_bytes())]  # the byte 0xe9: no .json of its own
    path = write_shard(str(tmp_path / "odd.tar"), members)
    out = tmp_path / "out"
    writer = Resharder(str(out), per_shard=10, unique_keys=True)
    writer.prepare({"run": 1}, overwrite=False, kept=2)
    writer.write([Source(path, ["000000", "caf\\xe9"])])  # the key as the readers name it
    with tarfile.open(out / "shard-000000.tar") as tar:
        metas = {m.name: json.loads(tar.extractfile(m).read()) for m in tar.getmembers() if m.name.endswith(".json")}
    assert metas["000000000.json"] == {"caption": "cut \ud83d", "uid": "u0", "source_key": "000000",
                                       "source_shard": path}
    assert metas["000000001.json"] == {"source_key": "caf\\xe9", "source_shard": path}


def test_score_keeps_a_sample_whose_json_text_is_not_valid_unicode(tmp_path):
    """The score file's caption, url and uid columns (rows.sample_text): a .json whose url or
    caption holds a lone surrogate escape (a caption cut inside an emoji's pair) is written with
    U+FFFD in its place, as the caption is (specs.no_lone_surrogates), not a UnicodeEncodeError
    that fails the run."""
    import json

    from shardkit import image_bytes
    members = [("a.jpg", image_bytes()), ("a.txt", "fine"),
               ("b.jpg", image_bytes()), ("b.txt", "also fine"),
               ("b.json", b'{"url": "http://x/cut-\\ud83d", "uid": "u\\udce9"}')]
    shard = write_shard(str(tmp_path / "odd-0000.tar"), members)
    out = str(tmp_path / "scores")
    r = CliRunner().invoke(main, ["score", shard, "--scorer", "scorekit:BrightnessScorer", "--out", out,
                                  "--device", "cpu", "--workers", "0", "--no-progress", "--format", "jsonl"])
    assert r.exit_code == 0, r.output
    rows = {row["key"]: row for row in map(json.loads, open(os.path.join(out, "scores", "odd-0000.jsonl")))}
    assert rows["b"]["status"] == "scored" and rows["b"]["url"] == "http://x/cut-\ufffd"
    assert rows["b"]["uid"] == "u\ufffd" and rows["a"]["url"] is None


def test_a_bucket_gets_sizes_json_and_stats_only_after_the_shards_they_count(tmp_path):
    """An output folder mirrored to a bucket (filter/score --write-shards s3://...): in each round
    the shards go up before the `_stats.json` and `sizes.json` that count them, whatever their
    names sort as ('train-...' after 'sizes.json'); an upload that fails leaves no sizes.json
    naming a shard the bucket lacks."""
    pytest.importorskip("moto")
    pytest.importorskip("s3fs")
    from remotekit import BUCKET, FailingProxy, s3_server
    from wdsfilter.remote import RemoteOutputError
    from wdsfilter.remote_out import RemoteFolder
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
    from wdsfilter.errors import ConfigError
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    with s3_server() as (endpoint, client):
        client.put_object(Bucket=BUCKET, Key="runs/d/run.json", Body=b"{}")
        options = {"config_kwargs": {"retries": {"max_attempts": 1}}}
        with FailingProxy(endpoint, ".lock.json") as proxy:
            with pytest.raises(ConfigError, match="unknown dedup kind"):
                dedup(f"s3://{BUCKET}/runs/d", kinds=["nearish"], storage_options=dict(options, endpoint_url=proxy.url))
            assert proxy.failed == 0  # no lock object was asked for


def test_filter_outputs_never_hold_a_source_urls_password_or_query(web, tmp_path):
    """filter --write-shards from a score run whose sources are URLs with user:password@: nothing
    in OUT (the shards' _stats.json, filter_run.json, the card) holds it."""
    from scorekit import make_shards
    [path], _ = make_shards(str(tmp_path / "src"), [5])
    url = web.put("shard-0000.tar", open(path, "rb").read()).replace("http://", "http://reader:s3cret@")
    run = str(tmp_path / "run")
    r = CliRunner().invoke(main, ["score", url, "--scorer", "scorekit:BrightnessScorer", "--out", run, "--device",
                                  "cpu", "--workers", "0", "--no-progress", "--format", "jsonl"])
    assert r.exit_code == 0, r.output
    out = tmp_path / "kept"
    r = CliRunner().invoke(main, ["filter", run, "--write-shards", str(out), "--allow-remote", "--no-report"])
    assert r.exit_code == 0 and "s3cret" not in r.output, r.output
    names = os.listdir(out)
    assert "filter_run.json" in names and any(n.endswith("_stats.json") for n in names)
    for name in names:
        data = open(out / name, "rb").read()
        assert b"s3cret" not in data, name
