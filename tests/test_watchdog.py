"""The starvation watchdog: an error within the bound, never a hang — also with resampled
(infinite) shard lists and inside DataLoader worker processes."""
import subprocess
import sys
import textwrap

import pytest

from shardkit import image_text_members, write_shard
from wdsfilter import StageConfig, StarvationError
from wdsfilter.stream.pipeline import sample_pipeline


@pytest.fixture
def captionless_shards(tmp_path):
    # Images whose captions are under a field the config does not name: everything is filtered.
    return [write_shard(tmp_path / f"s{i}.tar", image_text_members(40, start=100 * i, text_ext="caption"))
            for i in range(3)]


def test_all_filtered_raises_after_n_samples_naming_the_stage(captionless_shards):
    cfg = StageConfig(check_first_shard=False, starvation_samples=50, starvation_seconds=0)
    with pytest.raises(StarvationError) as err:
        list(sample_pipeline(captionless_shards, cfg))
    msg = str(err.value)
    assert "50 samples read" in msg and "none came out" in msg
    assert "Stage 'select' rejected 50 of them: missing_caption" in msg


def test_finite_stream_that_yields_nothing_raises_at_its_end(captionless_shards):
    cfg = StageConfig(check_first_shard=False, starvation_samples=10_000, starvation_seconds=0)
    with pytest.raises(StarvationError, match="120 samples read"):
        list(sample_pipeline(captionless_shards, cfg))


def test_first_shard_check_is_the_earlier_clearer_error(captionless_shards):
    from wdsfilter import ConfigError
    with pytest.raises(ConfigError, match="use --caption-key caption"):
        list(sample_pipeline(captionless_shards, StageConfig()))


def test_some_output_disarms_the_watchdog(tmp_path):
    good = write_shard(tmp_path / "good.tar", image_text_members(2))
    bad = write_shard(tmp_path / "bad.tar", image_text_members(60, text_ext="caption"))
    cfg = StageConfig(check_first_shard=False, starvation_samples=20)
    assert len(list(sample_pipeline([good, bad], cfg))) == 2


def _run_child(code: str, timeout: float = 120):
    """Run in a child process so a regression (a hang) fails the test instead of blocking CI."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout)


def test_resampled_infinite_stream_raises_instead_of_hanging(captionless_shards):
    proc = _run_child(f"""
        from wdsfilter import StageConfig, StarvationError
        from wdsfilter.stream.pipeline import sample_pipeline
        cfg = StageConfig(check_first_shard=False, starvation_samples=500, starvation_seconds=0)
        try:
            for _ in sample_pipeline({captionless_shards!r}, cfg, resampled=True):
                pass
        except StarvationError as e:
            print("RAISED", e.args[0].splitlines()[0])
    """)
    assert "500 samples read" in proc.stdout and "RAISED" in proc.stdout, proc.stderr


def test_time_bound_with_resampling(captionless_shards):
    proc = _run_child(f"""
        import time
        from wdsfilter import StageConfig, StarvationError
        from wdsfilter.stream.pipeline import sample_pipeline
        cfg = StageConfig(check_first_shard=False, starvation_samples=0, starvation_seconds=1.0)
        t = time.monotonic()
        try:
            for _ in sample_pipeline({captionless_shards!r}, cfg, resampled=True):
                pass
        except StarvationError as e:
            print("RAISED after", round(time.monotonic() - t, 1), "s")
    """)
    assert "RAISED after" in proc.stdout, proc.stderr


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_watchdog_inside_dataloader_workers(captionless_shards, context):
    proc = _run_child(f"""
        import wdsfilter
        if __name__ == "__main__":
            loader = wdsfilter.loader({captionless_shards!r}, batch_size=4, num_workers=2, resampled=True,
                                      check_first_shard=False, starvation_samples=100, starvation_seconds=0,
                                      multiprocessing_context={context!r})
            try:
                next(iter(loader))
            except Exception as e:
                print("RAISED", type(e).__name__, "|", str(e).replace(chr(10), " "))
    """, timeout=240)
    assert "RAISED" in proc.stdout, proc.stderr
    assert "100 samples read" in proc.stdout and "missing_caption" in proc.stdout


def test_a_watched_stream_left_open_at_exit_prints_nothing(tmp_path):
    # A training script that stops iterating leaves the watch generator open; the interpreter
    # closes it at exit, after `open` is gone: its last tally write must not print a traceback
    # ("Exception ignored in: <generator object _watch> ... NameError: name 'open'").
    script = textwrap.dedent(f"""
        from wdsfilter.stream.stages import _watch
        from wdsfilter.core.tally import StatsSink, Tally
        sink = StatsSink({str(tmp_path)!r})
        streams = [_watch(iter([{{"__key__": "a"}}, {{"__key__": "b"}}]), Tally(), sink=sink) for _ in range(20)]
        for stream in streams:
            next(stream)
        class Holder:
            pass
        Holder.streams = streams
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
