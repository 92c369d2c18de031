"""Shared fixtures. `tiny_clip`: a tiny open_clip model trained on the sample shards, built once;
`web`: our fault-injecting web server (remotekit.FaultServer) for one test."""
import fcntl
import hashlib
import os
import shutil
import signal
import sys

import pytest

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")  # no traffic beyond loopback
# A suite started in the background by a shell without job control (`cmd &` in a script) inherits
# SIGINT ignored, and so would every command a test starts: the tests that press Ctrl-C then wait
# for ever. Ctrl-C is put back for the suite's processes (their commands get the default again).
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:  # `tools` must import under plain `pytest` too, not only `python -m pytest`
    sys.path.insert(0, REPO)

# The README's model (tools/make_tiny_clip.py's defaults): enough steps that matched captions
# clearly outscore mismatched ones (tests/test_clip_scorer.py): at 100 steps the mean gap was
# 0.95-0.97 and a matched pair beat a mismatched one in 96-99% of pairs over seeds 0-2 (the tests
# ask for > 0.05 and an AUC >= 0.8); 400 steps gave 1.03 and 100%. One thread: the model is too
# small to gain from two, and torch's threads spin-wait when the cores are busy (parallel CI
# jobs): with two threads on a loaded 2-core machine a step took ten times the CPU time of one.
from tools.make_tiny_clip import DEFAULT_STEPS as TINY_CLIP_STEPS  # noqa: E402
from tools.make_tiny_clip import DEFAULT_THREADS as TINY_CLIP_THREADS  # noqa: E402


def _digest(paths) -> str:
    h = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()[:12]


@pytest.fixture
def web():
    """A FaultServer on 127.0.0.1 for one test, fsspec's cached http filesystem cleared before and
    after (it would keep the last test's objects' sizes and ETags). The test module skips itself
    without fsspec and aiohttp (pytest.importorskip)."""
    from remotekit import FaultServer, clear_http_cache
    clear_http_cache()
    with FaultServer() as server:
        yield server
    clear_http_cache()


@pytest.fixture(scope="session")
def tiny_clip(tmp_path_factory) -> str:
    """Folder of a tiny open_clip model in open_clip's local-dir layout (use "local-dir:" + path),
    trained by tools/make_tiny_clip.py on the sample shards with a fixed number of steps and seed.
    Training takes a while on a CPU, so the folder is cached in models/.cache/ (gitignored), keyed
    by the tool's source and the shards' content: a run pays once, later runs reuse it."""
    from tools import make_tiny_clip as tool

    shards = tool.find_shards(tool.DEFAULT_SHARDS)
    key = f"{tool.source_hash()}-{_digest(shards)}-{TINY_CLIP_STEPS}"  # threads change rounding only
    # WDSFILTER_TEST_CACHE lets several checkouts (worktrees) share one build.
    cache = os.environ.get("WDSFILTER_TEST_CACHE") or os.path.join(REPO, "models", ".cache")
    try:
        os.makedirs(cache, exist_ok=True)
    except OSError:
        pass
    if not os.access(cache, os.W_OK):
        cache = str(tmp_path_factory.mktemp("tiny-clip"))
    out = os.path.join(cache, "tiny-clip-" + key)
    # One build at a time per key: pytest runs started together (several checkouts, xdist) wait
    # for the first builder instead of each training its own copy on the same cores.
    with open(out + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.isfile(os.path.join(out, tool.WEIGHTS_FILE)):
            shutil.rmtree(out, ignore_errors=True)  # a folder without weights is left from an older layout
            tool.build(out, shards, steps=TINY_CLIP_STEPS, threads=TINY_CLIP_THREADS, quiet=True, replace=False)
    return out


# `slow` means: the test trains or runs a real model (the tiny CLIP model, the OCR detectors,
# training steps), starts Ray, or took more than about ten seconds in `--durations` on a loaded
# 2-core machine (SLOW_TESTS: model worker processes, signals and kills, spawned workers, fuzzing).
# `pytest -m "not slow"` is the quick subset (the goal: under 5 minutes on 2 cores): stages, loader
# plumbing, validator, engine with toy scorers, CLI errors. Tests that use the tiny CLIP model are
# marked here, so a new one cannot forget it; the other slow files mark themselves.
SLOW_FIXTURES = ("tiny_clip",)
SLOW_TESTS = {
    "test_ocr_download.py": ["test_the_engine_downloads_once_before_its_model_workers_start",
                             "test_processes_that_fetch_at_once_download_once"],
    "test_score_resume.py": ["test_a_run_stopped_by_a_signal_leaves_no_model_worker_behind_and_resumes",
                             "test_a_run_killed_with_sigkill_resumes_to_the_same_outputs"],
    "test_fuzz.py": ["test_mutated_shards_never_crash_or_hang"],
    "test_score_faults.py": ["test_a_scorer_that_cannot_load_fails_the_run_in_one_line",
                             "test_a_sticky_error_in_a_model_worker_process_is_fatal_for_the_run",
                             "test_a_second_run_on_the_same_out_refuses_while_the_first_lives_and_takes_over_after_a_kill",
                             "test_a_decode_worker_killed_mid_shard_fails_the_run_in_one_line_and_resume_completes_it",
                             "test_the_lock_is_free_as_soon_as_a_killed_run_is_gone_though_its_decode_workers_live"],
    "test_score_api.py": ["test_a_script_without_the_main_guard_gets_a_clear_error"],
    "test_realworld_writers.py": ["test_ray_write_webdataset_output_passes_and_is_sized"],
    "test_score_engine.py": ["test_model_workers_in_separate_processes_give_the_same_tables"],
    "test_score_transport.py": ["test_numpy_frames_score_the_same_through_model_worker_processes",
                                "test_a_run_with_model_workers_sends_no_pixels_and_leaks_no_shared_memory",
                                "test_a_packed_chunk_crosses_a_process_boundary",
                                "test_a_model_worker_maps_the_decode_workers_buffer"],
    "test_validate_bench.py": ["test_bench_validate_smoke"],
    "test_sample_shards.py": ["test_regenerating_reproduces_every_committed_file"],
    "test_score_backoff.py": ["test_back_off_in_model_worker_processes"],
    "test_loader.py": ["test_token_config_and_size_guard_survive_spawn_workers",
                       "test_drop_last_with_fewer_samples_than_a_batch_raises_instead_of_an_empty_epoch"],
    "test_loader_openclip.py": ["test_open_clip_train_one_epoch_through_wdsfilter_loader"],
    "test_light_core.py": ["test_scoring_without_its_extra_is_a_configuration_error_naming_the_install"],
    "test_hostile_members.py": ["test_a_caption_of_one_long_word_is_tokenized_at_once_and_short_ones_exactly",
                                "test_member_names_longer_than_path_max_are_a_damaged_tar_not_a_memory_bomb"],
    "test_score_planner.py": ["test_two_model_processes_on_a_simulated_gpu_with_room_and_one_on_a_gpu_without"],
    "test_hostile_input.py": ["test_peak_memory_of_one_worker_on_a_hostile_shard_stays_bounded"],
    "test_validate.py": ["test_parallel_and_serial_runs_agree"],
    "test_exit_codes.py": ["test_score_exit_codes_real_processes"],
    "test_realworld_videos.py": ["test_video2dataset_audio_tracks_are_not_videos_and_the_front_doors_agree"],
    "test_stages.py": ["test_a_pipe_shard_left_mid_way_is_not_counted_as_a_failed_command"],
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        slow_here = SLOW_TESTS.get(os.path.basename(str(item.fspath)), ())
        if any(name in SLOW_FIXTURES for name in getattr(item, "fixturenames", ())) or \
                getattr(item, "originalname", item.name) in slow_here:
            item.add_marker(pytest.mark.slow)
