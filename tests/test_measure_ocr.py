"""tools/measure_ocr.py's report from its parts (no model runs): a backend's processes at one
quality, on other sets, are merged row by row, and the side-by-side table keeps each quality's own
seconds, peak RSS and load average (docs/ocr.md, "rapidocr against easyocr, side by side")."""
import json

from tools.measure_ocr import main, read_results, side_by_side

BOX = [[0, 0], [50, 0], [50, 10], [0, 10]]  # 500 of a 100x100 frame: 0.05
READ = [("OPEN", 0.9)]


def frame(boxes: int) -> dict:
    return {"frames": [{"size": [100, 100], "polys": [BOX] * boxes, "read": READ * boxes}]}


def part(backend: str, q: str, rows: dict, text: dict, seconds: float, rss_kb: int, load: float) -> dict:
    groups = {}
    for name in rows:
        g = groups.setdefault(name.split("/")[0], [0.0, 0])
        g[0], g[1] = g[0] + seconds / len(rows), g[1] + 1
    return {"backend": backend, "describe": backend, "seen": {q: rows}, "text": text, "timing": groups,
            "load_seconds": 1.0, "peak_rss_kb": rss_kb, "load_avg": [load, load + 1]}


def parts_file(tmp_path):
    text = {"skimage/text": True, "skimage/cat": False, "shard/s0": True, "shard/s1": False}
    lines = []
    for backend, fp, speed, rss in (("rapidocr", 1, 1.0, 600 * 1024), ("easyocr", 0, 10.0, 2000 * 1024)):
        for q, load in (("85", 5.0), ("92", 20.0)):
            # one process per set at the same quality, as two invocations with --sets write them
            lines.append({"backend": backend, "turn": f"skimage@{q}", "observed": part(
                backend, q, {"skimage/text": frame(1), "skimage/cat": frame(fp)}, text, 2 * speed, rss, load)})
            lines.append({"backend": backend, "turn": f"shards@{q}", "observed": part(
                backend, q, {"shard/s0": frame(0), "shard/s1": frame(0)}, text, 4 * speed, rss + 1024, load + 2)})
    path = tmp_path / "parts.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in reversed(lines)))  # easyocr's first
    return str(path)


def test_parts_of_one_quality_merge_and_the_table_is_per_set_and_quality(tmp_path, capsys):
    results = read_results(parts_file(tmp_path))
    assert [r["backend"] for r in results] == ["rapidocr", "easyocr"]  # the default first: the ratios' base
    rapid = results[0]
    assert sorted(rapid["seen"]["85"]) == ["shard/s0", "shard/s1", "skimage/cat", "skimage/text"]  # none lost
    rows = {(r["set"], r["quality"]): r["backends"] for r in side_by_side(results)}
    assert list(rows) == [("skimage", "85"), ("skimage", "92"), ("shards", "85"), ("shards", "92")]
    r, e = rows[("skimage", "92")]
    assert (r["recall"], r["false_positives"], e["false_positives"]) == (1, ["skimage/cat"], [])
    assert (r["s_per_1000"], e["s_per_1000"]) == (1000.0, 10000.0)  # 2 s and 20 s for 2 photos
    assert rows[("shards", "85")][0]["recall"] == 0 and rows[("shards", "85")][1]["s_per_1000"] == 20000.0
    assert r["peak_rss_mib"] == 600 and r["load_avg"] == [20.0, 21.0]  # the skimage@92 process only
    assert rows[("shards", "85")][0]["peak_rss_mib"] == 601 and rows[("shards", "85")][0]["load_avg"] == [7.0, 8.0]
    assert rows[("skimage", "85")][0]["load_avg"] == [5.0, 6.0]
    main(["--from-json", parts_file(tmp_path), "--gates", "default"])
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| skimage | q92")]
    assert table == [("| skimage | q92 | 1/1 | 1/1 (cat) | NO (0.050 <= 0.050) | 1000 | 600 MiB | 1/1 | 0/1 | yes (0.050 > 0.000) | 10000 "
                     "| 2000 MiB | 10.0x | 20-21 |")]
