"""Engines are one registry (score/engines/ENGINES): an engine added there is an engine of
`wdsfilter score --engine` and of run.yaml, with nothing else to change; and score's flags are one
table (score/recipe.FLAGS) that the command line and run.yaml share, so a replay of run.yaml
builds the same configuration."""
from __future__ import annotations

import dataclasses
import os
import sys
import types

import pytest
from click.testing import CliRunner

from scorekit import make_shards
from wdsfilter.cli import main
from wdsfilter.score import SHORTCUTS
from wdsfilter.score.config import ScoreConfig
from wdsfilter.score.engines import ENGINES, Engine
from wdsfilter.score.recipe import CLI_ONLY, FLAGS, OPTIONS, RECIPE_FLAGS, RECIPE_FILE, read_recipe
from wdsfilter.score.runner import Run
from wdsfilter.stream.config import STAGE_OPTIONS

SCORER = "scorekit:BrightnessScorer"


@pytest.fixture
def fake_engine(monkeypatch):
    """A tiny engine of the test's own: a module with run() of the engines' signature, which holds a
    runner.Run (the run folder, its lease, run.json and run.yaml) and scores nothing; registered
    by one line in ENGINES. Returns the configurations it was given, in order."""
    given = []

    def run(shards, cfg, *, echo=None):
        state = Run(shards, cfg, echo, engine="fake")
        given.append(state.cfg)
        state.release_lock()
        return state.summary

    module = types.ModuleType("fake_engine")
    module.run = run
    monkeypatch.setitem(sys.modules, "fake_engine", module)
    monkeypatch.setitem(ENGINES, "fake", Engine("fake_engine:run", "a test's engine"))
    return given


def score(*args):
    return CliRunner().invoke(main, ["score", *args, "-q"])


def test_an_engine_in_the_registry_runs_from_the_command_line_and_from_its_run_yaml(fake_engine, tmp_path,
                                                                                    monkeypatch):
    urls, _ = make_shards(str(tmp_path / "shards"), [2, 3])
    first = str(tmp_path / "first")
    result = score(*urls, "--out", first, "--scorer", SCORER, "--device", "cpu", "--engine", "fake")
    assert result.exit_code == 0, result.output
    assert len(fake_engine) == 1 and fake_engine[0].out == first
    recipe = read_recipe(os.path.join(first, RECIPE_FILE))
    assert recipe["engine"] == "fake" and os.path.exists(os.path.join(first, "run.json"))
    # the replay runs on the recipe's engine, with no --engine given
    replay = score("--config", os.path.join(first, RECIPE_FILE), "--out", str(tmp_path / "again"))
    assert replay.exit_code == 0, replay.output
    assert len(fake_engine) == 2 and dataclasses.replace(fake_engine[1], out=first) == fake_engine[0]
    # an engine that does not join refuses --join; the Ray engine's own flags are its only
    joined = score(*urls, "--out", str(tmp_path / "joined"), "--scorer", SCORER, "--engine", "fake", "--join")
    assert joined.exit_code == 2 and "--engine fake is one driver for the whole run" in joined.output
    ray_flag = score(*urls, "--out", str(tmp_path / "x"), "--engine", "fake", "--ray-actors", "2")
    assert ray_flag.exit_code == 2 and "--ray-actors only apply with --engine ray" in ray_flag.output
    # Out of the registry, it is no engine: neither on the command line nor in a recipe.
    monkeypatch.delitem(ENGINES, "fake")
    unknown = score(*urls, "--out", str(tmp_path / "gone"), "--scorer", SCORER, "--engine", "fake")
    assert unknown.exit_code == 2 and "'fake' is not one of 'local', 'ray'" in unknown.output
    stale = score("--config", os.path.join(first, RECIPE_FILE), "--out", str(tmp_path / "gone"))
    assert stale.exit_code == 2 and "engine must be one of local, ray, got 'fake'" in stale.output
    assert len(fake_engine) == 2


def test_every_score_flag_is_in_the_table_or_declared_elsewhere():
    command = main.commands["score"]
    flags = {p.name for p in command.params}
    stage = {name for _, name, _, _ in STAGE_OPTIONS}
    engine_options = {p for e in ENGINES.values() for p in e.options}
    groups = [set(FLAGS), set(RECIPE_FLAGS), set(CLI_ONLY), stage, engine_options]
    assert set().union(*groups) == flags  # every flag somewhere, and nothing listed that is no flag
    assert sum(map(len, groups)) == len(flags)  # each in one place only
    fields = {f.name for f in dataclasses.fields(ScoreConfig)}
    for flag, key in FLAGS.items():  # a ScoreConfig field (a run.yaml key) or a scorer shortcut
        assert key in SHORTCUTS or key in fields, flag
        assert key in SHORTCUTS or key in ("scorers", "scorer_options") or key in OPTIONS, flag


def test_a_replay_of_run_yaml_builds_the_same_configuration(fake_engine, tiny_clip, tmp_path):
    """Every flag of the table given a value other than its default (and stage and threshold
    flags): the replay's ScoreConfig is the first run's, but for --out."""
    urls, _ = make_shards(str(tmp_path / "shards"), [2])
    models = tmp_path / "ocr-models"
    models.mkdir()
    first = str(tmp_path / "first")
    given = {"scorers": ["--scorer", "clip", "--scorer", "ocr"], "scorer_opts": ["--scorer-opt", "ocr.max_side=640"],
             "model": ["--model", "local-dir:" + tiny_clip], "pretrained": [], "precision": ["--precision", "fp32"],
             "frames": ["--frames", "5"], "frame_reduce": ["--frame-reduce", "max"], "keyframes": ["--keyframes"],
             "ocr_backend": ["--ocr-backend", "easyocr"], "ocr_model_dir": ["--ocr-model-dir", str(models)],
             "ocr_download": ["--no-ocr-download"], "write_shards": ["--write-shards", str(tmp_path / "filtered")],
             "samples_per_shard": ["--samples-per-shard", "3"], "prefix": ["--prefix", "kept-"],
             "save_embeddings": ["--save-embeddings"], "device": ["--device", "cpu"], "gpus": [],
             "decode_device": ["--decode-device", "cpu"], "batch_size": ["--batch-size", "8"],
             "workers": ["--workers", "1"], "replicas": ["--replicas", "1"], "max_memory": ["--max-memory", "4GB"],
             "headroom": ["--headroom", "0.2"], "fit": ["--fit", "clamp"], "fmt": ["--format", "jsonl"]}
    # --pretrained is clip's weights beside a model name (a local-dir: model has its own), --gpus a
    # GPU list: both checked above as shortcuts/fields of the table, not settable on this machine
    assert set(given) == set(FLAGS)
    args = [a for flag in given.values() for a in flag]
    result = score(*urls, "--out", first, *args, "--min", "clip_score=0.1", "--max", "ocr_area=0.5",
                   "--caption-key", "txt;json:caption", "--max-pixels", "4000000", "--engine", "fake")
    assert result.exit_code == 0, result.output
    replay = score("--config", os.path.join(first, RECIPE_FILE), "--out", str(tmp_path / "again"),
                   "--write-shards", str(tmp_path / "filtered2"))
    assert replay.exit_code == 0, replay.output
    cfg, again = fake_engine
    defaults = ScoreConfig(out=first)
    changed = {f.name for f in dataclasses.fields(ScoreConfig) if getattr(cfg, f.name) != getattr(defaults, f.name)}
    assert {"scorers", "scorer_options", "selection", "stage", "device", "decode_device", "batch_size", "workers",
            "replicas", "max_memory", "headroom", "fit", "format", "write_shards", "samples_per_shard", "prefix"} <= changed
    assert cfg.scorer_options["clip"]["frames"] == 5 and cfg.scorer_options["ocr"]["download"] is False
    assert dataclasses.replace(again, out=first, write_shards=cfg.write_shards) == cfg
