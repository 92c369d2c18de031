"""Third code review's findings (the report/runfolder/remote rework): each test fails without its fix."""
import pytest

pytest.importorskip("fsspec")
pytest.importorskip("aiohttp")


@pytest.mark.parametrize("status", [403, 404, 500])
def test_a_failed_read_of_a_presigned_url_never_shows_its_signature(web, status):
    """aiohttp's error text holds the URL it asked for, query and all: the shard's error and each
    retry's line show it redacted (remote._strip), as the shard's own name is."""
    from wdsfilter.remote import RemoteOptions, open_remote
    path = "a.tar?X-Amz-Signature=SeCrEt99&X-Amz-Credential=AKIDx"
    url = web.put(path, b"x" * 4096)
    web.fail(path, *[("status", status, None)] * 4)
    retries = []
    with pytest.raises(OSError) as e:
        open_remote(url, RemoteOptions(attempts=2, backoff_seconds=0.01), on_retry=retries.append).read()
    text = str(e.value) + "".join(retries)
    assert str(status) in text and "a.tar?<hidden>" in text, text
    assert "SeCrEt99" not in text and "AKIDx" not in text, text


@pytest.mark.parametrize("ends", [[float("inf")], [float("-inf")], [float("inf"), float("-inf")]])
def test_the_streaming_share_of_a_column_with_an_infinity_takes_a_few_passes(monkeypatch, ends):
    """A Parquet score column may hold an infinity: the streaming --top/--bottom (runs beyond
    IN_MEMORY_ROWS) found the same value, but an infinite end of the range put every value in one
    bin, and each pass peeled off a single value: a pass over the whole run per distinct score."""
    import numpy as np

    from wdsfilter.runfolder import quantile
    monkeypatch.setattr(quantile, "COLLECT", 100)  # the streaming path on 20k values instead of millions
    values = np.concatenate([np.random.default_rng(0).normal(size=20000), ends])
    for top, percent in ((True, 30), (False, 30), (True, 0.001), (False, 100)):
        passes = []

        def source():
            passes.append(1)
            return iter([values[:7000], values[7000:]])
        value, k = (quantile.top_share_value if top else quantile.bottom_share_value)(source, percent)
        assert (value, k) == quantile.share_value(values.copy(), percent, top)
        assert len(passes) < 30, len(passes)


def _unreadable_presigned(web, tmp_path) -> str:
    """A presigned URL of a real shard that the server refuses (403, not retried)."""
    from scorekit import make_shards
    shards, _ = make_shards(str(tmp_path / "src"), [4])
    path = "a.tar?X-Amz-Signature=SeCrEt99"
    url = web.put(path, open(shards[0], "rb").read())
    web.fail(path, *[("status", 403, None)] * 20)
    return url


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


@pytest.mark.parametrize("option", ["--top", "--min"])
def test_score_refuses_a_threshold_on_a_column_that_holds_no_numbers_before_scoring(tmp_path, option):
    """score --top sha256=30% (the hash scorer's sha256 is declared a string): refused at once, as
    `wdsfilter filter` refuses it; it was found only when the run ended, after every shard was
    scored (the share resolved by filter's rule), with exit 2 and no thresholds.json."""
    import os

    from click.testing import CliRunner
    from scorekit import make_shards

    from wdsfilter.cli import main
    shards, _ = make_shards(str(tmp_path / "src"), [4])
    value = "sha256=30%" if option == "--top" else "sha256=0.5"
    r = CliRunner().invoke(main, ["score", shards[0], "--scorer", "hash", "--out", str(tmp_path / "run"), option,
                                  value, "--device", "cpu", "--workers", "0", "--no-progress"])
    assert r.exit_code == 2 and "sha256" in r.output and "not hold numbers" in r.output, r.output
    assert not os.path.exists(tmp_path / "run" / "done") or not os.listdir(tmp_path / "run" / "done")


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
