"""A score folder is input too (issue 20): `wdsfilter filter`, its report and the loader's score
filter take their permissions from the command line, never from the folder; `filter` deletes
only what it wrote, takes a lock on its output folder and rewrites shards whose scores changed."""
import json
import os
import time
from contextlib import contextmanager

import pytest

from faultkit import counting_server
from filterkit import gnu_tar_shards, peak_rss_mb, run_cli, score_folder


@contextmanager
def serving(path):
    """`path` served on 127.0.0.1; yields (URL, hits): hits lists every request."""
    with open(path, "rb") as f:
        data = f.read()
    with counting_server(data, os.path.basename(path)) as served:
        yield served


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


@pytest.mark.parametrize("extra", [["--save"], ["--write-shards", "K", "--no-report"], ["--write-shards", "K"]])
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
    from wdsfilter.core.errors import UnsafeInputError
    from wdsfilter.filtering import filter_scores
    folder, shard, out, canary = piped
    with pytest.raises(UnsafeInputError, match="allow_pipe=True"):
        filter_scores(out, write_shards=str(tmp_path / "k"), report=None)
    assert not canary.exists() and not (tmp_path / "k").exists()
    import wdsfilter
    from wdsfilter.core.errors import StarvationError
    # The loader reads the shards it is given (a local one here), never the folder's commands;
    # the pipe: source's rows do not name this local shard, so nothing comes out.
    with pytest.raises(StarvationError, match="no_score"):
        list(wdsfilter.loader([shard], batch_size=4, output="dict", scores=out))
    assert not canary.exists()


def test_filter_reads_no_remote_source_without_allow_remote(tmp_path):
    shard = gnu_tar_shards(str(tmp_path), [6])[0]
    with serving(shard) as (url, hits):
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


# -- 2. nothing is deleted that filter did not write --------------------------------------------------
def test_write_shards_into_the_sources_folder_is_refused_and_deletes_nothing(tmp_path):
    """Source shards named like filter's default prefix (shard-000000.tar ...): --overwrite used
    to delete every one of them, then fail with 'source shard ... is missing'."""
    src = tmp_path / "data"
    made = gnu_tar_shards(str(tmp_path / "make"), [5, 4])
    src.mkdir()
    shards = []
    for i, path in enumerate(made):
        shards.append(str(src / f"shard-{i:06d}.tar"))
        os.rename(path, shards[-1])
    before = {p: open(p, "rb").read() for p in shards}
    out = score_folder(shards, tmp_path / "scores")
    for extra in ([], ["--overwrite"]):
        r = run_cli("filter", out, "--write-shards", str(src), "--no-report", *extra)
        assert r.returncode == 2 and one_line(r.stderr) and "input shard" in r.stderr, r.stderr
        assert {p: open(p, "rb").read() for p in shards} == before
        assert sorted(os.listdir(src)) == sorted(os.path.basename(p) for p in shards)


def test_overwrite_replaces_only_what_filters_own_run_wrote(tmp_path):
    shards = gnu_tar_shards(str(tmp_path), [6, 6])
    out = score_folder(shards, tmp_path / "scores")
    dest = tmp_path / "k"
    dest.mkdir()
    theirs = {"shard-000001.tar": b"someone else's shard", "sizes.json": b'{"x.tar": 3}', "notes.txt": b"keep me"}
    for name, data in theirs.items():
        (dest / name).write_bytes(data)
    for extra in ([], ["--overwrite"]):  # files filter did not write are never replaced
        r = run_cli("filter", out, "--write-shards", str(dest), "--samples-per-shard", "4", "--no-report", *extra)
        assert r.returncode == 2 and one_line(r.stderr) and "did not write" in r.stderr, r.stderr
        assert {n: (dest / n).read_bytes() for n in theirs} == theirs
        assert set(os.listdir(dest)) - {".lock", ".lock.json"} == set(theirs)  # the lease's files are filter's own
    os.remove(dest / "shard-000001.tar")
    os.remove(dest / "sizes.json")
    args = ["filter", out, "--write-shards", str(dest), "--samples-per-shard", "4", "--no-report"]
    assert run_cli(*args).returncode == 0
    written = json.load(open(dest / "filter_run.json"))["files"]
    assert "shard-000002.tar" in written and "notes.txt" not in written
    # A hand-edited list cannot make --overwrite delete anything else.
    outside = tmp_path / "outside.txt"
    outside.write_text("x")
    run_file = json.load(open(dest / "filter_run.json"))
    run_file["files"] += ["../outside.txt", str(outside)]
    json.dump(run_file, open(dest / "filter_run.json", "w"))
    r = run_cli(*args[:-3], "--samples-per-shard", "5", "--no-report", "--overwrite")
    assert r.returncode == 0, r.stderr
    assert outside.exists() and (dest / "notes.txt").read_bytes() == b"keep me"
    assert sorted(os.listdir(dest)) == sorted(["notes.txt", "filter_run.json", ".lock", ".lock.json", "sizes.json",
                                               "README.md", "thresholds.json"]
                                              + [f"shard-00000{i}{s}" for i in range(3)
                                                 for s in (".tar", "_stats.json")])


# -- 3. a shard scored again is other data -------------------------------------------------------
def tar_samples(path):
    import tarfile
    with tarfile.open(path) as tar:
        return len({m.name.split(".")[0] for m in tar if m.isreg()})


def test_a_rescored_shard_is_not_reported_whole_and_sizes_json_equals_the_tars(tmp_path):
    shards = gnu_tar_shards(str(tmp_path), [10, 10])
    out = score_folder(shards, tmp_path / "scores")
    dest = tmp_path / "k"
    args = ["filter", out, "--write-shards", str(dest), "--samples-per-shard", "4", "--no-report"]
    assert run_cli(*args).returncode == 0
    # The source changes upstream (5 samples fewer) and `score --resume` rescores it, as documented.
    fewer = gnu_tar_shards(str(tmp_path / "new"), [5])[0]
    os.replace(fewer, shards[1])
    score_folder(shards, tmp_path / "scores", resume=True)
    r = run_cli(*args)
    assert r.returncode == 2 and one_line(r.stderr) and "scored again" in r.stderr and "--overwrite" in r.stderr
    r = run_cli(*args, "--overwrite")
    assert r.returncode == 0, r.stderr
    assert "already whole" not in r.stdout and "wrote 15 samples" in r.stdout
    sizes = json.load(open(dest / "sizes.json"))
    tars = sorted(f for f in os.listdir(dest) if f.endswith(".tar"))
    assert sorted(sizes) == tars and {t: tar_samples(dest / t) for t in tars} == sizes


# -- 4. one filter run per output folder ----------------------------------------------------------
def test_a_second_filter_into_the_same_folder_is_refused_while_the_first_holds_it(tmp_path):
    """The first run reads its source through a pipe: command that waits on a FIFO, so it holds
    OUT's lock until the test lets it go: no timing decides the outcome."""
    import subprocess
    import sys
    from filterkit import REPO
    shard = gnu_tar_shards(str(tmp_path), [6])[0]
    out = score_folder([f"pipe:cat {shard}"], tmp_path / "scores", allow_pipe=True)
    data = open(shard, "rb").read()
    os.remove(shard)
    os.mkfifo(shard)  # the same command now waits for the test to write the shard
    dest = tmp_path / "k"
    args = ["filter", out, "--allow-pipe", "--write-shards", str(dest), "--no-report"]
    first = subprocess.Popen([sys.executable, "-m", "wdsfilter", *args], cwd=REPO, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        fifo = None
        while fifo is None:  # opened once the first run's command reads it: by then it holds the lock
            assert first.poll() is None, first.communicate()
            try:
                fifo = os.fdopen(os.open(shard, os.O_WRONLY | os.O_NONBLOCK), "wb")
            except OSError:  # ENXIO: no reader yet
                time.sleep(0.01)
        os.set_blocking(fifo.fileno(), True)
        held = json.load(open(dest / ".lock.json"))  # the lease's record names the first run
        assert held["pid"] == first.pid and held["command"] == "filter" and "released" not in held
        second = run_cli(*args)
        assert second.returncode == 2 and one_line(second.stderr), second.stderr
        assert "in use by another wdsfilter filter run" in second.stderr and f"pid {first.pid}" in second.stderr
        fifo.write(data)
        fifo.close()
        stdout, stderr = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 0, stderr
    assert json.load(open(dest / "sizes.json")) == {"shard-000000.tar": 6}
    assert tar_samples(dest / "shard-000000.tar") == 6


# -- 5. any finite or infinite score; bidi controls escaped --------------------------------------
def no_constant(name):
    raise AssertionError(f"{name} written into a JSON file")


def test_scores_at_the_ends_of_the_floats_are_summarized_reported_and_resumed(tmp_path):
    """A scorer returning +-sys.float_info.max, inf and NaN (common sentinels): score ended with
    'internal error: ValueError: cannot convert float NaN to integer' after marking every shard
    done, and --resume failed the same way for ever. A key with U+202E reversed its report card."""
    import math
    import sys

    from scorekit import ExtremeScorer, colored_members, make_shards
    from shardkit import image_bytes, write_shard
    from wdsfilter.score import score
    urls, _ = make_shards(str(tmp_path / "data"), [12])
    members, _ = colored_members(6, shard=1)
    evil = "evil\u202egpj_rat"
    members += [(f"{evil}.jpg", image_bytes(color=(200, 10, 10))), (f"{evil}.txt", "a caption \u202e reversed")]
    urls.append(write_shard(str(tmp_path / "data" / "shard-0001.tar"), members))
    for fmt in ("parquet", "jsonl"):
        out = str(tmp_path / f"scores-{fmt}")
        for resume in (False, True):
            summary = score(urls, out=out, scorers=[ExtremeScorer()], device="cpu", progress=False, workers=0,
                            batch_size=4, format=fmt, resume=resume, min_scores={"extreme": 0.0})
            st = summary.columns["extreme"]
            saved = json.load(open(os.path.join(out, "summary.json")), parse_constant=no_constant)
            assert saved["columns"]["extreme"]["count"] == st["count"]
            assert st["max"] == sys.float_info.max and st["min"] == -sys.float_info.max
            assert math.isfinite(st["mean"]) and sum(st["histogram"]["counts"]) == st["count"]
            assert all(math.isfinite(e) for e in st["histogram"]["edges"])
            # 19 samples: 3 each of +-max, 3 NaN (missing), 6 infinite, 4 brightness
            assert st["count"] == 10 and st.get("infinite", 0) == (6 if fmt == "parquet" else 0)  # JSONL: null
            assert os.path.exists(os.path.join(out, "histograms.png"))
            assert os.path.exists(os.path.join(out, "report.html"))
        if fmt == "jsonl":
            for name in os.listdir(os.path.join(out, "scores")):
                for line in open(os.path.join(out, "scores", name)):
                    json.loads(line, parse_constant=no_constant)
        r = run_cli("filter", out, "--top", "extreme=50%", "--report", str(tmp_path / f"{fmt}.html"))
        assert r.returncode == 0, r.stderr
        page = (tmp_path / f"{fmt}.html").read_text(encoding="utf-8")
        assert "\u202e" not in page and "evil\\u202egpj_rat" in page and "nan" not in page.replace("nanos", "")


# -- 6. bounded report -----------------------------------------------------------------------------
def test_the_report_stays_small_whatever_the_captions(tmp_path):
    """A .tar.gz of a few MB whose captions are MBs each (3.5 MB: scored; 20 MB: over the text
    cap, dropped): the report embedded them whole (377 MB from 1.7 MB of shards) and held every
    shown member of a shard at once."""
    import io
    import tarfile

    from shardkit import image_bytes
    shard = str(tmp_path / "big-captions.tar.gz")
    with tarfile.open(shard, "w:gz", compresslevel=1) as tar:
        for i in range(8):
            caption = ("word " * ((20 << 20) // 5 if i >= 6 else (3_500_000 // 5))).encode()
            for name, data in ((f"s{i:03d}.jpg", image_bytes(color=(30 * i, 90, 200 - 20 * i))),
                               (f"s{i:03d}.txt", caption)):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    assert os.path.getsize(shard) < 1 << 20
    out = score_folder([shard], tmp_path / "scores")
    page = tmp_path / "r.html"
    r, rss = peak_rss_mb("filter", out, "--top", "brightness=50%", "--report", str(page))
    assert r.returncode == 0, r.stderr
    html = page.read_text(encoding="utf-8")
    assert os.path.getsize(page) < 2 << 20  # was > 28 MB: every caption whole
    assert html.count('<img src="data:image/') >= 6 and "characters in all)" in html
    assert rss < 600, rss


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_named_pipe_planted_in_the_run_folder_is_refused_not_waited_on(tmp_path):
    shard = gnu_tar_shards(str(tmp_path), [4])[0]
    out = score_folder([shard], tmp_path / "scores")
    score_file = os.path.join(out, "scores", sorted(os.listdir(os.path.join(out, "scores")))[0])
    os.remove(score_file)
    os.mkfifo(score_file)  # opening it for reading would block until someone writes
    for args in (["--dry-run"], ["--write-shards", str(tmp_path / "kept"), "--no-report"]):
        r = run_cli("filter", out, *args, timeout=120)
        assert r.returncode == 2 and one_line(r.stderr), r.stderr
        assert "not a regular file" in r.stderr and os.path.basename(score_file) in r.stderr


def test_a_users_report_html_in_out_is_not_filters_when_the_report_goes_elsewhere(tmp_path):
    """filter --write-shards OUT counts OUT/report.html as a file of its own only when its report
    goes there: with --report elsewhere (or --no-report), a report.html of the user's in OUT is
    neither refused nor removed by --overwrite."""
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
