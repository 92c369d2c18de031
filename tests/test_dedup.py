"""`wdsfilter dedup RUN_DIR`: exact, near and semantic groups of a real scoring run over real
photos (scikit-image's) with planted duplicates, one survivor per group, eval matches, errors."""
import json
import os

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from dedupkit import NEAR, build, dedup_of_another_file, jpeg, _photo, variant
from filterkit import score_folder
from wdsfilter.cli import main
from wdsfilter.dedup import dedup
from wdsfilter.dedup.hashindex import near_pairs
from wdsfilter.runfolder.tables import read_rows


def score_hash(shards, out, *args):
    r = CliRunner().invoke(main, ["score", *shards, "--out", str(out), "--scorer", "hash", "--device", "cpu",
                                  "--no-progress", "--workers", "0", "--image-key", "jpg;png", *args])
    assert r.exit_code == 0, r.output
    return str(out)


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """(run folder, truth {key: (photo, variant)}, shards): every variant, one hash-only scoring run."""
    folder = tmp_path_factory.mktemp("photos")
    shards, truth = build(folder / "shards")
    return score_hash(shards, folder / "run"), truth, shards


def marks(run):
    """{key: row of RUN/dedup/<shard>.parquet}."""
    out = {}
    for f in sorted(os.listdir(os.path.join(run, "dedup"))):
        if f.endswith(".parquet"):
            for row in pq.read_table(os.path.join(run, "dedup", f)).to_pylist():
                out[row["key"]] = dict(row, shard=f[:-8])
    return out


def test_planted_duplicates_are_grouped_and_distinct_photos_are_not(photos, tmp_path):
    run, truth, _ = photos
    result = dedup(run)
    assert result.kinds == ["exact", "near"] and result.rows == len(truth)
    got = marks(run)
    originals = {name: key for key, (name, kind) in truth.items() if kind == "original"}
    same = lambda a, b: got[a]["group"] is not None and got[a]["group"] == got[b]["group"]  # noqa: E731
    for key, (name, kind) in truth.items():
        if kind == "copy":  # byte copies in other shards: exact
            assert same(key, originals[name]) and got[key]["kind"] == "exact" == got[originals[name]]["kind"]
    near = [(originals[n], k) for k, (n, v) in truth.items() if v in NEAR]
    recall = np.mean([same(a, b) for a, b in near])
    assert recall >= 0.95, recall
    # Distinct photos (textures, star-field regions, faces; the stereo pair is counted apart, as
    # docs/dedup.md says) share no group.
    distinct = [k for k, (n, v) in truth.items() if v == "original" and not n.startswith("motorcycle")]
    groups = [got[k]["group"] for k in distinct if got[k]["group"] is not None]
    assert len(groups) == len(set(groups))
    # Mirrored copies are not near duplicates of their photo (phash is not mirror-invariant).
    assert not any(same(originals[n], k) for k, (n, v) in truth.items() if v == "mirror")
    # One survivor per group; without CLIP scores the first row by shard and index.
    by_group = {}
    for row in got.values():
        if row["group"] is not None:
            by_group.setdefault(row["group"], []).append(row)
    assert len(by_group) == result.groups
    for rows in by_group.values():
        assert sum(r["survivor"] for r in rows) == 1
        first = min(rows, key=lambda r: (r["shard"], r["index"]))
        assert first["survivor"]
    assert result.duplicates == sum(len(r) - 1 for r in by_group.values())
    summary = json.load(open(os.path.join(run, "dedup", "summary.json")))
    assert summary["largest"][0]["size"] == max(len(r) for r in by_group.values())
    assert all(m["key"] in got for m in summary["largest"][0]["members"])


def test_result_does_not_depend_on_shard_order(photos, tmp_path):
    run, truth, shards = photos
    dedup(run)
    again = score_hash(list(reversed(shards)), tmp_path / "reversed")
    dedup(again)
    assert marks(run) == marks(again)


def test_near_bits_is_settable(photos):
    run, truth, _ = photos
    none = dedup(run, kinds=["near"], near_bits=0)  # identical phashes only
    wide = dedup(run, kinds=["near"], near_bits=12)
    assert none.duplicates < wide.duplicates


def test_near_index_finds_what_brute_force_finds():
    # Clustered hashes (many within a few bits of each other), every k: the index is exact.
    rng = np.random.default_rng(1)
    centres = rng.integers(-2**63, 2**63 - 1, 50, dtype=np.int64).view(np.uint64)
    flips = [sum(1 << int(b) for b in rng.choice(64, rng.integers(0, 12), replace=False)) for _ in range(1500)]
    values = (centres[rng.integers(0, 50, 1500)] ^ np.array(flips, dtype=np.uint64)).view(np.int64)
    for k in (0, 2, 5, 8, 11):
        a, b = near_pairs(values, np.arange(len(values)), k)
        d = np.bitwise_count(values.view(np.uint64)[:, None] ^ values.view(np.uint64)[None, :]) <= k
        from scipy.sparse.csgraph import connected_components
        truth = connected_components(d, directed=False)[1]
        graph = np.zeros_like(d)
        graph[a, b] = True
        got = connected_components(graph, directed=False)[1]
        # the same partition
        assert len(set(zip(truth, got))) == len(set(truth)) == len(set(got)), k


def test_eval_matches_are_marked(photos, tmp_path):
    run, truth, _ = photos
    evals = tmp_path / "eval"
    evals.mkdir()
    coffee, rocket = _photo("coffee"), _photo("rocket")
    (evals / "coffee.jpg").write_bytes(jpeg(coffee))                      # the very bytes of the original
    (evals / "rocket-small.jpg").write_bytes(variant(rocket, b"", "resize_50")[0])   # a resized copy
    (evals / "gravel.png").write_bytes(variant(_photo("grass").rotate(90), b"", "png")[0])  # nothing like it
    (evals / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a jpeg")
    result = dedup(run, evals=[str(evals)])
    assert result.eval_images == 3 and len(result.eval_unreadable) == 1 and "broken.jpg" in result.eval_unreadable[0]
    got = marks(run)
    for key, (name, kind) in truth.items():
        match = got[key]["eval_match"]
        if name == "coffee" and kind in ("original", "copy"):
            assert match == "exact:coffee.jpg", (key, kind)
        elif name == "coffee" and kind in NEAR:
            assert match == "near:coffee.jpg", (key, kind)
        elif name == "rocket" and kind == "resize_50":  # the run's variant has the eval file's very bytes
            assert match == "exact:rocket-small.jpg", (key, kind)
        elif name == "rocket" and kind in ("original", "copy") + NEAR:
            assert match == "near:rocket-small.jpg", (key, kind)
        elif name not in ("coffee", "rocket"):
            assert match is None, (key, name, kind)
    # report.html: the largest groups and the eval matches as thumbnails read from the shards.
    report = open(os.path.join(run, "dedup", "report.html")).read()
    summary = json.load(open(os.path.join(run, "dedup", "summary.json")))
    shown = sum(len(g["members"]) for g in summary["largest"]) + sum(1 for r in got.values() if r["eval_match"])
    assert report.count("data:image/jpeg;base64,") == shown and "exact:coffee.jpg" in report
    assert "near:rocket-small.jpg" in report and "no preview" not in report


def test_a_run_without_hashes_is_a_one_line_error(tmp_path):
    shards, _ = build(tmp_path / "shards", bases=("coffee",), variants=("copy",), alikes=[])
    run = score_folder(shards, tmp_path / "run", image_key="jpg;png")
    for args, hint in ((["--kind", "near"], "--scorer hash"),
                       (["--kind", "semantic", "--semantic-threshold", "0.99"], "--save-embeddings"),
                       (["--kind", "semantic"], "--kind semantic needs --semantic-threshold COSINE"),
                       ([], "--scorer hash")):
        r = CliRunner().invoke(main, ["dedup", run, *args])
        assert r.exit_code == 2, r.output
        assert hint in r.output and len(r.output.strip().splitlines()) == 1, r.output
    r = CliRunner().invoke(main, ["dedup", str(tmp_path / "nothing")])
    assert r.exit_code == 2 and "does not exist" in r.output


@pytest.mark.slow
def test_clip_score_picks_the_survivor_and_semantic_groups(tiny_clip, tmp_path):
    shards, truth = build(tmp_path / "shards", bases=("astronaut", "coffee"), variants=("copy", "jpeg_q30"),
                          alikes=["grass"])
    run = score_hash(shards, tmp_path / "run", "--scorer", "clip", "--model", "local-dir:" + tiny_clip,
                     "--save-embeddings")
    rows = {r["key"]: r for f in sorted(os.listdir(os.path.join(run, "scores")))
            for r in read_rows(os.path.join(run, "scores", f))}
    r = CliRunner().invoke(main, ["dedup", run])  # exact and near: semantic dedup is asked for
    assert r.exit_code == 0 and "kinds: exact, near" in r.output, r.output
    r = CliRunner().invoke(main, ["dedup", run, "--kind", "exact", "--kind", "near", "--kind", "semantic",
                                  "--semantic-threshold", "0.95"])
    assert r.exit_code == 0, r.output
    assert "semantic" in r.output
    summary = json.load(open(os.path.join(run, "dedup", "summary.json")))
    for g in summary["largest"]:  # each member's distance to its survivor, for the report's cards
        for m in g["members"]:
            assert m["bits"] <= 64 and -1 <= m["cosine"] <= 1.0001 and (not m["survivor"] or m["cosine"] > 0.999)
    # ... shown on each duplicate's card of filter's report: its phash bits and cosine to the survivor
    import html
    page = tmp_path / "filter.html"
    r = CliRunner().invoke(main, ["filter", run, "--dedup", "--report", str(page)])
    assert r.exit_code == 0, r.output
    shown = html.unescape(page.read_text())
    duplicates = [m for g in summary["largest"] for m in g["members"] if not m["survivor"]]
    assert duplicates
    for m in duplicates:
        assert f"{m['bits']} bit{'s' * (m['bits'] != 1)}, cosine {m['cosine']:.3f} from the survivor" in shown, m
    got = marks(run)
    by_group = {}
    for key, row in got.items():
        if row["group"] is not None:
            by_group.setdefault(row["group"], []).append(key)
    assert by_group
    for keys in by_group.values():
        best = max(keys, key=lambda k: (rows[k]["clip_score"], -ord(got[k]["shard"][-1]), -got[k]["index"]))
        assert got[best]["survivor"] and sum(got[k]["survivor"] for k in keys) == 1
    # A byte copy's embedding is its original's: a semantic pair too.
    result = dedup(run, kinds=["semantic"], semantic_threshold=0.999)
    assert result.per_kind["semantic"] >= 2


def test_filter_and_loader_keep_the_same_survivors(photos, tmp_path):
    run, truth, shards = photos
    evals = tmp_path / "eval"
    evals.mkdir()
    (evals / "clock.jpg").write_bytes(jpeg(_photo("clock")))
    result = dedup(run, evals=[str(evals)])
    got = marks(run)
    keep = {k for k, r in got.items() if r["survivor"] and not r["eval_match"]}
    assert len(keep) == len(truth) - result.duplicates - sum(1 for r in got.values() if r["eval_match"] and r["survivor"])
    r = CliRunner().invoke(main, ["filter", run, "--dedup", "--write-shards", str(tmp_path / "kept"), "--no-report"])
    assert r.exit_code == 0, r.output
    line = next(x for x in r.output.splitlines() if x.strip().startswith("dedup"))
    assert f"{len(keep)} of {len(truth)} kept" in line, r.output
    import tarfile
    written = {m.name.split(".")[0] for f in sorted(os.listdir(tmp_path / "kept")) if f.endswith(".tar")
               for m in tarfile.open(tmp_path / "kept" / f)}
    assert written == keep
    # Combined with a threshold: both rules count, the kept rows are those passing both.
    hashes = {x["key"]: x["phash"] for x in read_all(run)}
    chosen = sorted({hashes[k] for k in keep})[::2]  # a text rule: half of the survivors' phashes
    r = CliRunner().invoke(main, ["filter", run, "--dedup", "--equal", "phash=" + ",".join(chosen), "--dry-run"])
    assert r.exit_code == 0, r.output
    both = {k for k in keep if hashes[k] in chosen}
    assert f"all thresholds: {len(both)} of {len(truth)} kept" in r.output, r.output
    # The loader applies the same rule at training time.
    import wdsfilter
    loader = wdsfilter.loader(shards, scores=run, dedup=True, batch_size=1, output="dict", image_key="jpg;png",
                              num_workers=0, epoch_samples=None)
    seen = {s["__key__"] for batch in loader for s in batch}
    assert seen == keep
    dropped = loader.stats.dropped
    assert dropped["duplicate"] + dropped["eval_match"] == len(truth) - len(keep) and dropped["eval_match"] >= 1


def read_all(run):
    return [r for f in sorted(os.listdir(os.path.join(run, "scores"))) for r in read_rows(os.path.join(run, "scores", f))]


def test_filter_refuses_a_dedup_older_than_the_scores(tmp_path):
    shards, _ = build(tmp_path / "shards", bases=("coffee",), variants=("copy",), alikes=[])
    run = score_hash(shards, tmp_path / "run")
    r = CliRunner().invoke(main, ["filter", run, "--dedup"])
    assert r.exit_code == 2 and "wdsfilter dedup" in r.output, r.output
    dedup(run)
    score_file = os.path.join(run, "scores", sorted(os.listdir(os.path.join(run, "scores")))[0])
    os.utime(score_file, ns=(1, 1))  # touched, the same bytes: still the file the dedup read
    assert CliRunner().invoke(main, ["filter", run, "--dedup"]).exit_code == 0
    dedup_of_another_file(run)  # as after a re-scored shard: the dedup read another file
    r = CliRunner().invoke(main, ["filter", run, "--dedup"])
    assert r.exit_code != 0 and "older than the score files" in r.output, r.output


def test_a_resumed_run_dedups_as_a_whole_one(photos, tmp_path):
    run, truth, shards = photos
    partial = tmp_path / "resumed"
    score_hash(shards[:1], partial)
    score_hash(shards, partial, "--resume")
    dedup(run)
    dedup(str(partial))
    assert marks(run) == marks(str(partial))


@pytest.mark.slow
def test_eval_images_match_semantically_with_the_runs_clip(tiny_clip, tmp_path):
    shards, truth = build(tmp_path / "shards", bases=("astronaut",), variants=(), alikes=["grass", "coins"])
    run = score_hash(shards, tmp_path / "run", "--scorer", "clip", "--model", "local-dir:" + tiny_clip,
                     "--save-embeddings")
    evals = tmp_path / "eval"
    evals.mkdir()
    # A mirrored astronaut: not the bytes, not within the near distance (phash is not mirror
    # invariant), but the tiny CLIP embeds it very close to the astronaut.
    from PIL import ImageOps
    (evals / "mirrored.png").write_bytes(variant(ImageOps.mirror(_photo("astronaut")), b"", "png")[0])
    exact_near = dedup(run, kinds=["exact", "near"], evals=[str(evals)])
    assert not exact_near.eval_matches
    result = dedup(run, kinds=["exact", "near", "semantic"], semantic_threshold=0.95,
                   evals=[str(evals)])  # cosine 0.983 to the astronaut, <= 0.92 to the others
    got = marks(run)
    matched = {truth[k] for k, r in got.items() if r["eval_match"]}
    assert matched == {("astronaut", "original")} and result.eval_matches == {"semantic": 1}
    assert all(got[k]["eval_match"] in (None, "semantic:mirrored.png") for k in got)


def test_groups_per_kind_add_up_to_the_total_and_a_group_names_every_kind_of_its_rows(photos):
    """Each group is counted once, under the kinds of its rows (each row's closest link): a photo's
    group with its byte copy and its re-encodes is exact+near, never just "exact"; the printed
    counts add up to the printed total, and the rows per kind to the rows in groups."""
    import re
    run, truth, _ = photos
    r = CliRunner().invoke(main, ["dedup", run])
    assert r.exit_code == 0, r.output
    m = re.search(r"(\d+) duplicate group\(s\), by the kinds of their rows: (.*)", r.output)
    counts = {k: int(n) for n, k in re.findall(r"(\d+) ([a-z+]+)", m.group(2))}
    assert sum(counts.values()) == int(m.group(1)) > 0
    m = re.search(r"(\d+) row\(s\) in groups, by their closest link: (.*)", r.output)
    rows_per_kind = {k: int(n) for n, k in re.findall(r"(\d+) ([a-z]+)", m.group(2))}
    got = marks(run)
    by_group = {}
    for key, row in got.items():
        if row["group"] is not None:
            by_group.setdefault(row["group"], []).append(key)
    assert sum(rows_per_kind.values()) == int(m.group(1)) == sum(len(k) for k in by_group.values())
    # The expected kind of each group from the planted truth: "exact" when it holds a photo's
    # original and its byte copy, "near" when it holds anything else (re-encodes, resizes, crops,
    # the stereo pair).
    expected = {}
    for g, keys in by_group.items():
        variants = {truth[k][1] for k in keys}
        byte_copies = {"original", "copy"} if {"original", "copy"} <= variants else set()
        expected[g] = "+".join(k for k, present in (("exact", byte_copies), ("near", variants - byte_copies))
                               if present)
    assert "exact+near" in expected.values() and "near" in expected.values()
    assert counts == {k: list(expected.values()).count(k) for k in set(expected.values())}
    summary = json.load(open(os.path.join(run, "dedup", "summary.json")))
    assert summary["per_kind"] == counts and summary["rows_per_kind"] == rows_per_kind
    assert all(g["kind"] == expected[g["group"]] for g in summary["largest"])
    assert sum(rows_per_kind.values()) == sum(1 for r in got.values() if r["group"] is not None)
    assert rows_per_kind == {k: sum(1 for r in got.values() if r["kind"] == k) for k in rows_per_kind}
