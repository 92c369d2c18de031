"""Progress as tqdm users expect it (issue 24, item 3): plain lines in a log (no carriage returns),
a bar drawn in place on a terminal, a total from sizes.json or the shard count, a fixed unit."""
from __future__ import annotations

import io
import os
import re
import time

from click.testing import CliRunner

from scorekit import make_shards
from wdsfilter.cli import main
from wdsfilter.core.progress import Progress, clock
from wdsfilter.storage.shardstats import sizes_samples
from wdsfilter.storage.shardstats import update_sizes


def test_a_log_gets_plain_lines_with_total_percentage_rate_and_eta():
    out = io.StringIO()  # not a terminal
    bar = Progress("scoring", "samples", total=10, parts=2, file=out, interval=0)  # a line at every update
    bar.update(4)
    bar.part_done()
    bar.update(6)
    bar.part_done()
    bar.close()
    text = out.getvalue()
    assert "\r" not in text and "\x1b" not in text
    lines = text.splitlines()
    assert lines[0].startswith("scoring: 0/10 samples (0%), shards 0/2, 0.0 samples/s, elapsed 0:00, ETA ?")
    assert "4/10 samples (40%), shards 0/2" in lines[1] and "ETA " in lines[1]
    assert lines[-1].startswith("scoring: 10/10 samples (100%), shards 2/2") and lines[-1].endswith("ETA 0:00")
    assert all(" samples/s" in line for line in lines)


def test_without_a_sample_total_the_share_is_the_shards():
    bar = Progress("scoring", "samples", parts=4, file=io.StringIO(), interval=0)
    bar.update(30)
    bar.part_done()
    line = bar.line(now=bar.started + 20)
    bar.close()
    assert "30 samples (25%), shards 1/4" in line and "elapsed 0:20, ETA 1:00" in line


def test_the_unit_stays_samples_per_second_when_slow():
    bar = Progress("scoring", "samples", total=100, file=io.StringIO(), interval=0)
    bar.update(1)
    line = bar.line(now=bar.started + 3725.5)  # one sample in an hour
    bar.close()
    assert "0.0 samples/s" in line and not re.search(r"\ds/sample", line) and "elapsed 1:02:05" in line
    assert clock(59) == "0:59" and clock(None) == "?"


def test_a_terminal_gets_one_line_redrawn_with_a_bar():
    out = io.StringIO()
    bar = Progress("scoring", "samples", total=8, file=out, tty=True)
    bar.update(4)
    bar.close()
    text = out.getvalue()
    assert text.startswith("\rscoring:") and text.endswith("\n") and text.count("\n") == 1
    last = text.rstrip("\n").split("\r")[-1]
    assert last.startswith("scoring:  50%|##########          | 4/8 samples [") and "samples/s" in last


def test_the_elapsed_time_moves_between_updates():
    """A slow batch used to freeze the line: the ticker writes lines without any update. Waits for
    the lines (an event), not for a time."""
    out = io.StringIO()
    bar = Progress("scoring", "samples", total=5, file=out, interval=0.05)
    deadline = time.monotonic() + 120  # a hang guard only
    while out.getvalue().count("\n") < 3:
        assert time.monotonic() < deadline, "no line came without an update"
        time.sleep(0.01)
    bar.close()
    assert out.getvalue().splitlines()[1].startswith("scoring: 0/5 samples")


def test_the_total_comes_from_sizes_json(tmp_path):
    urls, _ = make_shards(tmp_path / "shards", [3, 4])
    folder = os.path.dirname(urls[0])
    assert sizes_samples(urls) is None  # no sizes.json
    update_sizes(folder, {os.path.basename(urls[0]): 3})
    assert sizes_samples(urls) is None  # one shard unlisted: no total rather than a wrong one
    update_sizes(folder, {os.path.basename(urls[1]): 4})
    assert sizes_samples(urls) == 7
    assert sizes_samples(urls + ["pipe:cat x.tar"]) is None


def run_score(tmp_path, *args):
    urls, _ = make_shards(tmp_path / "shards", [3, 4])
    update_sizes(os.path.dirname(urls[0]), {os.path.basename(u): n for u, n in zip(urls, (3, 4))})
    return CliRunner().invoke(main, ["score", *urls, "--scorer", "scorekit:BrightnessScorer", "--device", "cpu",
                                     "--workers", "0", "--out", str(tmp_path / "out"), *args])


def test_score_in_a_log_prints_plain_progress_and_the_plan_in_one_line(tmp_path):
    result = run_score(tmp_path)
    assert result.exit_code == 0, result.output
    text = result.output
    assert "\r" not in text
    assert "2 shard(s) to score; loading scorekit:BrightnessScorer" in text.splitlines()[0]
    assert text.count("scorer: bright") == 1
    plan = [line for line in text.splitlines() if line.startswith("plan:")]
    assert len(plan) == 1 and "(-v or --dry-run: the whole plan)" in plan[0] and "model on cpu" not in text
    assert "scoring: 7/7 samples (100%), shards 2/2" in text


def test_score_verbose_prints_the_whole_plan_and_quiet_prints_the_result_only(tmp_path):
    verbose = run_score(tmp_path, "-v")
    assert verbose.exit_code == 0, verbose.output
    assert "plan:\n" in verbose.output and "decode workers" in verbose.output
    quiet = run_score(tmp_path, "-q", "--overwrite")
    assert quiet.exit_code == 0, quiet.output
    assert "plan:" not in quiet.output and "scoring:" not in quiet.output and "to score" not in quiet.output
    # -q: the one-line result (and errors), no per-scorer summary
    assert quiet.output.splitlines() == ["scored 7 of 7 samples in 2 shard(s)"]
    both = run_score(tmp_path, "-q", "-v", "--overwrite")
    assert both.exit_code == 2 and "exclude each other" in both.output


def test_validate_verbose_prints_progress_lines_in_a_log(tmp_path):
    urls, _ = make_shards(tmp_path / "shards", [3, 4])
    result = CliRunner().invoke(main, ["validate", *urls, "-j", "1", "-v"])
    assert result.exit_code in (0, 1), result.output
    assert "\r" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("validate: 2/2 shards (100%)") and " shards/s, " in last and " samples/s" in last
    quiet = CliRunner().invoke(main, ["validate", *urls, "-j", "1", "-q"])
    assert "validate:" not in quiet.stderr


def test_validate_quiet_prints_the_verdict_line_only():
    """-q: the one-line verdict (the last line of the full report) and nothing else, on a clean set
    (exit 0) and on one with findings (exit 1); the committed shards, one with two corrupt JPEGs."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    clean = [os.path.join(root, "sample_shards", f"images-00000{i}.tar") for i in (0, 1)]
    broken = [*clean, os.path.join(root, "sample_shards", "broken", "corrupt-jpeg-000000.tar")]
    for shards, code in ((clean, 0), (broken, 1)):
        full = CliRunner().invoke(main, ["validate", *shards, "-j", "1"])
        quiet = CliRunner().invoke(main, ["validate", *shards, "-j", "1", "-q"])
        assert full.exit_code == quiet.exit_code == code, (full.output, quiet.output)
        assert len(full.stdout.strip().splitlines()) > 5
        assert quiet.output.splitlines() == [full.stdout.strip().splitlines()[-1]]
        assert quiet.output.startswith("PASS; 0 error(s)" if code == 0 else "FAIL: 2 finding(s) at the failing level "
                                       "(corrupt_image); 2 error(s)")
