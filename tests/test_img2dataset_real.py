"""img2dataset itself, run against a loopback HTTP server: its shards (one of them empty because
every URL of it fails) and its {shard}_stats.json, then `wdsfilter validate --stats-dir` on its
output folder.

img2dataset 1.47 pins webdataset<0.3 while wdsfilter needs webdataset 1.x, so it cannot live in
wdsfilter's environment: this test runs the `img2dataset` program of another environment, given
by WDSFILTER_IMG2DATASET (path to the executable) or found on PATH, and is skipped without one:

    python -m venv /tmp/i2d && /tmp/i2d/bin/pip install img2dataset
    WDSFILTER_IMG2DATASET=/tmp/i2d/bin/img2dataset pytest tests/test_img2dataset_real.py
"""
import csv
import http.server
import json
import os
import shutil
import subprocess
import threading

import pytest
from click.testing import CliRunner

from tests.shardkit import image_bytes
from wdsfilter.cli import main

IMG2DATASET = os.environ.get("WDSFILTER_IMG2DATASET") or shutil.which("img2dataset")
pytestmark = pytest.mark.skipif(not IMG2DATASET, reason="img2dataset is not installed (see the module docstring)")


def _serve(folder):
    handler = lambda *a, **k: http.server.SimpleHTTPRequestHandler(*a, directory=str(folder), **k)  # noqa: E731
    http.server.SimpleHTTPRequestHandler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_img2dataset_output_folder(tmp_path):
    www = tmp_path / "www"
    www.mkdir()
    for i in range(4):
        (www / f"{i}.png").write_bytes(image_bytes(size=(64, 48), fmt="PNG"))
    server = _serve(www)
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        with open(tmp_path / "urls.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["url", "caption"])
            for i in range(4):  # shard 00000: four images that download
                w.writerow([f"{base}/{i}.png", f"a red square {i}"])
            for i in range(4):  # shard 00001: every URL fails, so img2dataset writes an empty tar
                w.writerow([f"{base}/missing-{i}.png", f"gone {i}"])
        out = tmp_path / "out"
        subprocess.run([IMG2DATASET, "--url_list", str(tmp_path / "urls.csv"), "--input_format", "csv",
                        "--url_col", "url", "--caption_col", "caption", "--output_format", "webdataset",
                        "--output_folder", str(out), "--processes_count", "1", "--thread_count", "2",
                        "--number_sample_per_shard", "4", "--resize_mode", "no", "--enable_wandb", "False",
                        "--retries", "0", "--timeout", "5"],
                       check=True, capture_output=True, timeout=300)
    finally:
        server.shutdown()
    assert {"00000.tar", "00001.tar", "00000_stats.json", "00001_stats.json"} <= set(os.listdir(out))
    theirs = {stem: json.loads((out / f"{stem}_stats.json").read_text()) for stem in ("00000", "00001")}
    assert theirs["00000"]["successes"] == 4 and theirs["00001"]["successes"] == 0
    assert theirs["00001"]["failed_to_download"] == 4 and theirs["00001"]["status_dict"]

    result = CliRunner().invoke(main, ["validate", str(out), "-j", "1", "--stats-dir", str(out)])
    assert result.exit_code == 0, result.output
    assert "empty_shard" in result.output and "all_filtered" not in result.output
    for stem, data in theirs.items():  # never overwritten; ours beside them
        assert json.loads((out / f"{stem}_stats.json").read_text()) == data
        assert json.loads((out / f"{stem}_validate.json").read_text())["tool"] == "wdsfilter validate"
    assert json.loads((out / "sizes.json").read_text()) == {"00000.tar": 4, "00001.tar": 0}
    # The caption only in the json (no caption column) gets the spec that finds it.
    result = CliRunner().invoke(main, ["validate", str(out / "00000.tar"), "-j", "1", "--caption-key", "json:caption"])
    assert result.exit_code == 0, result.output


def test_img2dataset_laion_parquet_webp_extra_columns_and_a_null_caption(tmp_path):
    """A LAION-style parquet (URL, TEXT, uid, similarity, a null column) through img2dataset with
    --encode_format webp, --save_additional_columns and --resize_mode border: .webp members, the
    extra columns in each json, a null TEXT written as an empty .txt. validate, the loader and
    score agree: the sample without a caption is the one dropped."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    import wdsfilter

    www = tmp_path / "www"
    www.mkdir()
    for i in range(5):
        (www / f"{i}.png").write_bytes(image_bytes(size=(64, 48), fmt="PNG"))
    server = _serve(www)
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        (tmp_path / "in").mkdir()
        pq.write_table(pa.table({"URL": [f"{base}/{i}.png" for i in range(5)] + [f"{base}/gone.png"],
                                 "TEXT": [f"a red square {i}" if i != 2 else None for i in range(6)],
                                 "uid": [f"{i:032x}" for i in range(6)], "similarity": [0.3] * 6,
                                 "punsafe": [None] * 6}), tmp_path / "in" / "part.parquet")
        out = tmp_path / "out"
        subprocess.run([IMG2DATASET, "--url_list", str(tmp_path / "in"), "--input_format", "parquet",
                        "--url_col", "URL", "--caption_col", "TEXT", "--save_additional_columns",
                        '["uid","similarity","punsafe"]', "--encode_format", "webp", "--resize_mode", "border",
                        "--image_size", "32", "--output_format", "webdataset", "--output_folder", str(out),
                        "--processes_count", "1", "--thread_count", "2", "--number_sample_per_shard", "10",
                        "--enable_wandb", "False", "--retries", "0", "--timeout", "5"],
                       check=True, capture_output=True, timeout=300)
    finally:
        server.shutdown()
    shard = str(out / "00000.tar")
    from wdsfilter.validate import validate
    report = validate([shard], jobs=1)
    assert report.passed and (report.samples, report.kept) == (5, 4), report.counts
    ld = wdsfilter.loader(shard, batch_size=4, output="dict")
    kept = sorted(s["__key__"] for b in ld for s in b)
    assert len(kept) == 4 and all(s["json"]["uid"] for b in wdsfilter.loader(shard, batch_size=4, output="dict")
                                  for s in b)
    res = CliRunner().invoke(main, ["score", shard, "--scorer", "tools.trace_modules:LumaScorer", "--device", "cpu",
                                    "--workers", "0", "--no-progress", "--out", str(tmp_path / "s"), "--format", "jsonl"])
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in open(tmp_path / "s" / "scores" / "00000.jsonl")]
    assert sorted(r["key"] for r in rows if r["status"] == "scored") == kept
    assert [r["reason"] for r in rows if r["status"] != "scored"] == ["missing_caption"]
