"""Second code review's findings: signed URLs as shards, no source URL secrets in published
outputs, bounded memory when copying kept members, and what a run counts as its own files."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("fsspec")
pytest.importorskip("aiohttp")


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


def _written(folder) -> str:
    texts = []
    for root, _, files in os.walk(folder):
        texts += [open(os.path.join(root, f), errors="replace").read() for f in files if not f.endswith(".tar")]
    return "".join(texts)


def test_score_write_shards_stats_never_hold_a_source_urls_password(web, tmp_path):
    """score --write-shards: each filtered shard's _stats.json (published with the shards) names
    its source without the URL's user:password@ (remote.redact_url, as filter does)."""
    from scorekit import make_shards
    shards, _ = make_shards(str(tmp_path / "src"), [4])
    url = web.put("a.tar", open(shards[0], "rb").read()).replace("http://", "http://reader:s3cret@")
    result = _score(url, tmp_path / "run", "--write-shards", str(tmp_path / "kept"))
    assert result.exit_code == 0, result.output
    stats = [os.path.join(r, f) for r, _, fs in os.walk(tmp_path / "kept") for f in fs if f.endswith("_stats.json")]
    assert stats and all("a.tar" in open(p).read() for p in stats)
    assert "s3cret" not in "".join(open(p).read() for p in stats)


def test_a_presigned_web_url_is_one_shard_and_its_signature_is_never_shown(web, tmp_path):
    """A presigned https URL (a `?` query holding the signature) names one shard: validate and
    score read it instead of refusing it as a glob of a web server; its query stays out of their
    messages and of the files published beside the shards (stats, sizes.json, filtered shards)."""
    from scorekit import make_shards
    from click.testing import CliRunner
    from wdsfilter.cli import main
    shards, _ = make_shards(str(tmp_path / "src"), [4])
    # (the test server keeps the object under its path and query; `*` and `?` in it are no glob)
    url = web.put("a.tar?X-Amz-Signature=SeCrEt99*&X-Amz-Date=2?", open(shards[0], "rb").read())
    checked = CliRunner().invoke(main, ["validate", url, "--stats-dir", str(tmp_path / "stats")])
    assert checked.exit_code == 0 and "4 samples" in checked.output, checked.output
    assert "SeCrEt99" not in checked.output
    assert json.load(open(tmp_path / "stats" / "sizes.json")) == {"a.tar": 4}
    assert "a.tar" in _written(tmp_path / "stats") and "SeCrEt99" not in _written(tmp_path / "stats")
    scored = _score(url, tmp_path / "run", "--write-shards", str(tmp_path / "kept"))
    assert scored.exit_code == 0 and "scored 4 of 4 samples" in scored.output, scored.output
    assert "SeCrEt99" not in scored.output
    assert os.path.exists(tmp_path / "run" / "scores" / "a.jsonl") and os.path.exists(tmp_path / "kept" / "a.tar")
    assert "SeCrEt99" not in _written(tmp_path / "kept")
    assert "SeCrEt99" not in open(tmp_path / "run" / "report.html").read()  # the cards name the shard


def test_a_users_report_html_in_out_is_not_filters_when_the_report_goes_elsewhere(tmp_path):
    """filter --write-shards OUT counts OUT/report.html as a file of its own only when its report
    goes there: with --report elsewhere (or --no-report), a report.html of the user's in OUT is
    neither refused nor removed by --overwrite."""
    from filterkit import gnu_tar_shards, run_cli, score_folder
    out = score_folder(gnu_tar_shards(str(tmp_path), [6]), tmp_path / "scores")
    dest = tmp_path / "k"
    dest.mkdir()
    (dest / "report.html").write_bytes(b"the user's own page")
    for extra in (["--report", str(tmp_path / "elsewhere.html")], ["--no-report"],
                  ["--no-report", "--samples-per-shard", "4", "--overwrite"]):
        r = run_cli("filter", out, "--write-shards", str(dest), *extra)
        assert r.returncode == 0, r.stderr
        assert (dest / "report.html").read_bytes() == b"the user's own page"
        assert "report.html" not in json.load(open(dest / "filter_run.json"))["files"]
    assert os.path.exists(tmp_path / "elsewhere.html") and os.path.exists(dest / "shard-000001.tar")
    # the report in OUT is ours: the user's file of that name is refused, never replaced
    r = run_cli("filter", out, "--write-shards", str(dest), "--samples-per-shard", "4")
    assert r.returncode == 2 and "report.html" in r.stderr and "did not write" in r.stderr, r.stderr
    assert (dest / "report.html").read_bytes() == b"the user's own page"


def _big_member_shard(path, big: int, last: int):
    """A shard whose sample b holds a `big`-byte .bin member, followed by sample c whose .bin
    (the shard's last member) holds `last` bytes; written a chunk at a time."""
    import io
    import tarfile

    class Zeros(io.RawIOBase):
        def __init__(self, n):
            self.left = n

        def readinto(self, b):
            n = min(len(b), self.left)
            b[:n] = bytes(n)
            self.left -= n
            return n

    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for key, size in (("a", 10), ("b", big), ("c", last)):
            for ext, n in (("txt", 5), ("bin", size)):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = n
                tar.addfile(info, Zeros(n))
    return path


def test_a_kept_member_is_copied_in_chunks_whatever_its_size(tmp_path):
    """score --write-shards (shardcopy.write_filtered) copies a kept member a chunk at a time:
    a 64 MB member kept (and a 16 MB last one) take a few MB of memory, not their size; the copy
    is byte for byte, and a last member cut short is left out whole, never half-copied."""
    import tarfile
    import tracemalloc
    from wdsfilter.shardcopy import write_filtered
    src = _big_member_shard(str(tmp_path / "big.tar"), 64 << 20, 16 << 20)
    tracemalloc.start()
    try:
        counts = write_filtered(src, ["b", "c"], str(tmp_path / "kept.tar"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert counts["samples"] == 2 and counts["members"] == 4
    assert peak < 12 << 20, peak
    with tarfile.open(tmp_path / "kept.tar") as tar:
        assert [(m.name, m.size) for m in tar] == [("b.txt", 5), ("b.bin", 64 << 20), ("c.txt", 5), ("c.bin", 16 << 20)]
    # the shard cut inside its last member: that member is left out, no byte of it written
    with open(src, "r+b") as f:
        f.truncate(os.path.getsize(src) - (8 << 20))
    counts = write_filtered(src, ["b"], str(tmp_path / "cut.tar"))
    assert counts["samples"] == 1
    with tarfile.open(tmp_path / "cut.tar") as tar:
        assert [m.name for m in tar] == ["b.txt", "b.bin"]


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
