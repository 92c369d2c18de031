"""A score folder is input too (issue 20): `wdsfilter filter`, its report and the loader's score
filter take their permissions from the command line, never from the folder; `filter` deletes
only what it wrote, takes a lock on its output folder and rewrites shards whose scores changed."""
import http.server
import json
import os
import threading
from contextlib import contextmanager

import pytest

from filterkit import gnu_tar_shards, run_cli, score_folder


@contextmanager
def counting_server(path):
    """`path` served on 127.0.0.1; yields (URL, hits): hits lists every request."""
    data = open(path, "rb").read()
    hits = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the http.server API
            hits.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/{os.path.basename(path)}", hits
    finally:
        server.shutdown()
        server.server_close()


def one_line(stderr):
    return len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr


# -- 1. permissions come from the command line ------------------------------------------------------
@pytest.fixture(scope="module")
def piped(tmp_path_factory):
    """A genuine score folder of one shard read through a `pipe:` command that also touches a
    canary file (scored with allow_pipe=True; run.json records it), the canary then removed."""
    folder = tmp_path_factory.mktemp("piped")
    shard = gnu_tar_shards(str(folder), [8])[0]
    canary = folder / "CANARY"
    out = score_folder([f"pipe:cat {shard}; touch {canary}"], folder / "scores", allow_pipe=True)
    assert canary.exists()  # the command really ran while scoring
    assert json.load(open(os.path.join(out, "run.json")))["stage"]["allow_pipe"] is True
    os.remove(canary)
    return folder, shard, out, canary


@pytest.mark.parametrize("extra", [[], ["--write-shards", "K", "--no-report"], ["--write-shards", "K"]])
def test_filter_runs_no_pipe_command_the_folder_names_without_allow_pipe(piped, extra):
    folder, _, out, canary = piped
    extra = [str(folder / e) if e == "K" else e for e in extra]
    report = os.path.join(out, "report.html")  # score's own, written with its --allow-pipe
    before = os.stat(report).st_mtime_ns
    r = run_cli("filter", out, "--min", "brightness=0.2", *extra)
    assert r.returncode == 2 and one_line(r.stderr), r.stderr
    assert "--allow-pipe" in r.stderr and "pipe:cat" in r.stderr
    assert not canary.exists() and not (folder / "K").exists()
    assert os.stat(report).st_mtime_ns == before


def test_filter_counts_without_reading_sources_and_runs_the_command_when_allowed(piped, tmp_path):
    folder, _, out, canary = piped
    r = run_cli("filter", out, "--no-report")  # counting reads the score files only
    assert r.returncode == 0, r.stderr
    assert " of 8 kept" in r.stdout and not canary.exists()
    r = run_cli("filter", out, "--allow-pipe", "--write-shards", str(tmp_path / "k"),
                "--report", str(tmp_path / "r.html"))
    assert r.returncode == 0, r.stderr
    assert canary.exists()  # this command line allowed it
    os.remove(canary)
    assert sum(json.load(open(tmp_path / "k" / "sizes.json")).values()) == 8
    assert '<img src="data:image/' in (tmp_path / "r.html").read_text()


def test_filter_scores_and_the_loader_take_no_permission_from_the_folder(piped, tmp_path):
    from wdsfilter.errors import UnsafeInputError
    from wdsfilter.filtering import filter_scores
    folder, shard, out, canary = piped
    with pytest.raises(UnsafeInputError, match="allow_pipe=True"):
        filter_scores(out, write_shards=str(tmp_path / "k"), report=None)
    assert not canary.exists() and not (tmp_path / "k").exists()
    import wdsfilter
    from wdsfilter.errors import StarvationError
    # The loader reads the shards it is given (a local one here), never the folder's commands;
    # the pipe: source's rows do not name this local shard, so nothing comes out.
    with pytest.raises(StarvationError, match="no_score"):
        list(wdsfilter.loader([shard], batch_size=4, output="dict", scores=out))
    assert not canary.exists()


def test_filter_reads_no_remote_source_without_allow_remote(tmp_path):
    shard = gnu_tar_shards(str(tmp_path), [6])[0]
    with counting_server(shard) as (url, hits):
        out = score_folder([url], tmp_path / "scores", allow_remote=True)
        scored = len(hits)
        assert scored >= 1
        r = run_cli("filter", out, "--write-shards", str(tmp_path / "k"))
        assert r.returncode == 2 and one_line(r.stderr) and "--allow-remote" in r.stderr, r.stderr
        assert len(hits) == scored and not (tmp_path / "k").exists()
        r = run_cli("filter", out, "--allow-remote", "--write-shards", str(tmp_path / "k"))
        assert r.returncode == 0, r.stderr
        assert len(hits) > scored
    assert sum(json.load(open(tmp_path / "k" / "sizes.json")).values()) == 6
