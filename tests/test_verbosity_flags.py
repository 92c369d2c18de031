"""-q/--quiet and -v/--verbose on `filter`, `dedup` and `sort-shard` (score and validate have
theirs in test_progress.py): -q says nothing on success and still writes everything, -v says
more, both at once is a usage error (exit 2). On real shards (webdataset's TarWriter, GNU tar)
and a real hash-scorer run (no model)."""
import json
import os
import subprocess

import pytest
from click.testing import CliRunner

from filterkit import img2dataset_shards
from wdsfilter.cli import main


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A hash-only scoring run over two shards whose every 4th image is the same black square."""
    folder = tmp_path_factory.mktemp("verbosity")
    shards = img2dataset_shards(str(folder), [10, 8], duplicate_every=4)
    out = str(folder / "run")
    r = CliRunner().invoke(main, ["score", *shards, "--out", out, "--scorer", "hash", "--device", "cpu",
                                  "--no-progress", "--workers", "0", "-q"])
    assert r.exit_code == 0, r.output
    return out


def invoke(*args):
    return CliRunner().invoke(main, list(args))


@pytest.mark.parametrize("command", ["filter", "dedup", "sort-shard"])
def test_quiet_and_verbose_together_exit_2(run, tmp_path, command):
    args = {"filter": [run], "dedup": [run], "sort-shard": [os.path.join(os.path.dirname(run), "00000.tar"),
                                                            str(tmp_path / "x.tar")]}[command]
    r = invoke(command, *args, "-q", "-v")
    assert r.exit_code == 2 and "-q/--quiet and -v/--verbose exclude each other" in r.output
    assert not os.path.exists(tmp_path / "x.tar")


def test_filter_quiet_writes_everything_and_says_nothing(run, tmp_path):
    loud = invoke("filter", run, "--write-shards", str(tmp_path / "loud"), "--no-report")
    quiet = invoke("filter", run, "--write-shards", str(tmp_path / "quiet"), "--no-report", "-q")
    assert loud.exit_code == quiet.exit_code == 0, (loud.output, quiet.output)
    assert "wrote 18 samples into 1 shard(s)" in loud.output and quiet.stdout == ""
    for name in ("sizes.json", "shard-000000.tar"):
        with open(tmp_path / "loud" / name, "rb") as a, open(tmp_path / "quiet" / name, "rb") as b:
            assert a.read() == b.read()


def test_filter_verbose_names_each_written_shard(run, tmp_path):
    r = invoke("filter", run, "--write-shards", str(tmp_path / "out"), "--samples-per-shard", "5", "--no-report", "-v")
    assert r.exit_code == 0, r.output
    with open(tmp_path / "out" / "sizes.json") as f:
        sizes = json.load(f)
    assert sizes == {"shard-000000.tar": 5, "shard-000001.tar": 5, "shard-000002.tar": 5, "shard-000003.tar": 3}
    for name, n in sizes.items():
        assert f"wrote {tmp_path / 'out' / name}: {n} samples from" in r.output
    plain = invoke("filter", run, "--write-shards", str(tmp_path / "out2"), "--samples-per-shard", "5", "--no-report")
    assert "wrote " + str(tmp_path / "out2") not in plain.output


def test_dedup_quiet_and_verbose(run):
    quiet = invoke("dedup", run, "-q")
    assert quiet.exit_code == 0 and quiet.stdout == ""
    with open(os.path.join(run, "dedup", "summary.json")) as f:
        assert json.load(f)  # written all the same
    normal, verbose = invoke("dedup", run), invoke("dedup", run, "-v")
    assert normal.exit_code == verbose.exit_code == 0
    # 5 black squares (indices 0, 4, 8 of shard 0; 0, 4 of shard 1): one exact group, one survivor
    assert "(survivor)" in verbose.output and "(survivor)" not in normal.output
    assert "seconds: read" in verbose.output and "seconds:" not in normal.output
    group = next(line for line in verbose.output.splitlines() if "largest: group" in line)
    assert "(5 rows, exact)" in group and group.count("/") == 5


def test_sort_shard_quiet_and_verbose(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for key in ("a", "b", "c"):
        for ext in ("jpg", "txt"):
            (src / f"{key}.{ext}").write_bytes(f"{key}.{ext}".encode())
    scattered = str(tmp_path / "scattered.tar")  # tar -cf x.tar *.jpg *.txt: a and b scattered; c's two adjacent
    subprocess.run(["tar", "-cf", scattered, "-C", str(src), "a.jpg", "b.jpg", "c.jpg", "c.txt", "a.txt", "b.txt"],
                   check=True)
    quiet = invoke("sort-shard", scattered, str(tmp_path / "q.tar"), "-q")
    assert quiet.exit_code == 0 and quiet.stdout == "" and os.path.getsize(tmp_path / "q.tar") > 0
    verbose = invoke("sort-shard", scattered, str(tmp_path / "v.tar"), "-v")
    assert verbose.exit_code == 0
    assert "6 member(s) of 3 key(s)" in verbose.output
    assert "2 of 3 key(s) had members scattered through" in verbose.output
    assert (tmp_path / "q.tar").read_bytes() == (tmp_path / "v.tar").read_bytes()


def test_quiet_still_names_shards_left_out(run, tmp_path):
    import shutil
    partial = str(tmp_path / "partial")
    shutil.copytree(run, partial, ignore=shutil.ignore_patterns(".lock", "dedup"))
    os.remove(os.path.join(partial, "done", sorted(os.listdir(os.path.join(partial, "done")))[-1]))
    r = invoke("filter", partial, "--no-report", "-q", "--allow-incomplete")
    assert r.exit_code == 0 and r.stdout == ""
    assert "1 shard(s) of the scoring run" in r.stderr and "left out" in r.stderr
    r = invoke("filter", partial, "--no-report", "-q")  # and without --allow-incomplete it still fails, loudly
    assert r.exit_code == 3 and "--allow-incomplete" in r.stderr
    r = invoke("dedup", partial, "-q")
    assert r.exit_code == 0 and r.stdout == "" and "1 shard(s)" in r.stderr
