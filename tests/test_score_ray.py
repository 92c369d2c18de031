"""Scoring on Ray Data (wdsfilter/score/engines/ray.py), on a local Ray cluster: the same rows,
scores, filtered shards and output folder as the single-machine engine, resumable the same way."""
import os
import re

import pytest

ray = pytest.importorskip("ray", reason="the Ray engine is tested where wdsfilter[ray] is installed")

import wdsfilter  # noqa: E402
from scorekit import FrameCounter  # noqa: E402
from wdsfilter.core.errors import ConfigError  # noqa: E402
from wdsfilter.score import score  # noqa: E402
from wdsfilter.runfolder.tables import read_rows  # noqa: E402
from wdsfilter.score.ray_runner import score_on_ray  # noqa: E402
from wdsfilter.scorefilter import score_filter  # noqa: E402
import raykit  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SS = os.path.join(REPO, "sample_shards")
SHARDS = [os.path.join(SS, p) for p in ("images-000000.tar", "json-captions-000000.tar",
                                        "broken/truncated-000000.tar", "broken/corrupt-jpeg-000000.tar",
                                        "broken/text-only-image-only-000000.tar")]
OPTIONS = dict(caption_key="txt;json:description", min_clip=0.5, progress=False)
# The tests of shard handling (unreadable shards, pipe commands) score with a light test scorer:
# a model actor that imports open_clip and loads CLIP costs several CPU seconds more per run.
LIGHT = dict(caption_key="txt;json:description", scorers=["scorekit:BrightnessScorer"], progress=False)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def local_ray():
    # The test scorers live in tests/: the workers import them from there (as test_score_ray_faults'
    # do); registering the kits for pickling by value instead leaks into every later test of the
    # session (devicekit's SimulatedDevice, rebuilt by value in a worker, lost its registry).
    with raykit.local_ray():
        yield


def rows_by_shard(out):
    folder = os.path.join(out, "scores")
    return {f: read_rows(os.path.join(folder, f)) for f in sorted(os.listdir(folder))}


@pytest.fixture(scope="module")
def engines(local_ray, tiny_clip, tmp_path_factory):
    """The sample shards scored once by each engine, filtered shards written: (folder, local summary,
    Ray summary); folder/"local" and folder/"ray" are the runs, "-kept" their filtered shards. Several
    tests compare with it, instead of each scoring the same shards on Ray again (a run starts its
    model actor, which imports open_clip and loads the model)."""
    folder = tmp_path_factory.mktemp("engines")
    model = "local-dir:" + tiny_clip
    local = score(SHARDS, out=str(folder / "local"), model=model, device="cpu",
                  write_shards=str(folder / "local-kept"), **OPTIONS)
    on_ray = score_on_ray(SHARDS, out=str(folder / "ray"), model=model,
                          write_shards=str(folder / "ray-kept"), batch_size=8, **OPTIONS)
    return folder, local, on_ray


def test_ray_gives_the_engine_rows_scores_and_filtered_shards(engines):
    tmp_path, local, on_ray = engines
    expected, got = rows_by_shard(str(tmp_path / "local")), rows_by_shard(str(tmp_path / "ray"))
    assert sorted(got) == sorted(expected) and len(got) == len(SHARDS)
    for name, rows in expected.items():
        assert [(r["key"], r["status"], r["reason"], r["kept"]) for r in got[name]] == \
               [(r["key"], r["status"], r["reason"], r["kept"]) for r in rows], name
        for a, b in zip(got[name], rows):
            assert (a["clip_score"] is None) == (b["clip_score"] is None)
            if b["clip_score"] is not None:
                assert abs(a["clip_score"] - b["clip_score"]) < 1e-4, (name, a["key"])
    # Rejected and unscorable samples keep their rows and reasons on Ray too.
    statuses = {r["status"] for rows in got.values() for r in rows}
    assert {"scored", "rejected"} <= statuses
    assert on_ray.rows == local.rows and on_ray.kept == local.kept and 0 < on_ray.kept < on_ray.rows
    for name in sorted(os.listdir(tmp_path / "local-kept")):
        assert (tmp_path / "ray-kept" / name).read_bytes() == (tmp_path / "local-kept" / name).read_bytes()
    # The folder is the engine's: the loader filters by it.
    kept_keys = {r["key"] for r in got["images-000000.parquet"] if r["kept"]}
    stream = wdsfilter.sample_pipeline(SHARDS[0], wdsfilter.StageConfig(caption_key="txt"),
                                       extra=[score_filter(str(tmp_path / "ray"), {"clip_score": 0.5})])
    streamed = {s["__key__"] for s in stream}
    assert streamed == kept_keys


@pytest.fixture(scope="module")
def planned_relative(local_ray, tiny_clip, tmp_path_factory):
    """One shard given by a path relative to the working folder, no batch size (so one Ray task
    measures and the planner decides): (the URL given, its run folder, summary, echoed lines)."""
    url, lines = os.path.join("sample_shards", "images-000000.tar"), []
    out = str(tmp_path_factory.mktemp("planned-relative") / "ray")
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        summary = score_on_ray([url], out=out, model="local-dir:" + tiny_clip, echo=lines.append, **OPTIONS)
    finally:
        os.chdir(cwd)
    return url, out, summary, lines


def test_relative_shard_paths_complete_and_their_rows_name_the_url_given(planned_relative):
    # Ray workers open the shard by its absolute path; the rows must still carry the URL the
    # driver was given, or no shard ever completes (every row counted as lost).
    url, out, summary, _ = planned_relative
    assert summary.shards_scored == 1 and summary.shards_failed == [] and summary.rows > 0
    rows = rows_by_shard(out)["images-000000.parquet"]
    assert {r["shard"] for r in rows} == {url}


def test_ray_resume_scores_only_the_unfinished_shards(engines, tiny_clip, tmp_path):
    model, out = "local-dir:" + tiny_clip, str(tmp_path / "ray")
    first = score_on_ray(SHARDS[:2], out=out, model=model, **OPTIONS)
    assert first.shards_scored == 2
    before = rows_by_shard(out)
    second = score_on_ray(SHARDS, out=out, model=model, resume=True, **OPTIONS)
    assert second.shards_resumed == 2 and second.shards_scored == len(SHARDS) - 2
    after = rows_by_shard(out)
    assert all(after[name] == rows for name, rows in before.items())
    folder, _, full = engines  # the same shards scored in one run
    assert after.keys() == rows_by_shard(str(folder / "ray")).keys() and full.rows == second.rows


def test_a_shard_that_cannot_be_opened_is_failed_not_done_and_the_stage_counts_arrive(local_ray, tmp_path):
    import socket
    sock_path = str(tmp_path / "socket-000000.tar")  # exists, but open() fails (ENXIO), even for root
    server = socket.socket(socket.AF_UNIX)
    server.bind(sock_path)
    try:
        out = str(tmp_path / "ray")
        summary = score_on_ray([SHARDS[2], sock_path], out=out, **LIGHT)
        assert summary.shards_scored == 1
        assert [f["url"] for f in summary.shards_failed] == [sock_path]
        assert summary.shards_failed[0]["reason"].startswith("unreadable:")
        assert sorted(os.listdir(os.path.join(out, "done"))) == ["truncated-000000.json"]
        # The truncated shard's stage count comes back from its Ray task.
        assert summary.stage_counts["dropped"].get("truncated_tar") == 1
        again = score_on_ray([SHARDS[2], sock_path], out=out, resume=True, **LIGHT)
        assert again.shards_resumed == 1 and [f["url"] for f in again.shards_failed] == [sock_path]
    finally:
        server.close()


def test_ray_reshards_the_kept_samples_once_at_the_end_as_filter_does(local_ray, tmp_path):
    """--write-shards with --samples-per-shard on Ray: the driver reshards at the end (Run.finish),
    the bytes `filter --write-shards --samples-per-shard --prefix` writes from the same rows."""
    from wdsfilter.filtering import filter_scores
    out, rules = str(tmp_path / "ray"), dict(min_scores={"brightness": 0.2})
    score_on_ray(SHARDS[:2], out=out, write_shards=str(tmp_path / "kept"), samples_per_shard=5, prefix="kept",
                 batch_size=8, **rules, **LIGHT)
    filter_scores(out, write_shards=str(tmp_path / "by-filter"), samples_per_shard=5, prefix="kept", report=None,
                  **rules)

    def files(folder):
        return {n: (tmp_path / folder / n).read_bytes() for n in os.listdir(tmp_path / folder)
                if not n.startswith(".lock")}
    written = files("kept")
    assert "kept-000000.tar" in written and written == files("by-filter")


def test_a_shard_without_captions_after_the_first_is_scored_as_data(local_ray, tiny_clip, tmp_path):
    # Every Ray task reads one shard: none of them may treat its shard as the dataset's first.
    no_captions = os.path.join(SS, "videos-000000.tar")  # no .jpg: every sample misses the image
    summary = score_on_ray([SHARDS[0], no_captions], out=str(tmp_path / "ray"), model="local-dir:" + tiny_clip,
                           **OPTIONS)
    rows = rows_by_shard(str(tmp_path / "ray"))["videos-000000.parquet"]
    assert summary.shards_scored == 2 and {r["status"] for r in rows} == {"rejected"}
    with pytest.raises(ConfigError, match="first shard"):
        score_on_ray([no_captions, SHARDS[0]], out=str(tmp_path / "bad"), model="local-dir:" + tiny_clip, **OPTIONS)


def test_a_pipe_shard_that_fails_when_written_again_is_failed_not_fatal(local_ray, tmp_path):
    # The command prints the shard whenever it is read (key check, reading) and fails only while the
    # filtered shard is written (the writer's local copy `.source.tmp-*` exists then).
    kept = tmp_path / "kept"
    broken = f"pipe:if ls {kept}/.source.tmp-* >/dev/null 2>&1; then exit 1; else cat {SHARDS[0]}; fi"
    summary = score_on_ray([broken, SHARDS[1]], out=str(tmp_path / "ray"), write_shards=str(tmp_path / "kept"),
                           allow_pipe=True, **LIGHT)
    assert [f["url"] for f in summary.shards_failed] == [broken] and summary.shards_scored == 1
    assert "filtered shard not written" in summary.shards_failed[0]["reason"]
    assert sorted(os.listdir(tmp_path / "kept")) == ["json-captions-000000.tar", "json-captions-000000_stats.json",
                                                     "sizes.json"]


def test_a_pipe_shard_whose_command_fails_is_failed_without_a_marker(local_ray, tmp_path):
    broken = f"pipe:cat {SHARDS[0]}; exit 1"  # the whole tar, then an error: not read to its end
    summary = score_on_ray([broken, SHARDS[1]], out=str(tmp_path / "ray"), allow_pipe=True, **LIGHT)
    assert [f["url"] for f in summary.shards_failed] == [broken] and summary.shards_scored == 1
    assert "not read to its end" in summary.shards_failed[0]["reason"]
    assert os.listdir(tmp_path / "ray" / "done") == ["json-captions-000000.json"]
    assert summary.stage_counts["notes"].get("shard_command_failed") == 1


def test_ray_refuses_gpu_actors_on_a_cluster_without_gpus(local_ray, tiny_clip, tmp_path):
    with pytest.raises(ConfigError, match="no GPU"):
        score_on_ray(SHARDS[:1], out=str(tmp_path / "x"), model="local-dir:" + tiny_clip, gpus_per_actor=1,
                     **OPTIONS)


def test_cli_engine_ray_writes_what_the_api_writes(engines, tiny_clip, tmp_path):
    from click.testing import CliRunner
    from wdsfilter.cli import main
    model = "local-dir:" + tiny_clip
    args = ["score", *SHARDS[:3], "--model", model, "--caption-key", OPTIONS["caption_key"], "--min-clip", "0.5",
            "--no-progress", "--no-histograms", "--engine", "ray", "--ray-actors", "1", "--batch-size", "4"]
    result = CliRunner().invoke(main, args + ["--out", str(tmp_path / "cli")])
    assert result.exit_code == 0, result.output
    assert "ray: 3 of 3 shard(s) to score with 1 model actor(s) on cpu" in result.output
    assert "batch 4" in result.output and "clip_score >= 0.5: kept" in result.output
    folder, _, _ = engines  # the API's run of these shards (and two more), batch 8
    cli = rows_by_shard(str(tmp_path / "cli"))
    api = {name: rows for name, rows in rows_by_shard(str(folder / "ray")).items() if name in cli}
    assert sorted(cli) == sorted(os.path.basename(s)[:-4] + ".parquet" for s in SHARDS[:3]) and cli.keys() == api.keys()
    for name in api:  # batches of 4 vs 8: the same rows, scores equal up to float rounding
        assert [dict(r, clip_score=None, clip_score_frames=None) for r in cli[name]] == \
               [dict(r, clip_score=None, clip_score_frames=None) for r in api[name]]
        assert all(abs((a["clip_score"] or 0) - (b["clip_score"] or 0)) < 1e-5 for a, b in zip(cli[name], api[name]))


def test_cli_ray_options_need_engine_ray(tmp_path):
    from click.testing import CliRunner
    from wdsfilter.cli import main
    result = CliRunner().invoke(main, ["score", SHARDS[0], "--out", str(tmp_path / "x"), "--ray-actors", "2"])
    assert result.exit_code == 2 and "only apply with --engine ray" in result.output


def test_prepared_inputs_travel_as_one_tensor_column_not_pickled():
    import numpy as np
    import torch
    from ray.data.block import BlockAccessor

    from wdsfilter.score.payload import EMPTY, PAYLOAD, PAYLOAD_META, pack_payload, unpack_payload
    from wdsfilter.score.scorers.ocr import OcrInput
    clip_image = {"image": torch.randint(0, 255, (3, 224, 224), dtype=torch.uint8),
                  "tokens": torch.arange(77, dtype=torch.int64), "truncated": False,
                  "half": torch.randn(8).to(torch.bfloat16)}  # a dtype numpy lacks: still in the vector
    clip_video = dict(clip_image, image=torch.randint(0, 255, (3, 3, 224, 224), dtype=torch.uint8))
    ocr = OcrInput(frames=np.random.randint(0, 255, (3, 90, 160, 3), dtype=np.uint8), media="video",
                   times=(0.0, 1.0, 2.0), decode_seconds=0.01)
    rows = [({"clip": clip_image, "ocr": ocr}, {}), ({"clip": clip_video}, {"ocr": ("corrupt_video", "x")})]
    packed = [pack_payload(r) for r in rows]
    for (data, meta), (inputs, errors) in zip(packed, rows):
        assert data.dtype == np.uint8 and data.ndim == 1 and len(data) % 64 == 0
        assert len(meta) < 1000  # the structure only: no pixels are pickled
        got_inputs, got_errors = unpack_payload(data, meta)
        assert got_errors == errors
        for name, x in inputs.items():
            y = got_inputs[name]
            if name == "clip":
                assert torch.equal(y["image"], x["image"]) and torch.equal(y["tokens"], x["tokens"])
                assert isinstance(y["image"], torch.Tensor) and y["truncated"] is False
                assert y["half"].dtype == torch.bfloat16 and torch.equal(y["half"], x["half"])
            else:
                assert isinstance(y, OcrInput) and np.array_equal(y.frames, x.frames) and y.times == x.times
                assert y.frames.flags.writeable
    # In Ray's blocks the column is an Arrow tensor column (not Ray's pickled-object fallback),
    # with rows that have nothing to score (an empty vector) beside them.
    block = BlockAccessor.batch_to_block({PAYLOAD: [packed[0][0], EMPTY, packed[1][0]],
                                          PAYLOAD_META: [packed[0][1], b"", packed[1][1]]})
    assert "Tensor" in str(block.schema.field(PAYLOAD).type)
    assert "pickled" not in str(block.schema.field(PAYLOAD).type)


def test_a_batch_size_set_without_a_plan_counts_samples_as_on_the_local_engine():
    """No plan ran (the user set the batch size and the actors): batch_size 4 means 4 samples, so
    with 3-frame videos each scorer's sub-batch is 12 frames, as the local planner makes it from the
    probe's frames per sample (planner.frames_of_samples); before, it was 4 frames."""
    from wdsfilter.score import ScoreConfig
    from wdsfilter.score.payload import PAYLOAD, PAYLOAD_META, pack_payload
    from wdsfilter.score.batches import PENDING, BatchScorer
    from wdsfilter.score.rows import new_row
    scorer = FrameCounter()
    actor = BatchScorer(ScoreConfig(out="unused"), [scorer], ["n_frames"], batch_size=4, device="cpu")
    video = pack_payload(({"frames": {"frames": 3}}, {}))  # (inputs, prepare errors) of a 3-frame video
    rows = [dict(new_row(f"k{i}", "shard.tar", i, PENDING), **dict(zip((PAYLOAD, PAYLOAD_META), video)))
            for i in range(8)]
    out = actor({name: [r[name] for r in rows] for name in rows[0]})
    assert out["status"] == ["scored"] * 8 and out["n_frames"] == ["3"] * 8
    assert actor.runner.backoffs["frames"].planned == 12 and scorer.calls == [12, 12]


def test_ray_uses_the_engines_planner_for_batch_sizes_and_actors_per_gpu(planned_relative):
    from wdsfilter.score import ScoreConfig
    from wdsfilter.score.modelrunner import LoadReport
    from wdsfilter.score.planner import make_plan
    from wdsfilter.score.probe import ProbeReport
    from wdsfilter.score.engines.ray import actor_pool
    GiB, MiB = 2**30, 2**20
    # Actors per GPU are the plan's model processes per GPU: two per GPU where two fit.
    report = LoadReport(device="cuda:0", kind="cuda", total=80 * GiB, free_before=80 * GiB,
                        footprint=500 * MiB, footprints={"clip": 500 * MiB}, overhead=600 * MiB,
                        overhead_estimated=True, rss=3 * GiB, descriptions=["clip"])
    probe = ProbeReport(samples=16, scanned=16, sizes={"clip": (1, 16)}, peaks={"clip": [52 * MiB, 82 * MiB]},
                        prepared_bytes=200_000, prepare_seconds=0.004, seconds_per_sample=0.001)
    host = {"total": 128 * GiB, "available": 100 * GiB, "cpus": 16}
    plan = make_plan(ScoreConfig(out="unused"), [report], probe, host, 100)
    assert plan.devices[0].replicas == 2
    assert actor_pool(8, plan.devices[0].replicas) == (16, 0.5)
    assert actor_pool(8, 2, actors=4) == (4, 0.5) and actor_pool(8, 2, gpus_per_actor=1.0) == (8, 1.0)
    assert actor_pool(0, 1) == (1, 0.0)
    # On this CPU cluster, with no batch size given, one Ray task measures and the planner decides.
    _, _, summary, lines = planned_relative
    text = "\n".join(lines)
    assert "plan:" in text and re.search(r"cpu batch size +\d+", text) and "activations" in text
    planned = summary.plan["devices"][0]
    assert f"batch {planned['batch_size']}" in text and planned["scorer_batch"] == {"clip": planned["batch_size"]}
    assert summary.shards_scored == 1


def test_ray_takes_numpy_scores(local_ray, tmp_path):
    # Scores travel from the actors to the driver as JSON: a scorer returning np.float32 failed
    # every batch ("Object of type float32 is not JSON serializable") and nothing was scored.
    from scorekit import NumpyScorer
    from shardkit import image_text_members, write_shard
    out = tmp_path / "out"
    shard = write_shard(str(tmp_path / "s-000000.tar"), image_text_members(3))
    summary = score_on_ray([shard], out=str(out), scorers=[NumpyScorer()], progress=False)
    assert summary.status == {"scored": 3}
    rows = rows_by_shard(str(out))["s-000000.parquet"]
    assert all(isinstance(r["np_luma"], float) and len(r["np_frames"]) == 2 for r in rows)


def test_no_cluster_at_the_address_is_a_config_error(tmp_path, monkeypatch):
    # `--ray-address auto` with no cluster running ended as 'the run failed: ConnectionError: ...
    # setting `--address` flag' (exit 3, and a flag wdsfilter does not have).
    from scorekit import BrightnessScorer
    from wdsfilter.score.engines import ray as ray_engine

    class NoCluster:
        @staticmethod
        def is_initialized():
            return False

        @staticmethod
        def init(**kwargs):
            raise ConnectionError("Could not find any running Ray instance.")

    monkeypatch.setattr(ray_engine, "_ray", lambda: NoCluster)
    with pytest.raises(ConfigError, match=r"no Ray cluster at address 'auto' \(--ray-address.*ray start --head"):
        score_on_ray([SHARDS[0]], out=str(tmp_path / "out"), scorers=[BrightnessScorer()], address="auto",
                     progress=False)


def test_ray_rows_carry_caption_url_and_uid_as_the_engine_does(local_ray, tmp_path):
    # rows.py builds the text fields for both engines; on Ray they travel read task -> actor -> driver.
    from filterkit import img2dataset_shards
    shards = img2dataset_shards(str(tmp_path), [5, 4], png_every=2)
    options = dict(scorers=["hash"], image_key="jpg;png", progress=False)
    score_on_ray(shards, out=str(tmp_path / "ray"), **options)
    score(shards, out=str(tmp_path / "local"), device="cpu", workers=0, **options)
    ray_rows, local_rows = rows_by_shard(str(tmp_path / "ray")), rows_by_shard(str(tmp_path / "local"))
    text = {f: [(r["key"], r["caption"], r["url"], r["uid"]) for r in rows] for f, rows in ray_rows.items()}
    assert text == {f: [(r["key"], r["caption"], r["url"], r["uid"]) for r in rows] for f, rows in local_rows.items()}
    assert text["00001.parquet"][1] == ("000010001", "photo 1 of shard 1: a café sign",
                                        "https://img.example.com/1/1.png", f"{1:04x}{1:028x}")


def test_ray_retry_failed_finishes_when_samples_keep_failing(local_ray, tmp_path):
    # The bug guard (a scorer that fails on its first 8 samples and scores none) saw only the retried
    # samples on a Ray actor, which never heard of the run's earlier successes: with 9 samples that
    # always fail, --retry-failed on Ray stopped as a bug while the local engine finished.
    from scorekit import BrightnessScorer, make_shards
    from wdsfilter.runfolder.failures import read_entries
    failing = (3, 11, 20, 31, 42, 50, 63, 77, 88)
    make_shards(tmp_path / "shards", [90], refused={0: failing})
    out = str(tmp_path / "out")
    options = dict(scorers=[BrightnessScorer(error_word="refuse-me")], batch_size=16, progress=False)
    first = score_on_ray([str(tmp_path / "shards")], out=out, **options)
    assert first.status == {"scored": 81, "failed": 9}
    retried = score_on_ray([str(tmp_path / "shards")], out=out, retry_failed=True, **options)
    assert retried.retried == {"samples": 9, "scored": 0}
    entries = read_entries(os.path.join(out, "failures.parquet"))
    assert sorted(e["key"] for e in entries) == [f"s0_{i:05d}" for i in failing]
    assert {e["attempts"] for e in entries} == {2}


def test_ray_tracebacks_show_one_line_and_other_loggers_records_stay_whole(caplog):
    # A console handler shared by the root logger and Ray Data's (a user's logging set-up) once
    # shortened wdsfilter's own multi-line epoch summary to its first line: the one-line rule
    # rewrote the record, and every later handler saw the rewritten one.
    import io
    import logging

    import ray.data  # noqa: F401 - sets up Ray Data's loggers (it would drop a handler added before)
    from wdsfilter.score.engines import ray as ray_engine

    stream = io.StringIO()
    shared = logging.StreamHandler(stream)
    ray_logger = logging.getLogger("ray.data")
    ray_logger.addHandler(shared)
    logging.getLogger().addHandler(shared)
    try:
        ray_engine._one_line_errors()
        ray_engine._one_line_errors()  # once: the second call wraps nothing again
        try:
            raise RuntimeError("the node died")
        except RuntimeError:
            ray_logger.error("a batch was lost", exc_info=True)
        with caplog.at_level(logging.WARNING, logger="wdsfilter"):
            logging.getLogger("wdsfilter").warning("finished an epoch:\n%s", "rejected: corrupt_image 1")
    finally:
        ray_logger.removeHandler(shared)
        logging.getLogger().removeHandler(shared)
    printed = stream.getvalue().splitlines()
    assert printed == ["a batch was lost (the whole message: -v)", "finished an epoch:", "rejected: corrupt_image 1"]
    assert [r.getMessage() for r in caplog.records if r.name == "wdsfilter"] == \
        ["finished an epoch:\nrejected: corrupt_image 1"]
