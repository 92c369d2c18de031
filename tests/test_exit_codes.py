"""Exit codes of every command (0 clean, 1 findings, 2 usage/configuration, 3 run failed), one line
per error with the traceback only under --debug; outputs checked before any work; every output
format writes member names that are not UTF-8 and never leaves a partial file; a failing pipe:
command is a finding of its shard, never a crash."""
import json
import os
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET

import pytest
from click.testing import CliRunner

from tests.shardkit import image_bytes, image_text_members, write_shard
from wdsfilter.cli import main
from wdsfilter.core.errors import ConfigError, OutputError, RunError, StarvationError, exit_code_for
from wdsfilter.validate import validate


def run(*args):
    return CliRunner(mix_stderr=False).invoke(main, list(args)) if "mix_stderr" in CliRunner.__init__.__code__.co_varnames \
        else CliRunner().invoke(main, list(args))


@pytest.fixture()
def clean(tmp_path):
    return write_shard(tmp_path / "clean-000000.tar", image_text_members(3))


def test_error_classes_map_to_exit_codes():
    assert exit_code_for(ConfigError("x")) == 2 and exit_code_for(OutputError("x")) == 2
    assert exit_code_for(RunError("x")) == 3 and exit_code_for(StarvationError("x")) == 3
    assert exit_code_for(OSError("disk")) == 3 and exit_code_for(ZeroDivisionError()) == 3
    assert exit_code_for(KeyboardInterrupt()) == 130


def test_help_documents_exit_codes():
    """The group's --help names every code; each command's names only its own
    (tests/test_cli_help.py::test_each_epilog_lists_exactly_the_codes_the_command_returns)."""
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert "0 clean, 1 findings, 2 usage or configuration error, 3 the run failed" in text


def test_unwritable_outputs_are_usage_errors_before_any_work(tmp_path, clean, monkeypatch):
    import wdsfilter.validate as v

    def boom(*a, **k):  # no shard may be read before the outputs are known to be writable
        raise AssertionError("shards were read")
    monkeypatch.setattr(v, "validate_urls", boom)
    afile = tmp_path / "afile"
    afile.write_text("x")
    for args, words in [(["--output", str(tmp_path)], "Invalid value for '--output'"),
                        (["--output", str(afile / "r.json")], "is a file, not a folder"),
                        (["--stats-dir", str(afile)], "--stats-dir"),
                        (["--stats-dir", str(afile / "sub")], "is a file, not a folder")]:
        result = CliRunner().invoke(main, ["validate", clean, "-j", "1", *args])
        assert result.exit_code == 2 and words in result.output, (args, result.output)
        assert "Traceback" not in result.output


def test_internal_error_one_line_exit_3_traceback_only_with_debug(clean, monkeypatch):
    import wdsfilter.validate.shard_check as sc

    def broken(self, sample):
        raise ZeroDivisionError("a bug")
    monkeypatch.setattr(sc._ShardCheck, "_sample", broken)
    result = CliRunner().invoke(main, ["validate", clean, "-j", "1"])
    assert result.exit_code == 3
    assert "wdsfilter validate: error: internal error: ZeroDivisionError: a bug" in result.output
    assert "Traceback" not in result.output
    for args in (["--debug", "validate", clean, "-j", "1"], ["validate", clean, "-j", "1", "--debug"]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 3 and "Traceback" in result.output and "ZeroDivisionError" in result.output


def test_io_error_writing_the_report_is_a_run_failure(clean, tmp_path, monkeypatch):
    import wdsfilter.validate.formats as report_writer  # validate's report goes out through its writing.write_text_atomic

    def full(path, text, storage_options=None):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(report_writer, "write_text_atomic", full)
    result = CliRunner().invoke(main, ["validate", clean, "-j", "1", "-o", str(tmp_path / "r.json")])
    assert result.exit_code == 3 and "the run failed: OSError" in result.output and "No space left" in result.output


def test_real_process_exit_codes(clean, tmp_path):
    """The installed entry point, as CI calls it."""
    def code(*args):
        return subprocess.run([sys.executable, "-m", "wdsfilter", *args], capture_output=True, text=True,
                              timeout=120, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert code("validate", clean, "-j", "1").returncode == 0
    nocap = write_shard(tmp_path / "nocap.tar", [("a.jpg", image_bytes())])
    assert code("validate", nocap, "-j", "1").returncode == 1
    proc = code("validate", clean, "--caption-key", "json:", "-j", "1")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "malformed caption key" in proc.stderr


# -- non-UTF-8 member names ---------------------------------------------------------------------------
def _raw_name_shard(path):
    """A shard whose member names are Latin-1 bytes (not UTF-8), as an old tar would write them."""
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT, encoding="latin-1") as tar:
        for name, data in [("caf\xe9.jpg", image_bytes()), ("caf\xe9.txt", b"a cafe"), ("\xfc\xfc.json", b"{bad")]:
            import io
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return str(path)


@pytest.mark.parametrize("fmt", ["text", "json", "junit"])
def test_every_format_writes_non_utf8_names_escaped(tmp_path, fmt):
    shard = _raw_name_shard(tmp_path / "latin1.tar")
    out = tmp_path / f"report.{fmt}"
    result = CliRunner().invoke(main, ["validate", shard, "-j", "1", "--format", fmt, "-o", str(out),
                                       "--stats-dir", str(tmp_path / "stats")])
    assert result.exit_code == 0, result.output  # invalid_json and the \xfc\xfc key's missing image: warnings
    text = out.read_text(encoding="utf-8")  # valid UTF-8
    if fmt == "text":
        assert "member \\xfc\\xfc.json" in text  # the bytes, escaped
    if fmt == "json":
        data = json.loads(text)
        assert any(f["member"] == "\\xfc\\xfc.json" for f in data["findings"])
    elif fmt == "junit":
        out_text = "".join(e.text or "" for e in ET.fromstring(text.encode()).iter("system-out"))
        assert "member='\\xfc\\xfc.json'" in out_text, out_text
    stats = json.loads((tmp_path / "stats" / "latin1_stats.json").read_text(encoding="utf-8"))
    assert any("\\xfc\\xfc" in f["member"] for f in stats["listed_findings"])
    assert not [f for f in os.listdir(tmp_path) if ".tmp" in f]


def test_failed_output_write_leaves_no_partial_file(tmp_path, clean, monkeypatch):
    out = tmp_path / "report.json"
    out.write_text("previous report\n")
    import wdsfilter.validate.formats as formats

    real = formats.render

    def half(report, fmt):  # rendering fails half-way: the previous report must stay whole
        raise RuntimeError("render failed")
    monkeypatch.setattr(formats, "render", half)
    result = CliRunner().invoke(main, ["validate", clean, "-j", "1", "--format", "json", "-o", str(out), "-q"])
    assert result.exit_code == 3 and out.read_text() == "previous report\n"
    assert os.listdir(tmp_path) == sorted(os.listdir(tmp_path)) and [f for f in os.listdir(tmp_path)
                                                                    if f.startswith(".")] == []
    monkeypatch.setattr(formats, "render", real)
    assert CliRunner().invoke(main, ["validate", clean, "-j", "1", "--format", "json", "-o", str(out), "-q"]).exit_code == 0
    assert json.loads(out.read_text())["status"] == "pass"


# -- pipe: commands that fail -------------------------------------------------------------------------
def test_failing_pipe_commands_are_findings_and_other_shards_are_kept(tmp_path, clean):
    other = write_shard(tmp_path / "other-000000.tar", image_text_members(2))
    urls = [clean, f"pipe:cat {clean}; exit 3", "pipe:exit 7", f"pipe:head -c 2000 {other}; false", other]
    for jobs in (1, 2):
        report = validate(urls, allow_pipe=True, jobs=jobs)
        by_shard = {r.shard: r for r in report.shards}
        assert by_shard[clean].counts == {} and by_shard[other].counts == {} and by_shard[other].kept == 2
        whole = by_shard[f"pipe:cat {clean}; exit 3"]
        # All of the tar came through, then the command failed. webdataset's Pipe raises at the first
        # read after the command's exit, so how much was read depends on timing: the shard is not clean.
        failed = next(f for f in whole.findings if f.kind == "shard_command_failed")
        assert "exited with status 3" in failed.message and whole.error
        nothing = by_shard["pipe:exit 7"]
        assert "status 7" in next(f.message for f in nothing.findings if f.kind == "shard_command_failed")
        cut = by_shard[f"pipe:head -c 2000 {other}; false"]
        assert cut.counts.get("shard_command_failed") == 1 and (cut.counts.get("truncated_tar") or
                                                                 cut.counts.get("unreadable_tar"))
        assert not report.passed
    result = CliRunner().invoke(main, ["validate", clean, "pipe:exit 7", "--allow-pipe", "-j", "1"])
    assert result.exit_code == 1 and "shard_command_failed" in result.output and "Traceback" not in result.output


class _CutHandler:
    """A loopback HTTP server: /cut.tar announces the whole shard and sends half of it, then
    closes (a download that fails mid-read); /missing.tar is a 404; /whole.tar is served whole."""

    @staticmethod
    def serve(shard_bytes):
        import http.server
        import threading

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path == "/missing.tar":
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(shard_bytes)))
                self.end_headers()
                body = shard_bytes if self.path == "/whole.tar" else shard_bytes[:len(shard_bytes) // 2]
                self.wfile.write(body)
                self.wfile.flush()
                self.close_connection = True

            def log_message(self, *args):
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server


def test_remote_shards_that_fail_mid_read_are_findings(tmp_path):
    shard = write_shard(tmp_path / "remote.tar", image_text_members(40))
    server = _CutHandler.serve(open(shard, "rb").read())
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        urls = [f"{base}/whole.tar", f"{base}/cut.tar", f"{base}/missing.tar"]
        report = validate(urls, jobs=1, config={"remote_attempts": 2, "remote_backoff_seconds": 0.01})
    finally:
        server.shutdown()
    whole, cut, missing = report.shards
    assert whole.counts == {} and whole.kept == 40
    # broke off at half; the server names no version (no ETag, no date), so each read starts again
    # from byte 0 (never resumed mid-object) and breaks off there again
    [failed] = cut.findings
    assert failed.kind == "remote_read_failed" and urls[1] in failed.message
    assert "at byte 56,320 of 112,640" in failed.message and "gave up after 2 failed reads" in failed.message
    assert [f.kind for f in missing.findings] == ["remote_object_missing"] and urls[2] in missing.findings[0].message
    assert cut.kept < 40 and not report.passed


# -- wdsfilter score: 0 clean, 2 usage/configuration, 3 run failed, never 1 ------------------------
def test_score_exit_codes_real_processes(clean, tmp_path):
    """The score command raises and the `wdsfilter` group maps the error: no model needed (OCR,
    here as 0.x ran it: frames at their own size, boxes not read; the exit codes are the point)."""
    cheap = ["--scorer-opt", 'ocr.backend_options={"min_side": 0}', "--scorer-opt", "ocr.min_text_score=null"]

    def code(*args):
        return subprocess.run([sys.executable, "-m", "wdsfilter", "score", *args, "--scorer", "ocr", "--no-progress",
                               *cheap],
                              capture_output=True, text=True, timeout=300,
                              cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    missing = code(str(tmp_path / "missing-{000..001}.tar"), "--out", str(tmp_path / "o1"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr and "Traceback" not in missing.stderr
    afile = tmp_path / "afile"
    afile.write_text("x")
    unwritable = code(clean, "--out", str(afile / "sub"))
    assert unwritable.returncode == 2 and "--out" in unwritable.stderr and "is a file, not a folder" in unwritable.stderr
    assert not os.path.exists(tmp_path / "o1")  # nothing was created before the error
    bad = [tmp_path / "bad-000000.tar", tmp_path / "bad-000001.tar"]
    bad[0].write_bytes(b"\0" * 100 + b"garbage" * 300)
    bad[1].write_bytes(b"not a tar" * 300)
    unreadable = code(*map(str, bad), "--out", str(tmp_path / "o2"))
    assert unreadable.returncode == 3 and unreadable.stderr.count("error:") == 1, unreadable.stderr
    assert "Traceback" not in unreadable.stderr
    ok = code(clean, "--out", str(tmp_path / "o3"))
    assert ok.returncode == 0, ok.stderr
    assert len(open(tmp_path / "o3" / "summary.json").read()) > 0


def test_score_run_failures_are_run_errors():
    from wdsfilter.score.backoff import ScorerError
    from wdsfilter.score.faults import DeviceFailedError, DiskFullError, RunFailedError
    from wdsfilter.score.modelworker import WorkerError
    for cls in (RunFailedError, DeviceFailedError, DiskFullError, WorkerError, ScorerError):
        assert issubclass(cls, RunError) and exit_code_for(cls("x")) == 3


@pytest.mark.parametrize("args, words", [
    (["validate", "x.tar", "--caption_key", "txt"], "No such option '--caption_key'. Did you mean '--caption-key'?"),
    (["valdate", "x.tar"], "No such command 'valdate'. Did you mean 'validate'?"),
    (["validate"], "Missing argument 'PATHS...'"),
    (["sort-shard", "sample_shards/", "out.tar"], "OUT 'out.tar' names a shard file, but IN is several shards"),
    (["sort-shard", "sample_shards/images-000000.tar"], "give the shard(s) to sort and where to write"),
    (["filter", "scores/", "--top", "clip_score=30%", "--write_shards", "t/"], "No such option '--write_shards'"),
])
def test_a_misspelt_command_line_is_one_line_exit_2(args, words):
    # click prints usage, a hint and the error on three lines; ours are one line, as every error
    r = subprocess.run([sys.executable, "-m", "wdsfilter", *args], capture_output=True, text=True,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert r.returncode == 2 and r.stdout == "", r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "--help" in lines[0], r.stderr


def test_ctrl_c_is_one_line_exit_130_and_score_says_how_to_continue(clean, tmp_path, monkeypatch):
    import wdsfilter.validate as v

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt()
    monkeypatch.setattr(v, "validate_urls", ctrl_c)
    result = CliRunner().invoke(main, ["validate", clean, "-j", "1"])
    assert result.exit_code == 130 and "wdsfilter validate: error: interrupted (Ctrl-C)" in result.output
    assert "--resume" not in result.output  # validate has no --resume
    score = pytest.importorskip("wdsfilter.score")
    monkeypatch.setattr(score, "build_config", ctrl_c)
    result = CliRunner().invoke(main, ["score", clean, "--out", str(tmp_path / "o")])
    assert result.exit_code == 130, result.output
    assert "interrupted (Ctrl-C); nothing unfinished was marked done; rerun the same command with --resume" \
        in result.output and len(result.output.strip().splitlines()) == 1
