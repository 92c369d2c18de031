"""tools/bench_validate.py runs end to end with tiny sizes and reports sane numbers (no timing
assertions: the machine is shared)."""
from tools import bench_validate


def test_bench_validate_smoke():
    lines = []
    result = bench_validate.bench(shards=2, copies=1, runs=1, jobs=2, memory_shards=(1, 3), memory_copies=1,
                                  out=lines.append)
    assert result["samples"] == 2 * 64 and result["mb"] > 0 and result["jobs"] == 2
    for name in ("file", "tar", "validate"):
        assert result[name]["seconds"] > 0 and result[name]["mb_s"] > 0 and result[name]["samples_s"] > 0
    assert result["ratio_file"] > 0 and result["ratio_tar"] > 0
    assert [m["shards"] for m in result["memory"]] == [1, 3] and [m["samples"] for m in result["memory"]] == [64, 192]
    one, three = result["memory"]
    assert one["passed"] and three["passed"] and 10 < one["parent_mb"] < 2000 and 10 < three["parent_mb"] < 2000
    assert one["worker_mb"] == 0 and 0 < three["worker_mb"] < 2000  # one shard is checked in the process itself
    text = "\n".join(lines)
    assert "raw read (file blocks" in text and "raw read (tarfile members" in text and "validate (--jobs 2)" in text
    assert "ratio validate/raw:" in text and "peak memory" in text and "128 samples" in text


def test_bench_validate_upscale_makes_bigger_files():
    small = sum(len(d) for _, d in bench_validate.sample_members(1))
    big = sum(len(d) for _, d in bench_validate.sample_members(2))
    assert big > 1.5 * small
