"""`wdsfilter validate`: exit codes, the text/json/junit formats, --output, --stats-dir, progress."""
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter

import pytest
from click.testing import CliRunner

from wdsfilter.cli import main
from wdsfilter.validate.findings import KINDS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARDS = os.path.join(REPO, "sample_shards")
BROKEN = os.path.join(SHARDS, "broken")
CLEAN = os.path.join(SHARDS, "images-{000000..000001}.tar")
WARNINGS_ONLY = os.path.join(BROKEN, "uppercase-ext-000000.tar")  # three mixed_case_extension
BROKEN_ARGS = ["--caption-key", "txt;json:caption", "--image-key", "jpg;png;mp4", "--image-token", "<__dj__image>"]


def run(*args):
    return CliRunner().invoke(main, ["validate", *args, "-j", "1"])


@pytest.mark.parametrize("args, code", [
    ([CLEAN], 0),
    ([BROKEN, *BROKEN_ARGS], 1),
    ([WARNINGS_ONLY], 0),
    ([WARNINGS_ONLY, "--fail-on", "warning"], 1),
    ([os.path.join(SHARDS, "json-captions-000000.tar")], 1),
    ([os.path.join(SHARDS, "json-captions-000000.tar"), "--caption-key", "json:description"], 0),
    ([CLEAN, "--ranks", "2", "--loader-workers", "2"], 1),
])
def test_exit_codes(args, code):
    result = run(*args)
    assert result.exit_code == code, result.output
    assert result.output.rstrip().splitlines()[-1].startswith("PASS" if code == 0 else "FAIL")


@pytest.mark.parametrize("args, message", [
    ([CLEAN, "--caption-key", "json:"], "malformed caption key"),
    ([os.path.join(SHARDS, "nope-000000.tar")], "does not exist"),
    ([f"pipe:cat {CLEAN}"], "refusing"),
    ([CLEAN, "--format", "xml"], "Invalid value for '--format'"),
    ([CLEAN, "--rekey", "middle-dot"], "Invalid value for '--rekey'"),
])
def test_usage_and_configuration_errors_exit_2(args, message):
    result = run(*args)
    assert result.exit_code == 2 and message in result.output


def test_config_file_errors_exit_2(tmp_path):
    (tmp_path / "bad.json").write_text('{"caption_kye": "txt"}')
    result = run(CLEAN, "--config", str(tmp_path / "bad.json"))
    assert result.exit_code == 2 and "unknown option(s) ['caption_kye']" in result.output
    (tmp_path / "good.yaml").write_text("caption_key: json:description\n")
    assert run(os.path.join(SHARDS, "json-captions-000000.tar"), "--config", str(tmp_path / "good.yaml")).exit_code == 0


def test_text_summary_names_kinds_shards_and_suggestion():
    result = run(os.path.join(SHARDS, "json-captions-000000.tar"), os.path.join(BROKEN, "bomb-000000.tar"),
                 os.path.join(SHARDS, "images-000000.tar"))
    out = result.output
    assert out.startswith("wdsfilter validate: 3 shard(s), ") and "69 samples, 36 kept (52.2%)" in out.splitlines()[0]
    assert "Findings by kind" in out and "oversized_image" in out and "all_filtered" in out
    assert "member 001002.png" in out and "25000x25000" in out
    # The one shard with no caption under txt: the fix for it alone, and the fix for the whole set.
    assert "use --caption-key json:description" in out and "use --caption-key 'txt;json:description'" in out
    # Per-shard stats, every shard, those with findings or drops first.
    table = out.split("Shards: 2 with findings or drops, 1 clean (in ")[1].split("\n\n")[0].splitlines()[2:]
    rows = [line.split() for line in table]
    assert [r[0] for r in rows] == ["json-captions-000000.tar", "broken/bomb-000000.tar", "images-000000.tar"]
    assert [r[1:3] for r in rows] == [["32", "0.0%"], ["5", "80.0%"], ["32", "100.0%"]]
    assert [r[4:] for r in rows] == [["1", "32"], ["1", "0"], ["0", "0"]]  # errors, warnings


def test_json_report_schema(tmp_path):
    out = tmp_path / "report.json"
    result = run(BROKEN, *BROKEN_ARGS, "--format", "json", "--output", str(out))
    assert result.exit_code == 1 and result.output.startswith("wdsfilter validate:")  # text summary on stdout
    data = json.loads(out.read_text())
    assert data["schema_version"] == 1 and data["status"] == "fail" and data["exit_code"] == 1
    assert set(data) == {"schema_version", "tool", "wdsfilter_version", "status", "exit_code", "options", "summary",
                         "counts", "dropped", "severities", "suggestions", "layout", "shards", "findings", "omitted"}
    assert set(data["summary"]) == {"shards", "bytes", "members", "samples", "kept", "kept_share", "errors",
                                    "warnings", "seconds", "tolerated"}
    assert data["severities"] == {k: v[0] for k, v in KINDS.items()}
    for f in data["findings"]:
        assert set(f) == {"kind", "severity", "shard", "member", "key", "message"} and f["kind"] in KINDS
    assert Counter(f["kind"] for f in data["findings"]) == Counter(data["counts"]) and not data["omitted"]
    assert data["summary"]["errors"] == sum(n for k, n in data["counts"].items() if KINDS[k][0] == "error")
    shard = next(s for s in data["shards"] if s["shard"].endswith("truncated-000000.tar"))
    assert shard["samples"] == shard["kept"] == 3 and shard["findings"] == {"truncated_tar": 1}
    assert shard["error"].startswith("ReadError")
    assert set(shard) >= {"shard", "bytes", "members", "samples", "kept", "kept_share", "dropped", "findings",
                          "error", "images", "videos"}
    # JSON on stdout when there is no --output.
    assert json.loads(run(CLEAN, "--format", "json").output)["status"] == "pass"


def test_junit_has_one_testcase_per_shard_and_fails_at_the_level(tmp_path):
    out = tmp_path / "junit.xml"
    result = run(BROKEN, *BROKEN_ARGS, "--format", "junit", "--output", str(out), "--quiet")
    assert result.exit_code == 1 and result.output == ""
    suite = ET.parse(out).getroot().find("testsuite")
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    shards = sorted(os.path.join(BROKEN, f) for f in os.listdir(BROKEN) if f.endswith(".tar"))
    assert sorted(cases) == sorted(shards + ["layout (shard count vs ranks x loader workers)"])
    failed = {os.path.basename(n) for n, c in cases.items() if c.find("failure") is not None}
    assert failed == {"bomb-000000.tar", "corrupt-jpeg-000000.tar", "corrupt-video-000000.tar", "split-000001.tar",
                      "truncated-000000.tar", "unsafe-000000.tar"}
    assert int(suite.get("failures")) == len(failed) and int(suite.get("tests")) == len(cases)
    failure = cases[os.path.join(BROKEN, "bomb-000000.tar")].find("failure")
    assert failure.get("type") == "oversized_image" and "001002.png" in failure.text
    props = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert props["caption_key"] == "txt;json:caption" and props["max_side"] == "null" and props["deep"] == "false"
    upper = cases[os.path.join(BROKEN, "uppercase-ext-000000.tar")]
    assert upper.find("failure") is None and "mixed_case_extension" in upper.find("system-out").text
    # --fail-on warning: warnings fail their testcase too.
    result = run(WARNINGS_ONLY, "--format", "junit", "--fail-on", "warning")
    case = ET.fromstring(result.output).find("testsuite").find("testcase")
    assert case.find("failure").get("message") == "mixed_case_extension x3"


def test_stats_dir_writes_shard_stats_and_sizes_json(tmp_path):
    stats = tmp_path / "stats"
    assert run(CLEAN, os.path.join(SHARDS, "ocr-images-000000.tar"), "--stats-dir", str(stats)).exit_code == 0
    assert sorted(os.listdir(stats)) == ["images-000000_stats.json", "images-000001_stats.json",
                                         "ocr-images-000000_stats.json", "sizes.json"]
    sizes = json.loads((stats / "sizes.json").read_text())
    assert sizes == {"images-000000.tar": 32, "images-000001.tar": 32, "ocr-images-000000.tar": 16}
    one = json.loads((stats / "ocr-images-000000_stats.json").read_text())
    assert one["samples"] == one["kept"] == 16 and one["images"]["count"] == 16
    assert one["images"]["min_side"] == 240 and one["images"]["formats"] == {"PNG": 16}
    assert one["successes"] == 16 and one["schema_version"] == 1  # DataComp's resharder reads "successes"


def test_stats_dir_sizes_json_is_what_open_clip_and_datacomp_read(tmp_path):
    """open_clip's get_dataset_size, as it reads sizes.json from the folder of the shards (copied
    here from open_clip_train/data.py so the test needs no open_clip), and DataComp's resharder's
    load_shard_size ({shard}_stats.json -> "successes")."""
    import shutil

    for sub, names in (("a", ["images-000000.tar", "images-000001.tar"]), ("b/c", ["images-000000.tar"])):
        os.makedirs(tmp_path / "shards" / sub)
        for name in names:
            shutil.copy(os.path.join(SHARDS, name), tmp_path / "shards" / sub / name)
    truncated = shutil.copy(os.path.join(BROKEN, "truncated-000000.tar"), tmp_path / "shards" / "b" / "c")
    stats = tmp_path / "stats"
    assert run(str(tmp_path / "shards"), "--stats-dir", str(stats)).exit_code == 1  # the truncated shard
    files = sorted(os.path.relpath(os.path.join(d, f), stats) for d, _, fs in os.walk(stats) for f in fs)
    assert files == ["a/images-000000_stats.json", "a/images-000001_stats.json", "a/sizes.json",
                     "b/c/images-000000_stats.json", "b/c/sizes.json", "b/c/truncated-000000_stats.json"]

    def get_dataset_size(shards_list):  # open_clip_train.data.get_dataset_size, sizes.json branch
        dir_path = os.path.dirname(shards_list[0])
        sizes = json.load(open(os.path.join(dir_path, "sizes.json"), "r"))
        return sum(int(sizes[os.path.basename(shard)]) for shard in shards_list)

    for sub in ("a", "b/c"):
        shutil.copy(stats / sub / "sizes.json", tmp_path / "shards" / sub / "sizes.json")
    assert get_dataset_size([str(tmp_path / "shards" / "a" / f"images-00000{i}.tar") for i in (0, 1)]) == 64
    assert get_dataset_size([str(tmp_path / "shards" / "b" / "c" / "images-000000.tar"), truncated]) == 32 + 3
    stats_file = json.loads((stats / "b" / "c" / "truncated-000000_stats.json").read_text())
    assert int(stats_file["successes"]) == 3 and stats_file["findings"] == {"truncated_tar": 1}


def test_a_shard_given_twice_is_validated_once(tmp_path):
    # The shards' folder and one of its files: before, that shard was read twice, counted twice,
    # listed as two JUnit testcases of one name, and --stats-dir wrote images-000000-2_stats.json,
    # a stats file of no shard, whose samples a `*_stats.json` glob (DataComp) counted again.
    stats, junit = tmp_path / "stats", tmp_path / "junit.xml"
    folder = tmp_path / "shards"
    folder.mkdir()
    for name in ("images-000000.tar", "images-000001.tar"):
        os.link(os.path.join(SHARDS, name), folder / name)
    result = run(str(folder), str(folder / "images-000000.tar"), "--stats-dir", str(stats), "--format", "junit",
                 "--output", str(junit))
    assert result.exit_code == 0, result.output
    assert sorted(os.listdir(stats)) == ["images-000000_stats.json", "images-000001_stats.json", "sizes.json"]
    names = [c.get("name") for c in ET.parse(junit).getroot().iter("testcase")]
    assert len(names) == len(set(names)) == 3
    report = json.loads(run(str(folder / "images-000000.tar"), str(folder), "--format", "json").output)
    assert report["summary"]["samples"] == 64 and len(report["shards"]) == 2


def test_progress_bar_only_when_asked():
    quiet = run(CLEAN)
    assert "shard/s" not in quiet.stderr
    shown = run(CLEAN, "--progress")
    last = shown.stderr.replace("\r", "\n").strip().splitlines()[-1]
    assert "2/2" in last and " shards/s, " in last and " MB/s, " in last and " samples/s" in last


def test_real_subprocess():
    exe = os.path.join(os.path.dirname(sys.executable), "wdsfilter")
    cmd = [exe] if os.path.exists(exe) else [sys.executable, "-m", "wdsfilter"]
    bad = subprocess.run(cmd + ["validate", BROKEN, *BROKEN_ARGS, "--format", "json"], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 1, bad.stderr
    with open(os.path.join(BROKEN, "MANIFEST.json"), encoding="utf-8") as f:
        kinds = [e["kind"] for c in json.load(f)["cases"] for e in c["expect"]]
    assert json.loads(bad.stdout)["summary"]["errors"] == sum(KINDS[k][0] == "error" for k in kinds)
    good = subprocess.run(cmd + ["validate", CLEAN], capture_output=True, text=True, timeout=120)
    assert good.returncode == 0 and "PASS" in good.stdout and good.stderr == ""
    usage = subprocess.run(cmd + ["validate", CLEAN, "--caption-key", ""], capture_output=True, text=True, timeout=120)
    assert usage.returncode == 2 and "empty caption key spec" in usage.stderr


def test_stats_dir_gives_a_shard_whose_command_failed_no_size(tmp_path):
    """sizes.json is what open_clip takes for a shard's size. A pipe: shard whose command failed
    was not read to its end (how many samples came through depends on timing): it gets no entry,
    an old entry of it is removed, and its stats file says complete: false. The same shard read
    whole gets its size."""
    import shutil
    shard = str(tmp_path / "images-000000.tar")
    shutil.copy(os.path.join(SHARDS, "images-000000.tar"), shard)
    stats, flag, fetch = tmp_path / "stats", tmp_path / "broken", tmp_path / "fetch.sh"
    fetch.write_text(f'cat "$1"; test ! -e {flag}\n')  # the whole tar, then an error while `flag` exists
    url = f"pipe:sh {fetch} {shard}"
    assert run(url, "--allow-pipe", "--stats-dir", str(stats), "-j", "1").exit_code == 0
    sizes = json.loads((stats / "sizes.json").read_text())
    assert sizes == {"images-000000.tar": 32}
    flag.touch()
    result = run(url, "--allow-pipe", "--stats-dir", str(stats), "-j", "1")
    assert result.exit_code == 1 and "shard_command_failed" in result.output
    assert json.loads((stats / "sizes.json").read_text()) == {}
    stats_files = [f for f in os.listdir(stats) if f.endswith("_stats.json")]
    assert len(stats_files) == 1
    assert json.loads((stats / stats_files[0]).read_text())["complete"] is False
