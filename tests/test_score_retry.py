"""`wdsfilter score --retry-failed` (retry_failed= in Python): the samples the failure ledger lists
as transient are scored again, and only they; their rows replace the failed ones in place (same
score file, same row order); data errors are retried only with `all`; the ledger counts attempts;
embeddings, score files and filtered shards agree row for row afterwards."""
import os

import numpy as np
import pytest
from click.testing import CliRunner

from faultkit import FlakyClip, FlakyScorer
from scorekit import expected_brightness, make_shards
from wdsfilter.cli import main
from wdsfilter.score import score
from wdsfilter.score.ledger import read_entries
from wdsfilter.runfolder.tables import read_rows


def rows_of(out):
    folder = os.path.join(out, "scores")
    return {f: read_rows(os.path.join(folder, f)) for f in sorted(os.listdir(folder))}


def ledger(out):
    return {e["key"]: e for e in read_entries(os.path.join(out, "failures.parquet"))}


def logged(path):
    with open(path) as f:
        return f.read().split()


@pytest.fixture
def faults(tmp_path):
    """Shards with data errors (a refused caption, a corrupt JPEG, a missing caption) and files that
    switch on transient faults for chosen keys; (urls, images, scorer factory, fault files, log)."""
    urls, images = make_shards(tmp_path / "shards", [10, 7, 12], refused={0: (3,)}, bad={1: (2,)},
                               no_caption={1: (5,)})
    files = {k: tmp_path / k for k in ("raise", "oom", "prep")}
    files["raise"].write_text("s0_00004 s2_00007\n")  # score_batch raises: a scorer exception
    files["oom"].write_text("s1_00001\n")  # out of memory even alone: past the back-off's floor
    files["prep"].write_text("s2_00000 s2_00003\n")  # prepare() raises in the decode worker
    log = tmp_path / "scored.log"

    def scorer():
        return FlakyScorer(raise_file=str(files["raise"]), oom_file=str(files["oom"]), prepare_file=str(files["prep"]),
                           fail_word="refuse-me", log=str(log))
    return urls, images, scorer, files, log


def run(urls, out, scorer, **kw):
    kw.setdefault("device", "cpu")
    kw.setdefault("progress", False)
    kw.setdefault("workers", 1)
    kw.setdefault("batch_size", 4)
    return score(urls, out=str(out), scorers=[scorer()], **kw)


TRANSIENT = {"s0_00004": "score_error", "s2_00007": "score_error", "s1_00001": "out_of_memory",
             "s2_00000": "prepare_error", "s2_00003": "prepare_error"}
DATA = {"s0_00003": "caption_refused", "s1_00002": "corrupt_image", "s1_00005": "missing_caption"}


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_retry_failed_scores_only_the_transient_failures_and_puts_them_in_place(faults, tmp_path, fmt):
    urls, images, scorer, files, log = faults
    out = tmp_path / "out"
    run(urls, out, scorer, format=fmt)
    first = rows_of(out)
    assert {k: e["reason"] for k, e in ledger(out).items()} == {**TRANSIENT, **DATA}
    assert all(ledger(out)[k]["transient"] for k in TRANSIENT) and not any(ledger(out)[k]["transient"] for k in DATA)
    for f in files.values():  # the faults pass
        f.write_text("")
    log.write_text("")
    summary = run(urls, out, scorer, retry_failed=True, format=fmt)
    assert set(logged(log)) == set(TRANSIENT)  # only they were read on and scored again (the probe's included)
    assert summary.retried == {"samples": 5, "scored": 5}
    after = rows_of(out)
    assert sorted(after) == sorted(first)
    for name, rows in after.items():
        assert [r["key"] for r in rows] == [r["key"] for r in first[name]]  # same rows, same order
        assert [r["index"] for r in rows] == list(range(len(rows)))
        for old, new in zip(first[name], rows):
            if old["key"] in TRANSIENT:
                assert new["status"] == "scored" and new["reason"] is None
                assert new["brightness"] == pytest.approx(expected_brightness(images[new["key"]]), abs=1e-5)
            else:
                assert new == old  # untouched
    # the ledger keeps the data errors, each tried once
    assert {k: (e["reason"], e["attempts"]) for k, e in ledger(out).items()} == {k: (r, 1) for k, r in DATA.items()}


def test_a_sample_that_fails_again_stays_listed_with_its_attempts(faults, tmp_path):
    urls, images, scorer, files, log = faults
    out = tmp_path / "out"
    run(urls, out, scorer)
    files["raise"].write_text("s0_00004\n")  # still broken; the others pass
    files["oom"].write_text("")
    files["prep"].write_text("")
    summary = run(urls, out, scorer, retry_failed=True)
    assert summary.retried == {"samples": 5, "scored": 4}
    entries = ledger(out)
    assert entries["s0_00004"]["attempts"] == 2 and entries["s0_00004"]["reason"] == "score_error"
    summary = run(urls, out, scorer, retry_failed="transient")
    assert ledger(out)["s0_00004"]["attempts"] == 3 and summary.retried == {"samples": 1, "scored": 0}
    files["raise"].write_text("")
    run(urls, out, scorer, retry_failed=True)
    assert set(ledger(out)) == set(DATA)


def test_retry_failed_all_tries_data_errors_too(faults, tmp_path):
    urls, images, scorer, files, log = faults
    out = tmp_path / "out"
    run(urls, out, scorer)
    for f in files.values():
        f.write_text("")
    log.write_text("")
    summary = run(urls, out, scorer, retry_failed="all")
    # the data errors fail the same way again (the JPEG is still corrupt), now tried twice
    assert {k: (e["reason"], e["attempts"]) for k, e in ledger(out).items()} == {k: (r, 2) for k, r in DATA.items()}
    assert summary.retried == {"samples": 8, "scored": 5}
    assert set(logged(log)) == set(TRANSIENT)  # the rejected and refused ones never reached the model


def test_the_command_line_and_its_refusals(faults, tmp_path):
    urls, images, scorer, files, log = faults
    out = tmp_path / "out"
    cli = CliRunner()
    empty = cli.invoke(main, ["score", *urls, "--out", str(tmp_path / "nothing"), "--scorer", "faultkit:FlakyScorer",
                              "--device", "cpu", "--no-progress", "--retry-failed"])
    assert empty.exit_code == 2 and "holds no scoring run" in empty.output
    both = cli.invoke(main, ["score", *urls, "--out", str(out), "--overwrite", "--retry-failed=all"])
    assert both.exit_code == 2 and "exclude each other" in both.output
    run(urls, out, scorer)
    for f in files.values():
        f.write_text("")
    r = cli.invoke(main, ["score", *urls, "--out", str(out), "--scorer", "faultkit:FlakyScorer", "--device", "cpu",
                          "--no-progress", "--workers", "0", "--batch-size", "4",
                          "--scorer-opt", f"bright.raise_file={files['raise']}",
                          "--scorer-opt", f"bright.oom_file={files['oom']}",
                          "--scorer-opt", f"bright.prepare_file={files['prep']}",
                          "--scorer-opt", "bright.fail_word=refuse-me", "--scorer-opt", f"bright.log={log}",
                          "--retry-failed"])
    # the first run was given the scorer as an object: its identity is the same class and options
    assert r.exit_code == 0, r.output
    assert "retried 5 failed sample(s): 5 now scored" in r.output
    assert set(ledger(out)) == set(DATA)


@pytest.mark.slow
def test_retry_keeps_embeddings_score_files_and_filtered_shards_row_for_row(tiny_clip, tmp_path):
    urls, _ = make_shards(tmp_path / "shards", [9, 8], bad={1: (2,)})
    prep = tmp_path / "prep"
    model = "local-dir:" + tiny_clip

    def clip(out, **kw):
        scorer = FlakyClip(model=model, prepare_file=str(prep), save_embeddings=True)  # --save-embeddings
        return score(urls, out=str(out), scorers=[scorer], device="cpu", progress=False, workers=0, batch_size=4,
                     min_clip=-1.0,
                     write_shards=str(out) + "-kept", **kw)
    prep.write_text("")
    clip(tmp_path / "clean")  # a run without the faults, one shot
    prep.write_text("s0_00001 s0_00006 s1_00004\n")
    out = tmp_path / "out"
    clip(out)
    assert set(ledger(out)) == {"s0_00001", "s0_00006", "s1_00004", "s1_00002"}
    prep.write_text("")
    clip(out, retry_failed=True)
    assert set(ledger(out)) == {"s1_00002"}  # the corrupt JPEG
    got, clean = rows_of(out), rows_of(tmp_path / "clean")
    assert [[(r["key"], r["status"], r["kept"]) for r in rows] for rows in got.values()] == \
           [[(r["key"], r["status"], r["kept"]) for r in rows] for rows in clean.values()]
    emb = os.path.join(out, "embeddings")
    import pyarrow.parquet as pq
    for name, rows in got.items():
        stem = name[:-len(".parquet")]
        for a, b in zip(rows, clean[name]):
            assert (a["clip_score"] is None) == (b["clip_score"] is None)
            if a["clip_score"] is not None:
                assert a["clip_score"] == pytest.approx(b["clip_score"], abs=1e-5)
        meta = pq.read_table(os.path.join(emb, "metadata", stem + ".parquet")).to_pylist()
        img = np.load(os.path.join(emb, "img_emb", stem + ".npy")).astype(np.float32)
        txt = np.load(os.path.join(emb, "text_emb", stem + ".npy")).astype(np.float32)
        scored = [r for r in rows if r["clip_score"] is not None]
        assert [(m["key"], m["index"]) for m in meta] == [(r["key"], r["index"]) for r in scored]
        assert np.allclose((img * txt).sum(1), [r["clip_score"] for r in scored], atol=3e-3)
        # the filtered shard: the kept samples, byte for byte the clean run's
        kept = os.path.join(str(out) + "-kept", stem + ".tar")
        assert open(kept, "rb").read() == open(os.path.join(str(tmp_path / "clean") + "-kept", stem + ".tar"),
                                               "rb").read()


def test_a_key_that_returns_later_in_the_shard_gets_each_row_back_at_its_place(tmp_path):
    from shardkit import image_bytes, write_shard
    dark, light = image_bytes(color=(10, 10, 10)), image_bytes(color=(240, 240, 240))
    # k1 comes back after more keys than the reader's grouping window holds: a second sample
    between = [m for i in range(2, 12) for m in ((f"k{i}.jpg", image_bytes()), (f"k{i}.txt", f"caption {i}"))]
    url = write_shard(str(tmp_path / "s.tar"), [("k0.jpg", image_bytes()), ("k0.txt", "zero"),
                                                ("k1.jpg", dark), ("k1.txt", "one"), *between,
                                                ("k1.jpg", light), ("k1.txt", "one again")])
    broken = tmp_path / "raise"
    broken.write_text("k1\n")
    out = tmp_path / "out"

    def scorer():
        return FlakyScorer(raise_file=str(broken))
    run([url], out, scorer, workers=0)
    assert [(e["key"], e["index"]) for e in read_entries(str(out / "failures.parquet"))] == [("k1", 1), ("k1", 12)]
    broken.write_text("")
    run([url], out, scorer, workers=0, retry_failed=True)
    rows = read_rows(str(out / "scores" / "s.parquet"))
    assert [r["key"] for r in rows] == ["k0", "k1", *[f"k{i}" for i in range(2, 12)], "k1"]
    assert {r["status"] for r in rows} == {"scored"}
    assert rows[1]["brightness"] == pytest.approx(expected_brightness(dark), abs=1e-5)
    assert rows[12]["brightness"] == pytest.approx(expected_brightness(light), abs=1e-5)


def test_retry_failed_finishes_when_samples_keep_failing(tmp_path):
    """A scorer that always fails on 9 of 90 samples: each --retry-failed sees only failing samples,
    more than the bug guard's 8 (a scorer that fails on its first 8 samples and scores none is
    a bug). The run's earlier successes count: it runs, exits 0, and each retried sample's
    attempts grow by one."""
    failing = (3, 11, 20, 31, 42, 50, 63, 77, 88)
    make_shards(tmp_path / "shards", [90], refused={0: failing})
    out = str(tmp_path / "out")
    args = ["score", str(tmp_path / "shards"), "--scorer", "scorekit:BrightnessScorer", "--scorer-opt",
            "bright.error_word=refuse-me", "--out", out, "--device", "cpu", "--workers", "0", "--no-progress"]
    assert CliRunner().invoke(main, args).exit_code == 0
    keys = {f"s0_{i:05d}" for i in failing}
    assert {k: (e["reason"], e["attempts"]) for k, e in ledger(out).items()} == {k: ("score_error", 1) for k in keys}
    for attempt in (2, 3):
        r = CliRunner().invoke(main, args + ["--retry-failed"])
        assert r.exit_code == 0, r.output
        assert "retried 9 failed sample(s): 0 now scored" in r.output, r.output
        assert {k: (e["reason"], e["attempts"]) for k, e in ledger(out).items()} == \
            {k: ("score_error", attempt) for k in keys}
    rows = read_rows(os.path.join(out, "scores", "shard-0000.parquet"))
    assert sum(r["status"] == "scored" for r in rows) == 81 and len(rows) == 90
