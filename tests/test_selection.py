"""One selection type from flag to row (wdsfilter.Selection): every rule `filter` applies (minima,
maxima, top and bottom shares, text columns, dedup, recipes) travels in one object to
thresholds.json, the printed loader call, run.yaml and the report's rule table, and the loader
given `**thresholds` keeps exactly what `filter` counted and wrote.

The agreement test is issue 35's repro on real files: webdataset-written shards of real photos
(scikit-image's) with an exact and a near duplicate, English and German captions, images small,
large and very wide; one real scoring run (hash, brightness and TextShapeScorer's caption/size
columns), `wdsfilter dedup RUN`, then `filter RUN <rules> --write-shards OUT` and
`wdsfilter.loader(shards, scores=RUN, **thresholds)` for every kind of rule. Before the fix,
thresholds.json carried no dedup: the loader gave back the duplicates `--write-shards` left out.
"""
import hashlib
import io
import json
import os
import warnings

import pytest
from click.testing import CliRunner

from scorekit import BrightnessScorer, TextShapeScorer
from wdsfilter.cli import main
from wdsfilter.core.errors import ConfigError
from wdsfilter.runfolder import keep_reason
from wdsfilter.runfolder.tables import read_rows
from wdsfilter.core.selection import Selection, selection_of

pytest.importorskip("imagehash")

CAPTIONS = {"en": "a photo of the {} on the table", "de": "ein Foto der {} auf dem Tisch mit Licht",
            "short": "the {}", "tiny": "a {}"}


def _photo(name, size):
    import skimage.data as data
    from PIL import Image
    img = Image.fromarray(getattr(data, name)()).convert("RGB")
    return img.resize(size, Image.BICUBIC)


def _jpeg(img, quality=90):
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def _samples():
    """(shard, key, jpeg bytes, caption): sizes and captions that DataComp's basic rules judge
    differently, one byte copy and one re-encode (near duplicate) of a photo."""
    photos = [("astronaut", (320, 320), "en"), ("coffee", (400, 300), "en"), ("chelsea", (300, 250), "de"),
              ("rocket", (260, 390), "en"), ("camera", (150, 150), "en"), ("coins", (700, 200), "en"),
              ("horse", (300, 240), "short"), ("clock", (240, 300), "en"), ("moon", (256, 256), "tiny"),
              ("page", (500, 210), "de"), ("immunohistochemistry", (330, 330), "en"), ("retina", (280, 280), "en")]
    out = []
    for i, (name, size, lang) in enumerate(photos):
        data = _jpeg(_photo(name, size))
        out.append((i % 2, f"{i:04d}", data, CAPTIONS[lang].format(name)))
    astronaut = out[0][2]
    out.append((1, "0100", astronaut, "another photo of the astronaut on the table"))  # exact duplicate
    out.append((0, "0101", _jpeg(_photo("coffee", (400, 300)), 60), "the coffee cup on the table again"))  # near
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One scoring run of the shards, deduplicated: (shards, RUN)."""
    import webdataset as wds

    from wdsfilter.score import score
    folder = tmp_path_factory.mktemp("selection")
    shards = [str(folder / f"set-{n:06d}.tar") for n in range(2)]
    writers = [wds.ShardWriter(str(folder / "set-%06d.tar"), maxcount=1000, start_shard=n) for n in range(2)]
    samples = _samples()
    try:
        for n, writer in enumerate(writers):
            for shard, key, data, caption in samples:
                if shard == n:
                    uid = hashlib.md5(key.encode()).hexdigest()  # 128 bits, as DataComp's uids
                    writer.write({"__key__": key, "jpg": data, "json": {"text": caption, "uid": uid}})
    finally:
        for writer in writers:
            writer.close()
    out = str(folder / "run")
    score(shards, out=out, scorers=["hash", BrightnessScorer(), TextShapeScorer()], device="cpu", workers=0,
          progress=False, caption_key="json:text", image_key="jpg")
    result = CliRunner().invoke(main, ["dedup", out, "-q"])
    assert result.exit_code == 0, result.output
    return shards, out


def _rows(out):
    folder = os.path.join(out, "scores")
    return [r for f in sorted(os.listdir(folder)) for r in read_rows(os.path.join(folder, f))]


def _dedup_dropped(out):
    import pyarrow.parquet as pq
    folder = os.path.join(out, "dedup")
    dropped = set()
    for f in os.listdir(folder):
        if f.endswith(".parquet"):
            t = pq.read_table(os.path.join(folder, f)).to_pylist()
            dropped |= {r["key"] for r in t if r["survivor"] is False or r["eval_match"]}
    return dropped


def _share_cut(rows, column, percent, top):
    values = sorted((r[column] for r in rows if r.get(column) is not None), reverse=top)
    return values[int(-(-len(values) * percent // 100)) - 1]  # k = ceil(P% of n), the k-th value


def _expected(rows, out, flags):
    """The kept keys, spelled out here from the rows and the dedup's marks (not by filter's code)."""
    mins, maxes, equal, dedup = {}, {}, {}, False
    words = list(flags)
    while words:
        flag = words.pop(0)
        if flag == "--dedup":
            dedup = True
            continue
        if flag == "--recipe":  # datacomp-basic, as DataComp's load_uids_with_basic_filter_helper reads it
            words.pop(0)
            equal["caption_language"] = "en"
            mins.update(caption_words=3, caption_chars=6, min_side=200)
            maxes.update(aspect_ratio=3.0)
            continue
        column, value = words.pop(0).split("=")
        if flag in ("--top", "--bottom"):
            cut = _share_cut(rows, column, float(value.rstrip("%")), flag == "--top")
            (mins if flag == "--top" else maxes)[column] = cut
        elif flag == "--equal":
            equal[column] = value
        else:
            (mins if flag == "--min" else maxes)[column] = float(value)
    dropped = _dedup_dropped(out) if dedup else set()
    kept = set()
    for r in rows:
        if r["status"] not in ("scored", "partial") or r["key"] in dropped:
            continue
        if all(r.get(c) is not None and r[c] >= v for c, v in mins.items()) \
                and all(r.get(c) is not None and r[c] <= v for c, v in maxes.items()) \
                and all(r.get(c) == v for c, v in equal.items()):
            kept.add(r["key"])
    return kept


def _tar_keys(folder):
    import webdataset as wds
    tars = sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".tar"))
    return [s["__key__"] for s in wds.WebDataset(tars, shardshuffle=False)] if tars else []


RULES = {
    "min": ["--min", "brightness=0.4"],
    "max": ["--max", "brightness=0.6"],
    "top": ["--top", "brightness=50%"],
    "bottom": ["--bottom", "caption_chars=40%"],
    "equal": ["--equal", "caption_language=de"],
    "dedup": ["--dedup"],
    "recipe": ["--recipe", "datacomp-basic"],
    "issue-35": ["--dedup", "--top", "brightness=50%"],  # the repro
    "all": ["--recipe", "datacomp-basic", "--dedup", "--bottom", "brightness=80%"],
}


@pytest.mark.parametrize("name", list(RULES))
def test_loader_filter_count_and_written_shards_agree_for_every_kind_of_rule(run, tmp_path, name):
    import wdsfilter
    shards, out = run
    flags = RULES[name]
    expected = _expected(_rows(out), out, flags)
    written = str(tmp_path / "train")
    result = CliRunner().invoke(main, ["filter", out, *flags, "--write-shards", written, "--samples-per-shard", "5",
                                       "--no-report"])
    assert result.exit_code == 0, result.output
    assert f"all thresholds: {len(expected)} of 14 kept" in result.output
    keys = _tar_keys(written)
    assert sorted(keys) == sorted(expected) and len(keys) == len(set(keys))
    beside = json.load(open(os.path.join(written, "thresholds.json")))
    assert beside == json.load(open(os.path.join(out, "thresholds.json")))  # in the run folder and beside the shards
    assert ("dedup" in beside) == ("--dedup" in flags)
    line = next(ln for ln in result.output.splitlines() if "in training:" in ln)
    assert line.strip() == "in training: " + Selection.from_keywords(**beside).loader_call(out)
    loader = wdsfilter.loader(shards, batch_size=1, output="dict", scores=out, caption_key="json:text",
                              image_key="jpg", **beside)
    got = [s["__key__"] for batch in loader for s in batch]
    assert sorted(got) == sorted(expected)


def test_the_report_lists_every_rule_dedup_included_with_the_loader_call(run, tmp_path):
    shards, out = run
    report = str(tmp_path / "r.html")
    result = CliRunner().invoke(main, ["filter", out, "--recipe", "datacomp-basic", "--dedup", "--report", report])
    assert result.exit_code == 0, result.output
    page = open(report).read()
    for given in ("datacomp-basic: --min min_side=200", "datacomp-basic: --max aspect_ratio=3",
                  "datacomp-basic: --equal caption_language=en", "--dedup"):
        assert given in page
    assert "dedup=True" in page and "wdsfilter.loader(shards" in page


def test_exploring_writes_nothing_in_the_run_folder_unless_asked(run, tmp_path):
    """issue 35 item 14: `filter RUN --top ...` alone writes no file; --save writes thresholds.json
    and filter_report.html there."""
    shards, out = run
    before = {f: os.stat(os.path.join(out, f)).st_mtime_ns for f in os.listdir(out)}
    result = CliRunner().invoke(main, ["filter", out, "--top", "brightness=30%"])
    assert result.exit_code == 0, result.output
    assert {f: os.stat(os.path.join(out, f)).st_mtime_ns for f in os.listdir(out)} == before
    assert "nothing written" in result.output and "--save" in result.output
    saved = CliRunner().invoke(main, ["filter", out, "--top", "brightness=30%", "--save", "--no-report"])
    assert saved.exit_code == 0, saved.output
    thresholds = json.load(open(os.path.join(out, "thresholds.json")))
    assert set(thresholds) == {"min_scores", "max_scores"} and "brightness" in thresholds["min_scores"]


# -- the type itself ---------------------------------------------------------------------------------
def test_flags_keywords_and_files_build_the_same_selection(tmp_path):
    flags = Selection.parse(["clip_score=0.2"], ["ocr_area=0.5"], ["clip_score=30%"], ["x=10%"],
                            ["caption_language=en,de"], dedup=True)
    keywords = Selection.from_keywords(min_clip=0.2, max_ocr_area=0.5, top_shares={"clip_score": "30%"},
                                       bottom_shares={"x": 10}, equal={"caption_language": ["en", "de"]}, dedup=True)
    assert flags == keywords
    assert Selection.from_dict(flags.to_dict(), "run.yaml") == flags
    recipe = tmp_path / "mine.yaml"
    recipe.write_text("# mine\nrecipe: datacomp-basic\nmin:\n  min_side: 300\ntop: {clip_score: 30}\n")
    mine = Selection.parse(recipes=[str(recipe)], maxes=["aspect_ratio=2"])
    assert mine.minima["min_side"] == 300 and mine.maxima["aspect_ratio"] == 2 and mine.top == {"clip_score": 30}
    assert mine.equal == {"caption_language": ("en",)} and mine.minima["caption_words"] == 3
    assert mine.given("min", "caption_words") == "datacomp-basic: --min caption_words=3"
    assert mine.given("max", "aspect_ratio") == "--max aspect_ratio=2"  # the flag replaced the recipe's rule
    assert Selection.from_dict(mine.to_dict(), "x") == mine


def test_old_keyword_names_still_work_with_a_deprecation_warning(tmp_path):
    from wdsfilter.score import build_config
    with pytest.warns(DeprecationWarning, match="top_scores= is deprecated; use top_shares="):
        old = selection_of(None, {"top_scores": {"clip_score": 30}}, "wdsfilter.loader")
    assert old == Selection(top={"clip_score": 30})
    with pytest.warns(DeprecationWarning, match="thresholds= is deprecated; use min_scores="):
        cfg = build_config(str(tmp_path / "o"), ("clip",), thresholds={"clip_score": 0.3})
    assert cfg.selection.minima == {"clip_score": 0.3}
    with pytest.warns(DeprecationWarning, match=r"ScoreConfig.thresholds is deprecated"):
        assert cfg.thresholds == {"clip_score": 0.3}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new names warn about nothing
        new = build_config(str(tmp_path / "o"), ("clip",), min_scores={"clip_score": 0.3}, top_shares={"clip_score": 5})
    assert new.selection == Selection(minima={"clip_score": 0.3}, top={"clip_score": 5})


@pytest.mark.parametrize("build, message", [
    (lambda: Selection.parse(equals=["caption_language"]), "--equal expects COLUMN=VALUE"),
    (lambda: Selection.parse(tops=["clip_score=130%"]), r"share must be in \(0, 100\]"),
    (lambda: Selection.from_keywords(equal={"n": 3}), "compare numbers with min/max"),
    (lambda: Selection.from_dict({"minimum": {"a": 1}}, "r.yaml"), r"r.yaml: unknown rule\(s\) \['minimum'\]"),
    (lambda: Selection.parse(recipes=["no-such-recipe"]), "not a recipe of wdsfilter \\(datacomp-basic"),
    (lambda: selection_of(Selection(), {"min_scores": {"a": 1}}, "filter_scores"), "not both"),
    (lambda: Selection.from_keywords(min_scores={"a": 2}, max_scores={"a": 1}), "no sample can be kept"),
])
def test_bad_rules_are_one_line_config_errors(build, message):
    with pytest.raises(ConfigError, match=message):
        build()


def test_a_text_rule_is_judged_by_the_one_keep_rule():
    rules = Selection(equal={"caption_language": "en"}, minima={"caption_words": 3}).row_rules()
    assert keep_reason({"status": "scored", "caption_language": "en", "caption_words": 3}, rules) is None
    de = keep_reason({"status": "scored", "caption_language": "de", "caption_words": 4}, rules)
    assert de.reason == "caption_language not en" and not de.no_score
    none = keep_reason({"status": "partial", "caption_language": None, "caption_words": 4}, rules)
    assert none.reason == "no caption_language" and none.no_score


def test_a_recipe_on_a_run_without_its_columns_names_the_scorers(run, tmp_path):
    shards, out = run
    from wdsfilter.filtering import filter_scores
    recipe = tmp_path / "clip-basic.yaml"
    recipe.write_text('{"recipe": "datacomp-basic", "scorers": ["clip"], "min": {"clip_score": 0.3}}\n')
    with pytest.raises(ConfigError, match=r"thresholds on clip_score, .* the recipe .*clip-basic.yaml reads the "
                                          r"columns of --scorer clip: score with them"):
        filter_scores(out, recipe=str(recipe), dry_run=True)


# -- DataComp: the basic recipe and the subset file ---------------------------------------------------
def _datacomp_basic_uids(shards):
    """DataComp's load_uids_with_basic_filter_helper (mlfoundations/datacomp baselines/apply_filter.py)
    over the source shards, its pandas code kept: the caption and uid from each .json, the image
    size from the image itself, the language as scorekit's stand-in for fastText says."""
    import numpy as np
    import pandas as pd
    import webdataset as wds
    from PIL import Image
    from scorekit import STOPWORDS
    rows = []
    for s in wds.WebDataset(shards, shardshuffle=False):
        meta = json.loads(s["json"])
        w, h = Image.open(io.BytesIO(s["jpg"])).size
        rows.append({"uid": meta["uid"], "text": meta["text"], "original_width": w, "original_height": h})
    df = pd.DataFrame(rows)

    def language(text):
        hits = {lang: sum(w.lower() in stop for w in text.split()) for lang, stop in STOPWORDS.items()}
        return max(hits, key=hits.get) if any(hits.values()) else "und"
    fasttext_lang_pred = df.text.apply(language)
    caption_num_words = df.text.apply(lambda x: len(x.split()))
    caption_num_chars = df.text.apply(lambda x: len(x))
    uid_int = df.uid.apply(int, base=16)
    uid_upper_uint64 = (uid_int // 2**64).astype("uint64")
    uid_lower_uint64 = (uid_int % 2**64).astype("uint64")
    inds_array = np.array(list(zip(uid_upper_uint64, uid_lower_uint64)), "u8,u8")
    english_mask = fasttext_lang_pred == "en"
    caption_mask = (caption_num_words > 2) & (caption_num_chars > 5)
    min_image_dim = np.minimum(df.original_width, df.original_height)
    max_image_dim = np.maximum(df.original_width, df.original_height)
    aspect_ratio = max_image_dim / min_image_dim
    image_mask = (min_image_dim >= 200) & (aspect_ratio <= 3.0)
    uids = inds_array[english_mask & caption_mask & image_mask]
    uids.sort()  # apply_filter: uids.sort(); np.save(args.save_path, uids)
    return uids


def test_the_datacomp_basic_recipe_exports_the_uids_datacomps_code_selects(run, tmp_path):
    """`filter --recipe datacomp-basic --export-uids` gives, byte for byte as np.save writes it, the
    array DataComp's own basic filter builds over the same samples; its resharder, reading the file
    as it does (np.load, dtype u16, np.searchsorted per sample's .json uid), keeps exactly the
    samples `filter` wrote."""
    import numpy as np
    import webdataset as wds
    shards, out = run
    path = str(tmp_path / "basic.npy")
    r = CliRunner().invoke(main, ["filter", out, "--recipe", "datacomp-basic", "--export-uids", path,
                                  "--write-shards", str(tmp_path / "train"), "--no-report"])
    assert r.exit_code == 0, r.output
    theirs = _datacomp_basic_uids(shards)
    assert 0 < len(theirs) < 14
    ours = np.load(path)
    assert ours.dtype == np.dtype("u8,u8") and ours.shape == theirs.shape and (ours == theirs).all()
    buf = io.BytesIO()
    np.save(buf, theirs)
    assert open(path, "rb").read() == buf.getvalue()
    assert f"uids of the {len(theirs)} kept samples: {path}" in r.output
    # DataComp's resharder (resharder.py load_subset, process_example), reading it back
    u16 = np.dtype("u8,u8")
    with open(path, "rb") as f:
        assert f.read(6) == b"\x93NUMPY"
    subset = np.load(path, mmap_mode="r")
    assert subset.dtype == u16
    resharded = []
    for s in wds.WebDataset(shards, shardshuffle=False):
        key_u16 = np.array([divmod(int(json.loads(s["json"])["uid"], 16), 2**64)], u16)[0]
        if np.searchsorted(subset, key_u16, "right") - np.searchsorted(subset, key_u16, "left") > 0:
            resharded.append(s["__key__"])
    assert sorted(resharded) == sorted(_tar_keys(str(tmp_path / "train")))


def test_export_uids_without_uids_says_so_in_one_line(tmp_path):
    import webdataset as wds

    from wdsfilter.score import score
    from shardkit import image_bytes
    shard = str(tmp_path / "plain-000000.tar")
    with wds.TarWriter(shard) as sink:
        for i in range(3):
            sink.write({"__key__": f"{i:03d}", "jpg": image_bytes(), "txt": f"caption {i}"})
    out = str(tmp_path / "run")
    score([shard], out=out, scorers=[BrightnessScorer()], device="cpu", workers=0, progress=False)
    r = CliRunner().invoke(main, ["filter", out, "--export-uids", str(tmp_path / "u.npy")])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
    assert "has a uid" in r.output and not (tmp_path / "u.npy").exists()
    r = CliRunner().invoke(main, ["filter", out, "--export-uids", str(tmp_path / "u.txt")])
    assert r.exit_code == 2 and "name it FILE.npy" in r.output


def test_the_loader_logs_the_drops_it_was_asked_for_at_info(run, caplog):
    """issue 35 item 13: score rules and dedup are what the user asked for: logged at INFO, once
    per epoch; only problems of the data (a rejected row, a missing score) at WARNING."""
    import logging

    import wdsfilter
    shards, out = run
    with caplog.at_level(logging.INFO, logger="wdsfilter"):
        loader = wdsfilter.loader(shards, batch_size=1, output="dict", scores=out, caption_key="json:text",
                                  image_key="jpg", dedup=True, min_scores={"brightness": 0.4})
        for epoch in range(2):
            loader.set_epoch(epoch)
            assert [s for b in loader for s in b]
    assert set(loader.stats.dropped) == {"filtered_by_score", "duplicate"}
    epochs = [r for r in caplog.records if "finished an epoch" in r.getMessage()]
    assert len(epochs) == 2 and {r.levelno for r in epochs} == {logging.INFO}
