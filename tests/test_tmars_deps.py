"""Scorers that build on each other (Scorer.requires, bind, attach): the run adds and orders the
required scorers, and a user's own dependent scorer gets their inputs and outputs for the same
sample in the model worker, on the local engine and on Ray, with no model (the hash scorer)."""
from __future__ import annotations

import hashlib
import os
from typing import Any, Dict, List

import pytest

from scorekit import make_shards
from wdsfilter.core.errors import ConfigError
from wdsfilter.score import build_config, score
from wdsfilter.score.modelrunner import ModelRunner
from wdsfilter.runfolder.tables import read_rows
from wdsfilter.score.scorers.base import Scorer, Upstream
from wdsfilter.score.scorerset import resolve_scorers, with_required

HERE = os.path.dirname(os.path.abspath(__file__))


class CaptionHash(Scorer):
    """A user's scorer that depends on the hash scorer: the caption's length (its own prepare)
    joined to the sha256 the hash scorer wrote for the same sample (its output) and the phash it
    prepared (its input)."""
    name = "caption_hash"
    requires = ("hash",)

    def columns(self) -> List[str]:
        return ["caption_hash"]

    def prepare(self, sample: Dict[str, Any]) -> Any:
        return len(sample["caption"])

    def attach(self, prepared: Any, upstream: Dict[str, Upstream], probe: bool = False) -> Any:
        hashed = upstream["hash"]
        return f"{prepared}:{hashed.output['sha256'][:16]}:{int(hashed.input['phash'])}"

    def load(self, device: str) -> None:
        pass

    def score_batch(self, inputs: List[Any]) -> List[Dict[str, Any]]:
        return [{"caption_hash": x} for x in inputs]


class Circle(CaptionHash):
    name = "circle"
    requires = ("circle2",)


class Circle2(CaptionHash):
    name = "circle2"
    requires = ("circle",)


def test_a_dependent_scorer_brings_and_follows_the_scorers_it_requires():
    assert with_required(("tmars",)) == ("ocr", "clip", "tmars")
    assert with_required(("tmars", "clip")) == ("ocr", "clip", "tmars")
    assert with_required(("hash", "test_tmars_deps:CaptionHash")) == ("hash", "test_tmars_deps:CaptionHash")
    assert with_required(("test_tmars_deps:CaptionHash",)) == ("hash", "test_tmars_deps:CaptionHash")
    # The scorers a shortcut is for are in the run once tmars brings them.
    cfg = build_config("out", ("tmars",), frame_reduce="max", ocr_backend="rapidocr")
    assert cfg.scorers == ("ocr", "clip", "tmars")
    assert cfg.scorer_options["clip"]["frame_reduce"] == cfg.scorer_options["ocr"]["frame_reduce"] == "max"


def test_requirements_that_cannot_be_met_are_configuration_errors():
    with pytest.raises(ConfigError, match="circle"):
        with_required(("test_tmars_deps:Circle", "test_tmars_deps:Circle2"))

    class NeedsMissing(CaptionHash):
        name = "needs"
        requires = ("no_such_scorer",)
    with pytest.raises(ConfigError, match="no_such_scorer"):
        with_required((NeedsMissing(),))
    cfg = build_config("out", ("hash", CaptionHash()))
    assert [s.name for s in resolve_scorers(cfg)] == ["hash", "caption_hash"]


def test_a_sample_its_required_scorer_could_not_score_gets_the_dependents_error_too():
    from wdsfilter.score.scorers.hash import HashScorer
    runner = ModelRunner([HashScorer(), CaptionHash()], "cpu")
    runner.load()
    runner.configure(8)
    items = [("a", {"hash": {"sha256": "ab" * 32, "phash": 7}, "caption_hash": 3}),
             ("b", {"caption_hash": 5})]  # the hash scorer could not prepare sample b
    (ref_a, scores_a, errors_a), (ref_b, scores_b, errors_b) = runner.score(items)
    assert scores_a == {"sha256": "ab" * 32, "phash": "0000000000000007", "caption_hash": "3:" + "ab" * 8 + ":7"} \
        and not errors_a
    assert scores_b == {} and errors_b["caption_hash"][0] == "required_scorer_failed"
    assert "hash" in errors_b["caption_hash"][1]


def _expected(images) -> Dict[str, str]:
    from wdsfilter.media.hashes import phash
    from PIL import Image
    import io
    return {k: hashlib.sha256(v).hexdigest()[:16] + ":" + str(int(phash(Image.open(io.BytesIO(v)).convert("RGB"))))
            for k, v in images.items()}


def test_a_users_dependent_scorer_gets_the_required_outputs_on_the_local_engine(tmp_path):
    urls, images = make_shards(str(tmp_path / "in"), [5, 3])
    out = str(tmp_path / "out")
    score(urls, out, ("test_tmars_deps:CaptionHash",), caption_key="txt", workers=1, progress=False)
    rows = [r for f in sorted(os.listdir(os.path.join(out, "scores")))
            for r in read_rows(os.path.join(out, "scores", f))]
    expected = _expected(images)
    assert len(rows) == 8
    for r in rows:
        n = len(f"sample {int(r['key'].split('_')[1])} of shard {r['key'][1]}")
        assert r["status"] == "scored" and r["caption_hash"] == f"{n}:{expected[r['key']]}"
        assert r["sha256"].startswith(expected[r["key"]][:16])


def test_resume_and_back_off_stay_per_scorer_with_a_dependent(tmp_path):
    urls, images = make_shards(str(tmp_path / "in"), [3, 3])
    out = str(tmp_path / "out")
    opts = dict(caption_key="txt", workers=0, progress=False)
    first = score(urls[:1], out, ("test_tmars_deps:CaptionHash",), **opts)
    assert first.shards_scored == 1
    # The run's identity is the expanded set (hash added): naming it too resumes the same run.
    again = score(urls, out, ("hash", "test_tmars_deps:CaptionHash"), resume=True, **opts)
    assert again.shards_resumed == 1 and again.shards_scored == 1
    with pytest.raises(ConfigError):  # another set of scorers is another run
        score(urls, out, ("hash",), resume=True, **opts)
    from wdsfilter.score.scorers.hash import HashScorer
    runner = ModelRunner([HashScorer(), CaptionHash()], "cpu")
    runner.load()
    runner.configure(8, scorer_batch={"hash": 2, "caption_hash": 4})
    assert {n: b.batch_size for n, b in runner.backoffs.items()} == {"hash": 2, "caption_hash": 4}


@pytest.mark.slow
def test_a_users_dependent_scorer_gets_the_required_outputs_on_ray(tmp_path):
    pytest.importorskip("ray")
    from raykit import local_ray
    from wdsfilter.score.ray_runner import score_on_ray
    urls, images = make_shards(str(tmp_path / "in"), [4, 2])
    with local_ray():
        score_on_ray(urls, out=str(tmp_path / "ray"), scorers=("test_tmars_deps:CaptionHash",), caption_key="txt",
                     progress=False)
    rows = [r for f in sorted(os.listdir(tmp_path / "ray" / "scores"))
            for r in read_rows(str(tmp_path / "ray" / "scores" / f))]
    expected = _expected(images)
    assert len(rows) == 6
    for r in rows:
        n = len(f"sample {int(r['key'].split('_')[1])} of shard {r['key'][1]}")
        assert r["status"] == "scored" and r["caption_hash"] == f"{n}:{expected[r['key']]}"


def test_tmars_keeps_the_reduced_scale_decoding_of_clip_and_ocr(tiny_clip):
    floors = []
    for names in (("ocr", "clip"), ("tmars",)):
        cfg = build_config("out", names, model="local-dir:" + tiny_clip)
        floors.append(cfg.scoring_stage_config(resolve_scorers(cfg)).decode_floor)
    assert floors[0] == floors[1] is not None
