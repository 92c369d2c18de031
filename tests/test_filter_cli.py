"""`wdsfilter filter` on the output folder of real `wdsfilter score` runs over shards made by GNU
tar: counts per threshold, exact top/bottom cuts, resharded samples byte for byte, resume after
SIGKILL, exit codes, the loader agreeing, and no torch import."""
import json
import math
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from filterkit import REPO, all_rows, gnu_tar_shards, member_infos, raw_members, run_cli, score_folder

COUNTS = [30, 25, 28]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Shards (long pax names, one refused caption, one corrupt JPEG) and their score folder."""
    folder = tmp_path_factory.mktemp("filter")
    shards = gnu_tar_shards(str(folder), COUNTS, long_names=True, refused={(0, 3)}, corrupt={(1, 2)})
    out = score_folder(shards, folder / "scores")
    return shards, out, all_rows(out)


def values(rows, column="brightness"):
    return np.array([r[column] for r in rows if r[column] is not None], dtype=float)


def kept_line(stdout, label):
    line = next(line for line in stdout.splitlines() if label in line)
    kept, total = line.split(" kept")[0].rsplit(":", 1)[1].split(" of ")
    return int(kept), int(total)


def test_counts_per_threshold_and_combined(run, tmp_path):
    shards, out, rows = run
    v = values(rows)
    lo, hi = float(np.quantile(v, 0.2)), float(np.quantile(v, 0.9))
    r = run_cli("filter", out, "--min", f"brightness={lo!r}", "--max", f"brightness={hi!r}", "--no-report", "--save")
    assert r.returncode == 0, r.stderr
    m = len(rows)
    assert m == sum(COUNTS)
    assert kept_line(r.stdout, "--min brightness") == (int((v >= lo).sum()), m)
    assert kept_line(r.stdout, "--max brightness") == (int((v <= hi).sum()), m)
    assert kept_line(r.stdout, "all thresholds") == (int(((v >= lo) & (v <= hi)).sum()), m)
    # The rows the scorer could not score are dropped and named by reason.
    assert "not scored: caption_refused" in r.stdout and "rejected: corrupt_image" in r.stdout
    # The resolved thresholds are the loader's keyword arguments.
    saved = json.load(open(os.path.join(out, "thresholds.json")))
    assert saved == {"min_scores": {"brightness": lo}, "max_scores": {"brightness": hi}}


@pytest.mark.parametrize("option,percent", [("--top", 30), ("--bottom", 12.5), ("--top", 100)])
def test_top_and_bottom_are_exact_ranks(run, option, percent):
    shards, out, rows = run
    v = np.sort(values(rows))
    k = math.ceil(len(v) * percent / 100)
    cut = v[-k] if option == "--top" else v[k - 1]
    r = run_cli("filter", out, option, f"brightness={percent}%", "--no-report", "--save")
    assert r.returncode == 0, r.stderr
    saved = json.load(open(os.path.join(out, "thresholds.json")))
    bound = saved["min_scores" if option == "--top" else "max_scores"]["brightness"]
    assert bound == cut  # exact, not interpolated
    kept = int((v >= cut).sum() if option == "--top" else (v <= cut).sum())
    assert kept == k  # no ties here: exactly the share
    assert kept_line(r.stdout, option) == (kept, len(rows))
    assert f"is {k} rows; no ties" in r.stdout


def test_ties_at_the_cut_are_kept_and_said(tmp_path):
    shards = gnu_tar_shards(str(tmp_path), [20], tie_every=2)  # 10 samples share the brightest colour
    out = score_folder(shards, tmp_path / "scores")
    r = run_cli("filter", out, "--top", "brightness=30%", "--no-report")
    assert r.returncode == 0, r.stderr
    assert kept_line(r.stdout, "--top") == (10, 20)
    assert "is 6 rows; 4 more tie with the cut value" in r.stdout
    assert "kept share 50.00%" in r.stdout


def test_write_shards_copies_members_byte_for_byte(run, tmp_path):
    shards, out, rows = run
    dest = tmp_path / "kept"
    r = run_cli("filter", out, "--top", "brightness=50%", "--write-shards", str(dest), "--samples-per-shard", "7",
                "--prefix", "train", "--no-report")
    assert r.returncode == 0, r.stderr
    v = values(rows)
    cut = np.sort(v)[-math.ceil(len(v) / 2)]
    expected_keys = [r_["key"] for r_ in rows if r_["brightness"] is not None and r_["brightness"] >= cut]
    sizes = json.load(open(dest / "sizes.json"))
    names = sorted(sizes)
    assert names == [f"train-{i:06d}.tar" for i in range(len(names))]
    assert all(n == 7 for n in list(sizes.values())[:-1]) and 1 <= sizes[names[-1]] <= 7
    assert sum(sizes.values()) == len(expected_keys) and f"wrote {len(expected_keys)} samples" in r.stdout
    # Every member of a kept sample, raw header and data bytes, in source order; nothing else.
    source = {}
    for shard in shards:
        for key, raw in raw_members(shard):
            source.setdefault(key, []).append(raw)
    written = []
    for name in names:
        members = raw_members(str(dest / name))
        stats = json.load(open(dest / name.replace(".tar", "_stats.json")))
        keys = list(dict.fromkeys(k for k, _ in members))
        assert stats["successes"] == len(keys) == sizes[name]
        assert stats["members"] == len(members) and stats["bytes"] == os.path.getsize(dest / name)
        for key in keys:
            assert [raw for k, raw in members if k == key] == source[key]
        written += keys
    assert written == expected_keys  # the kept samples in the run's order, none lost or doubled
    # Names (long pax names), modes, times, owners and bytes as in the source.
    infos = {i[0]: i for shard in shards for i in member_infos(shard)}
    for name in names:
        for info in member_infos(str(dest / name)):
            assert info == infos[info[0]]
    assert any(len(i[0]) > 100 for i in infos.values())
    # webdataset reads them as the same samples.
    import webdataset as wds
    got = [s["__key__"] for s in wds.WebDataset([str(dest / n) for n in names], shardshuffle=False)]
    assert got == expected_keys


def test_dry_run_report_and_no_report(run, tmp_path):
    shards, out, rows = run
    report = os.path.join(out, "filter_report.html")  # beside the score run's own report.html, never over it
    own = open(os.path.join(out, "report.html"), "rb").read()
    for f in (report, os.path.join(out, "thresholds.json")):
        if os.path.exists(f):
            os.remove(f)
    r = run_cli("filter", out, "--min", "brightness=0.3", "--write-shards", str(tmp_path / "k"), "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "dry run: nothing written" in r.stdout and kept_line(r.stdout, "all thresholds")[1] == len(rows)
    assert not os.path.exists(tmp_path / "k") and not os.path.exists(report)
    assert not os.path.exists(os.path.join(out, "thresholds.json"))
    r = run_cli("filter", out, "--min", "brightness=0.3", "--report", str(tmp_path / "r" / "mine.html"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "r" / "mine.html").read_text().startswith("<!DOCTYPE html>")
    assert not os.path.exists(report)
    r = run_cli("filter", out, "--min", "brightness=0.3")  # exploring: nothing written unless asked (issue 35 item 14)
    assert r.returncode == 0 and not os.path.exists(report) and "nothing written: --save" in r.stdout
    assert not os.path.exists(os.path.join(out, "thresholds.json"))
    r = run_cli("filter", out, "--min", "brightness=0.3", "--save")
    assert r.returncode == 0 and os.path.exists(report) and f"report: {report}" in r.stdout
    assert os.path.exists(os.path.join(out, "thresholds.json"))
    os.remove(report)
    r = run_cli("filter", out, "--min", "brightness=0.3", "--no-report", "--save")
    assert r.returncode == 0 and not os.path.exists(report)
    assert open(os.path.join(out, "report.html"), "rb").read() == own


@pytest.mark.parametrize("args,message", [
    (["--top", "brightness=30"], "--top expects COLUMN=P%"),
    (["--bottom", "brightness=150%"], "must be in (0, 100]%"),
    (["--min", "brightness"], "--min expects COLUMN=VALUE"),
    (["--max", "brightness=lots"], "is not a number"),
    (["--min", "clip_score=0.3"], "clip_score, which the score files"),
    (["--min", "bright_wide=1"], "bright_wide, which does not hold numbers"),
    (["--write-shards", "X", "--samples-per-shard", "0"], "--samples-per-shard must be >= 1"),
])
def test_usage_errors_exit_2_with_one_line(run, args, message):
    r = run_cli("filter", run[1], *args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert message in r.stderr and "Traceback" not in r.stderr


def test_outputs_that_cannot_be_written_exit_2_before_any_work(run):
    out = run[1]
    r = run_cli("filter", out, "--write-shards", os.path.join(out, "run.json"))
    assert r.returncode == 2 and "is a file, not a folder" in r.stderr
    r = run_cli("filter", out, "--report", os.path.join(out, "scores"))
    assert r.returncode == 2 and "is a folder; give a file name" in r.stderr


def test_resharding_options_without_write_shards_exit_2(tmp_path):
    r = run_cli("filter", str(tmp_path), "--samples-per-shard", "10", "--prefix", "train")
    assert r.returncode == 2 and "--samples-per-shard, --prefix only apply with --write-shards" in r.stderr


def test_not_a_score_folder_exits_2(tmp_path):
    r = run_cli("filter", str(tmp_path))
    assert r.returncode == 2 and "no done/ folder" in r.stderr
    # a file or a missing folder is named as such (it was judged as the --report's parent folder)
    (tmp_path / "scores.parquet").write_bytes(b"")
    r = run_cli("filter", str(tmp_path / "scores.parquet"))
    assert r.returncode == 2 and "is a file, not a score folder" in r.stderr and "--report" not in r.stderr
    r = run_cli("filter", str(tmp_path / "nothere"))
    assert r.returncode == 2 and "does not exist" in r.stderr and not (tmp_path / "nothere").exists()
    assert len(r.stderr.strip().splitlines()) == 1


def test_other_settings_in_out_need_overwrite(run, tmp_path):
    out, dest = run[1], str(tmp_path / "k")
    assert run_cli("filter", out, "--min", "brightness=0.3", "--write-shards", dest, "--no-report").returncode == 0
    r = run_cli("filter", out, "--min", "brightness=0.5", "--write-shards", dest, "--no-report")
    assert r.returncode == 2 and "--overwrite" in r.stderr
    r = run_cli("filter", out, "--min", "brightness=0.5", "--write-shards", dest, "--no-report", "--overwrite")
    assert r.returncode == 0, r.stderr
    v = values(run[2])
    assert sum(json.load(open(os.path.join(dest, "sizes.json"))).values()) == int((v >= 0.5).sum())


def test_missing_source_shard_is_a_run_failure_exit_3(tmp_path):
    shards = gnu_tar_shards(str(tmp_path), [6, 6])
    out = score_folder(shards, tmp_path / "scores")
    os.remove(shards[1])
    r = run_cli("filter", out, "--write-shards", str(tmp_path / "k"), "--no-report")
    assert r.returncode == 3 and shards[1] in r.stderr and "Traceback" not in r.stderr


def test_shards_scored_by_a_relative_path_are_found_from_another_folder(tmp_path, monkeypatch):
    """`wdsfilter score shards/a.tar` in one folder, `wdsfilter filter` in another: the source
    shards are where the scoring run read them, not relative to the filter's folder (they were
    'missing: it was scored but can no longer be read')."""
    work = tmp_path / "work"
    shards = gnu_tar_shards(str(work / "shards"), [6, 5])
    monkeypatch.chdir(work)
    relative = [os.path.relpath(s, work) for s in shards]
    out = score_folder(relative, work / "scores")
    assert {r["shard"] for r in all_rows(out)} == set(relative)  # rows keep the URL as given
    r = run_cli("filter", out, "--write-shards", str(tmp_path / "kept"), "--samples-per-shard", "4")
    assert r.returncode == 0, r.stderr
    assert sum(json.load(open(tmp_path / "kept" / "sizes.json")).values()) == 11
    html = open(tmp_path / "kept" / "report.html", encoding="utf-8").read()  # beside the shards it wrote
    cards = html.count('<div class="card ')
    assert cards > 0 and html.count('<img src="data:image/') == cards  # every example's thumbnail was read


def test_no_torch_is_imported(run, tmp_path):
    """The whole command (thresholds, shares, shards, report) with torch made unimportable."""
    code = ("import sys; sys.modules['torch'] = None\n"
            "from wdsfilter.cli import main\n"
            f"main(['filter', {run[1]!r}, '--top', 'brightness=40%', '--write-shards', {str(tmp_path / 'k')!r}],"
            " standalone_mode=False)\n"
            "assert sys.modules['torch'] is None\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert r.returncode == 0, r.stderr
    assert " kept" in r.stdout and os.path.exists(tmp_path / "k" / "sizes.json")


def test_a_dry_run_imports_no_write_side_and_no_shard_opener(run):
    """A count (--dry-run) imports what it reads with, not what writes or opens shards: its imports
    were most of what set `filter` behind duckdb at 4 M rows (tools/bench_filter.py, docs/dev.md).
    The same counts as a run that may write."""
    code = ("import sys\n"
            "from wdsfilter.cli import main\n"
            f"main(['filter', {run[1]!r}, '--top', 'brightness=40%', '--dry-run'], standalone_mode=False)\n"
            "print('LOADED', sorted(m for m in ('wdsfilter.filtering.write', 'wdsfilter.report.collect', "
            "'wdsfilter.runfolder.reshard', 'wdsfilter.storage.shards', 'wdsfilter.stream.config', 'pyarrow.parquet', "
            "'asyncio', 'PIL', 'pandas', 'torch', 'ssl', 'hashlib', 'tempfile') if m in sys.modules))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "LOADED []", r.stdout
    counted = run_cli("filter", run[1], "--top", "brightness=40%")  # not a dry run: nothing written either
    assert counted.returncode == 0, counted.stderr
    kept = [line for line in r.stdout.splitlines() if "(--top brightness=40%)" in line]
    assert kept and kept == [line for line in counted.stdout.splitlines() if "(--top brightness=40%)" in line]


def test_a_dry_run_process_ends_without_teardown_and_loses_no_output(run):
    # `wdsfilter filter --dry-run` (the process's own entry, cli.run) writes nothing, so it ends its
    # process without the interpreter's teardown (20-30 ms of a 4 M-row count), its output flushed
    # first, even into a pipe; a run that may write ends the usual way (its exit handlers run).
    def process(*args):
        code = ("import atexit, sys\n"
                "atexit.register(lambda: print('TEARDOWN'))\n"
                f"sys.argv = ['wdsfilter', 'filter', {run[1]!r}, '--top', 'brightness=40%', *{list(args)!r}]\n"
                "from wdsfilter.cli import run\n"
                "run()\n")
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    dry, counted = process("--dry-run"), process()
    assert dry.returncode == 0 and counted.returncode == 0, dry.stderr + counted.stderr
    assert "TEARDOWN" not in dry.stdout and counted.stdout.splitlines()[-1] == "TEARDOWN"
    lines = [line for line in dry.stdout.splitlines() if "(--top brightness=40%)" in line]
    assert lines and lines == [line for line in counted.stdout.splitlines() if "(--top brightness=40%)" in line]
    assert dry.stdout.splitlines()[-1] == counted.stdout.splitlines()[-2]  # the last line, there too
    assert dry.stdout.splitlines()[-1].startswith("  in training: wdsfilter.loader(")


def test_a_quiet_dry_run_started_with_stdout_closed_exits_clean(run):
    # Python gives a process started with descriptor 1 closed no sys.stdout (None): the end without
    # teardown flushes what there is, and the exit status is the command's.
    import shlex
    command = " ".join(shlex.quote(a) for a in (sys.executable, "-m", "wdsfilter", "filter", run[1], "--top",
                                                "brightness=40%", "--dry-run", "-q"))
    r = subprocess.run(command + " >&-", shell=True, capture_output=False, stderr=subprocess.PIPE, text=True,
                       cwd=REPO, timeout=300)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr


def test_loader_keeps_what_filter_keeps(run, tmp_path):
    shards, out, rows = run
    r = run_cli("filter", out, "--top", "brightness=40%", "--bottom", "brightness=90%", "--write-shards",
                str(tmp_path / "k"), "--no-report")
    assert r.returncode == 0, r.stderr
    names = sorted(json.load(open(tmp_path / "k" / "sizes.json")))
    import webdataset as wds
    written = [s["__key__"] for s in wds.WebDataset([str(tmp_path / "k" / n) for n in names], shardshuffle=False)]
    import wdsfilter
    seen = []
    loader = wdsfilter.loader(shards, batch_size=4, output="dict", scores=out,
                              top_shares={"brightness": 40}, bottom_shares={"brightness": "90%"})
    for batch in loader:
        seen += [s["__key__"] for s in batch]
    assert seen == written and len(seen) > 0
    saved = json.load(open(os.path.join(out, "thresholds.json")))
    seen2 = [s["__key__"] for b in wdsfilter.loader(shards, batch_size=4, output="dict", scores=out, **saved)
             for s in b]
    assert seen2 == written


def test_kill_9_then_again_gives_the_same_bytes(tmp_path):
    shards = gnu_tar_shards(str(tmp_path), [400, 400], extra_bytes=8000)
    out = score_folder(shards, tmp_path / "scores")
    args = ["filter", out, "--top", "brightness=70%", "--samples-per-shard", "4", "--no-report"]
    clean = tmp_path / "clean"
    assert run_cli(*args, "--write-shards", str(clean)).returncode == 0
    dest = tmp_path / "killed"
    killed_early = False
    for attempt in range(5):  # kill once the first shards are whole, while others are being written
        proc = subprocess.Popen([sys.executable, "-m", "wdsfilter", *args, "--write-shards", str(dest)],
                                cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            if os.path.isdir(dest) and sum(f.endswith("_stats.json") for f in os.listdir(dest)) > 3 + 10 * attempt:
                break
            time.sleep(0.002)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if proc.returncode == -signal.SIGKILL and not os.path.exists(dest / "sizes.json"):
            killed_early = True
            break
    assert killed_early, "the filter run finished before it could be killed"
    left = os.listdir(dest)
    assert any(f.endswith("_stats.json") for f in left)
    assert len([f for f in left if f.endswith(".tar")]) < len(os.listdir(clean))  # it was cut short
    r = run_cli(*args, "--write-shards", str(dest))
    assert r.returncode == 0, r.stderr
    assert "already whole" in r.stdout
    assert sorted(os.listdir(dest)) == sorted(os.listdir(clean))  # no temporaries left
    for name in os.listdir(clean):
        if name not in (".lock", ".lock.json"):  # the lease's record names who held it (pid, time)
            assert (dest / name).read_bytes() == (clean / name).read_bytes(), name


def test_gzip_sources_and_jsonl_score_files(tmp_path):
    """A .tar.gz source (made by GNU gzip) and JSONL score files: the same rows, the same bytes."""
    plain = gnu_tar_shards(str(tmp_path), [9, 8])
    subprocess.run(["gzip", "-k", "-n", plain[1]], check=True)
    shards = [plain[0], plain[1] + ".gz"]
    out = score_folder(shards, tmp_path / "scores", format="jsonl")
    assert sorted(os.listdir(os.path.join(out, "scores"))) == ["shard-0000.jsonl", "shard-0001.jsonl"]
    rows = all_rows(out)
    v = values(rows)
    cut = float(np.sort(v)[len(v) // 2])
    r = run_cli("filter", out, "--min", f"brightness={cut!r}", "--write-shards", str(tmp_path / "k"), "--no-report")
    assert r.returncode == 0, r.stderr
    assert kept_line(r.stdout, "all thresholds") == (int((v >= cut).sum()), len(rows))
    source = {}
    for shard in plain:
        for key, raw in raw_members(shard):
            source.setdefault(key, []).append(raw)
    got = {}
    for name in sorted(json.load(open(tmp_path / "k" / "sizes.json"))):
        for key, raw in raw_members(str(tmp_path / "k" / name)):
            got.setdefault(key, []).append(raw)
    expected = [r_["key"] for r_ in rows if r_["brightness"] is not None and r_["brightness"] >= cut]
    assert list(got) == expected and any(k.startswith("s1_") for k in got)
    assert all(got[k] == source[k] for k in got)


def test_an_incomplete_score_folder_is_named_and_fails_unless_allowed(tmp_path):
    """A scoring run with a failed shard, and one whose score file was damaged since: filter counts
    the finished shards, names the others (INCOMPLETE) and exits 3, so thresholds and shards from
    part of the data are never reported clean; --allow-incomplete accepts it."""
    shards = gnu_tar_shards(str(tmp_path), [6, 5, 7])
    failing = f"pipe:cat {shards[2]}; exit 1"
    out = str(tmp_path / "scores")
    score_folder([shards[0], shards[1], failing], out, allow_pipe=True)
    assert [f["url"] for f in summary_failed(out)] == [failing]
    r = run_cli("filter", out, "--min", "brightness=0.1", "--no-report", "--dry-run")
    assert r.returncode == 3, r.stderr
    assert "INCOMPLETE: 1 shard(s) of the scoring run have no complete score file" in r.stdout
    assert failing in r.stdout and "11 rows in 2 finished shard(s)" in r.stdout
    assert "--allow-incomplete" in r.stderr
    ok = run_cli("filter", out, "--min", "brightness=0.1", "--no-report", "--dry-run", "--allow-incomplete")
    assert ok.returncode == 0, ok.stderr
    score_file = os.path.join(out, "scores", os.path.basename(shards[1])[:-4] + ".parquet")
    open(score_file, "ab").write(b"junk")  # damaged after the marker was written
    r = run_cli("filter", out, "--no-report", "--dry-run")
    assert r.returncode == 3 and "INCOMPLETE: 2 shard(s)" in r.stdout and "6 rows in 1 finished shard(s)" in r.stdout


def summary_failed(out):
    return json.load(open(os.path.join(out, "summary.json")))["shards_failed"]


def test_a_source_shard_changed_since_scoring_is_a_run_failure_exit_3(tmp_path):
    """The same keys, other bytes (a shard re-created under its name): the scores are not theirs.
    Writing shards from it used to copy the new bytes under the old scores; now its marker's
    record of the shard (size, modification time) tells, and the run fails naming it."""
    shards = gnu_tar_shards(str(tmp_path), [6, 6])
    out = score_folder(shards, tmp_path / "scores")
    other = gnu_tar_shards(str(tmp_path / "other"), [6, 6], extra_bytes=100)  # same keys, one more member each
    os.replace(other[1], shards[1])
    r = run_cli("filter", out, "--write-shards", str(tmp_path / "k"), "--no-report")
    assert r.returncode == 3, r.stdout + r.stderr
    assert f"source shard {shards[1]} changed since it was scored" in r.stderr and "Traceback" not in r.stderr


def test_jsonl_scores_whose_first_shard_is_empty(tmp_path):
    """A JSON Lines file names its columns only in its rows: an empty tar (GNU tar) sorted first gives
    an empty score file, and filter and the loader took the run to have no score column at all
    ("thresholds on brightness, which the score files do not have")."""
    import wdsfilter
    shards = gnu_tar_shards(str(tmp_path), [0, 6])  # shard-0000.tar: no member
    out = score_folder(shards, tmp_path / "scores", format="jsonl")
    assert os.path.getsize(os.path.join(out, "scores", "shard-0000.jsonl")) == 0
    r = run_cli("filter", out, "--top", "brightness=50%", "--no-report")
    assert r.returncode == 0, r.stderr
    assert kept_line(r.stdout, "all thresholds") == (3, 6)
    loader = wdsfilter.loader(shards, batch_size=2, output="dict", scores=out, min_scores={"brightness": 0.0})
    assert sum(len(b) for b in loader) == 6
