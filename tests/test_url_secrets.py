"""A shard URL's secrets (a user:password@, a presigned signature in its query) are never shown: not
in a message, an error line, a report, a stats file, a score file or a written shard (remote.redact_url,
shards.shown_url, publish.published)."""
import json
import os

import pytest
from click.testing import CliRunner

pytest.importorskip("fsspec")
pytest.importorskip("aiohttp")

from shardkit import image_bytes, write_shard  # noqa: E402
from wdsfilter.cli import main  # noqa: E402


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


def _scattered(path, text="caption"):
    keys = [f"k{i:03d}" for i in range(6)]
    members = [(f"{k}.txt", f"{text} {k}") for k in keys] + [(f"{k}.jpg", image_bytes()) for k in keys]
    return write_shard(str(path), members)


def _unreadable_presigned(web, tmp_path) -> str:
    """A presigned URL of a real shard that the server refuses (403, not retried)."""
    from scorekit import make_shards
    shards, _ = make_shards(str(tmp_path / "src"), [4])
    path = "a.tar?X-Amz-Signature=SeCrEt99"
    url = web.put(path, open(shards[0], "rb").read())
    web.fail(path, *[("status", 403, None)] * 20)
    return url


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


@pytest.mark.parametrize("status", [403, 404, 500])
def test_a_failed_read_of_a_presigned_url_never_shows_its_signature(web, status):
    """aiohttp's error text holds the URL it asked for, query and all: the shard's error and each
    retry's line show it redacted (remote_errors.strip_text), as the shard's own name is."""
    from wdsfilter.storage.remote import RemoteOptions
    from wdsfilter.storage.remote_read import open_remote
    path = "a.tar?X-Amz-Signature=SeCrEt99&X-Amz-Credential=AKIDx"
    url = web.put(path, b"x" * 4096)
    web.fail(path, *[("status", status, None)] * 4)
    retries = []
    with pytest.raises(OSError) as e:
        open_remote(url, RemoteOptions(attempts=2, backoff_seconds=0.01), on_retry=retries.append).read()
    text = str(e.value) + "".join(retries)
    assert str(status) in text and "a.tar?<hidden>" in text, text
    assert "SeCrEt99" not in text and "AKIDx" not in text, text


def test_validate_names_a_refused_presigned_shard_without_its_signature(web, tmp_path):
    """validate's Details line names the shard of each finding: shown as the shard table shows it
    (shards.shown_url), never with its query."""
    from click.testing import CliRunner

    from wdsfilter.cli import main
    r = CliRunner().invoke(main, ["validate", _unreadable_presigned(web, tmp_path)])
    assert r.exit_code == 1 and "remote_read_failed" in r.output and "403" in r.output, r.output
    assert "SeCrEt99" not in r.output, r.output


def test_score_names_a_refused_presigned_shard_without_its_signature(web, tmp_path):
    """score's lines for a shard that failed (the summary's FAILED line, the nothing-scored error)
    show its URL redacted."""
    from click.testing import CliRunner

    from wdsfilter.cli import main
    r = CliRunner().invoke(main, ["score", _unreadable_presigned(web, tmp_path), "--scorer",
                                  "scorekit:BrightnessScorer", "--out", str(tmp_path / "run"), "--device", "cpu",
                                  "--workers", "0", "--no-progress", "--format", "jsonl"])
    text = r.output + str(r.exception or "")
    assert r.exit_code == 3 and "403" in text and "a.tar?<hidden>" in text, text
    assert "SeCrEt99" not in text, text


def test_a_password_holding_an_at_sign_never_shows_in_validates_lines(web, tmp_path):
    """The userinfo of a URL ends at the last "@" before the host: with user:p@ss@host, "ss@" is
    password too (redact_url cut at the first "@" and showed the rest)."""
    from click.testing import CliRunner

    from wdsfilter.cli import main
    url = _unreadable_presigned(web, tmp_path).replace("://", "://reader:Pa@SeCrEt77@", 1)
    r = CliRunner().invoke(main, ["validate", url])
    assert r.exit_code == 1 and "remote_read_failed" in r.output, r.output
    assert "SeCrEt77" not in r.output and "<hidden>@" in r.output, r.output


@pytest.mark.parametrize("fmt", ["json", "junit"])
def test_validates_json_and_junit_reports_hold_no_presigned_signature(web, tmp_path, fmt):
    """The reports CI publishes name each shard as the text report does (shards.shown_url)."""
    from click.testing import CliRunner

    from wdsfilter.cli import main
    out = tmp_path / f"report.{fmt}"
    r = CliRunner().invoke(main, ["validate", _unreadable_presigned(web, tmp_path), "--format", fmt, "--output", str(out)])
    import html
    text = html.unescape(out.read_text())  # JUnit is XML: <hidden> is written &lt;hidden&gt;
    assert r.exit_code == 1 and "remote_read_failed" in text and "a.tar?<hidden>" in text, text
    assert "SeCrEt99" not in text and "SeCrEt99" not in r.output


def test_reshard_errors_never_show_a_source_urls_password_or_query(web, tmp_path):
    """A source URL's user:password@ and query string (a presigned signature) stay out of the
    reshard's error lines, as out of every other message (remote.redact_url)."""
    from shardkit import image_text_members
    from wdsfilter.runfolder.rename import ReshardError
    from wdsfilter.runfolder.reshard import Resharder, Source
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
