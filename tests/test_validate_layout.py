"""Cross-shard checks, inputs, lightness (no torch, no webdataset) and a crashing worker."""
import multiprocessing
import os
import shutil
import subprocess
import sys
import textwrap
from collections import Counter

import numpy as np
import pytest

from tools import make_sample_shards as mss
from wdsfilter import UnsafeInputError
from wdsfilter.validate import runner, validate
from wdsfilter.validate.checks.layout import readers_without_shard
from wdsfilter.validate.shard_check import check_shard

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARDS = os.path.join(REPO, "sample_shards")
BROKEN = os.path.join(SHARDS, "broken")


def shards(folder, sizes, prefix="part"):
    """Shards of the given sample counts (valid jpg+txt+json samples, keys unique across shards)."""
    rng, urls, key = np.random.default_rng(7), [], 0
    for i, n in enumerate(sizes):
        keys = [f"{key + j:06d}" for j in range(n)]
        key += n
        urls.append(mss.write_tar(os.path.join(folder, f"{prefix}-{i:06d}.tar"),
                                  mss.normal_members(rng, keys, size=(32, 24))))
    return urls


def test_readers_without_shard_matches_webdataset_splitting():
    # split_by_node gives rank r the shards r, r+R, ...; split_by_worker then does the same per worker.
    for n in range(0, 13):
        for ranks in range(1, 5):
            for workers in range(1, 5):
                urls = list(range(n))
                empty = sum(1 for r in range(ranks) for w in range(workers) if not urls[r::ranks][w::workers])
                assert readers_without_shard(n, ranks, workers) == empty, (n, ranks, workers)


def test_too_few_shards_for_ranks_and_workers(tmp_path):
    urls = shards(str(tmp_path), [3, 3, 3])
    report = validate(urls, jobs=1, ranks=2, loader_workers=2)
    (finding,) = report.layout
    assert finding.kind == "too_few_shards" and finding.severity == "error" and report.exit_code == 1
    assert "3 shard(s) for 2 rank(s) x 2 loader worker(s) = 4 readers: 1 reader(s) get no shard" in finding.message
    assert report.to_dict()["layout"]["readers_without_shard"] == 1
    assert validate(urls, jobs=1, ranks=3, loader_workers=1).passed
    assert validate(urls, jobs=1).passed  # no ranks/workers given: nothing to check


def test_uneven_shards_spares_the_last_remainder_shard(tmp_path):
    urls = shards(str(tmp_path), [10, 10, 3, 10, 30, 2])
    report = validate(urls, jobs=1)
    flagged = {os.path.basename(f.shard): f.message for f in report.findings if f.kind == "uneven_shards"}
    assert set(flagged) == {"part-000002.tar", "part-000004.tar"}
    assert "3 samples where the median shard has 10" in flagged["part-000002.tar"]
    assert report.passed  # a warning


def test_key_across_shards_only_between_neighbours_in_one_folder(tmp_path):
    for sub, name in (("a", "split-000000.tar"), ("b", "split-000001.tar")):
        os.makedirs(tmp_path / sub)
        shutil.copy(os.path.join(BROKEN, name), tmp_path / sub / name)
    report = validate([str(tmp_path / "a"), str(tmp_path / "b")], jobs=1)
    kinds = Counter(f.kind for f in report.findings)
    # Not neighbours in one folder: the halves are reported as what they are.
    assert kinds == Counter({"missing_caption": 1, "missing_image": 1})
    together = validate(os.path.join(BROKEN, "split-{000000..000001}.tar"), jobs=1)
    assert Counter(f.kind for f in together.findings) == Counter({"key_across_shards": 1})


def test_inputs_brace_glob_folder_and_compressed(tmp_path):
    urls = shards(str(tmp_path), [2, 2, 2])
    import gzip
    for url, suffix in ((urls[0], ".tar.gz"), (urls[1], ".tgz")):
        with open(url, "rb") as f, gzip.open(url.replace(".tar", suffix), "wb") as g:
            g.write(f.read())
    assert len(validate(str(tmp_path / "part-{000000..000002}.tar"), jobs=1).shards) == 3
    assert len(validate(str(tmp_path / "part-*.tar"), jobs=1).shards) == 3
    compressed = validate([str(tmp_path / "part-000000.tar.gz"), str(tmp_path / "part-000001.tgz")], jobs=1)
    assert [r.samples for r in compressed.shards] == [2, 2] and compressed.passed
    assert len(validate(str(tmp_path), jobs=1).shards) == 5
    with pytest.raises(UnsafeInputError, match="allow_pipe"):
        validate(f"pipe:cat {urls[0]}")
    with pytest.raises(UnsafeInputError, match="allow_remote=False"):
        validate("https://example.com/shard-000000.tar", allow_remote=False)


def test_unreadable_shards(tmp_path):
    (tmp_path / "text-000000.tar").write_text("this is not a tar file\n" * 40)
    (tmp_path / "empty-000000.tar").write_bytes(b"")
    report = validate(str(tmp_path), jobs=1)
    assert Counter(f.kind for f in report.findings) == Counter({"unreadable_tar": 2})
    assert all(r.samples == 0 and r.error for r in report.shards) and report.exit_code == 1


def test_validator_imports_neither_torch_nor_webdataset():
    code = textwrap.dedent(f"""
        import sys
        sys.modules["torch"] = None       # any "import torch" fails, as in a core-only install
        sys.modules["webdataset"] = None
        from wdsfilter.validate import validate
        report = validate({SHARDS!r}, jobs=2)
        from wdsfilter.cli import main
        try:
            main(["validate", {os.path.join(SHARDS, "images-000000.tar")!r}, "-j", "1"])
        except SystemExit as e:
            code = e.code
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "webdataset") and sys.modules[m])
        print(report.samples, report.counts["unsafe_member"], code, heavy)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "207 3 0 []"


def _crash_on_bad(url, options):
    if "bad" in os.path.basename(url):
        os._exit(3)  # what a decoder segfault looks like to the pool
    return check_shard(url, options)


@pytest.mark.skipif(multiprocessing.get_start_method() != "fork", reason="patching the worker needs fork")
def test_a_crashing_worker_loses_only_its_shard(tmp_path, monkeypatch):
    urls = shards(str(tmp_path), [3, 3, 3])
    bad = shutil.copy(urls[1], str(tmp_path / "bad-000000.tar"))
    monkeypatch.setattr(runner, "check_shard", _crash_on_bad)
    report = validate(urls + [bad], jobs=2)
    assert [r.samples for r in report.shards] == [3, 3, 3, 0]
    (finding,) = report.findings
    assert finding.kind == "unreadable_tar" and finding.shard == bad and "killed the checking process" in finding.message


def test_folders_are_searched_recursively_in_order(tmp_path):
    shards(str(tmp_path / "b"), [2], prefix="x")
    shards(str(tmp_path / "a" / "deep"), [2, 2], prefix="y")
    (tmp_path / "a" / "notes.txt").write_text("not a shard")
    report = validate(str(tmp_path), jobs=1)
    assert [os.path.relpath(r.shard, tmp_path) for r in report.shards] == [
        os.path.join("a", "deep", "y-000000.tar"), os.path.join("a", "deep", "y-000001.tar"),
        os.path.join("b", "x-000000.tar")]


def test_pipe_urls_run_only_when_allowed(tmp_path):
    (url,) = shards(str(tmp_path), [3])
    with pytest.raises(UnsafeInputError, match="allow_pipe"):
        validate(f"pipe:cat {url}", jobs=1)
    report = validate(f"pipe:cat {url}", jobs=1, allow_pipe=True)
    assert report.shards[0].shard == f"pipe:cat {url}" and report.shards[0].samples == 3 and report.passed


def _pid_check(url, options):
    result = check_shard(url, options)
    result.suggestion = str(os.getpid())  # a field that travels back: which process checked it
    return result


@pytest.mark.skipif(multiprocessing.get_start_method() != "fork", reason="patching the worker needs fork")
def test_jobs_check_shards_in_worker_processes(tmp_path, monkeypatch):
    urls = shards(str(tmp_path), [2] * 6)
    monkeypatch.setattr(runner, "check_shard", _pid_check)
    pids = {r.suggestion for r in validate(urls, jobs=2).shards}
    assert str(os.getpid()) not in pids and 1 <= len(pids) <= 2
    assert {r.suggestion for r in validate(urls, jobs=1).shards} == {str(os.getpid())}
