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
    result = run(os.path.join(SHARDS, "json-captions-000000.tar"), os.path.join(BROKEN, "bomb-000000.tar"))
    out = result.output
    assert "Findings by kind" in out and "oversized_image" in out and "all_filtered" in out
    assert "member 001002.png" in out and "25000x25000" in out
    assert "use --caption-key json:description" in out
    assert "json-captions-000000.tar" in out.split("Shards with findings or drops")[1]


def test_json_report_schema(tmp_path):
    out = tmp_path / "report.json"
    result = run(BROKEN, *BROKEN_ARGS, "--format", "json", "--output", str(out))
    assert result.exit_code == 1 and result.output.startswith("wdsfilter validate:")  # text summary on stdout
    data = json.loads(out.read_text())
    assert data["schema_version"] == 1 and data["status"] == "fail" and data["exit_code"] == 1
    assert set(data) == {"schema_version", "tool", "wdsfilter_version", "status", "exit_code", "options", "summary",
                         "counts", "dropped", "severities", "suggestions", "layout", "shards", "findings", "omitted"}
    assert set(data["summary"]) == {"shards", "bytes", "members", "samples", "kept", "kept_share", "errors",
                                    "warnings", "seconds"}
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


def test_progress_bar_only_when_asked():
    quiet = run(CLEAN)
    assert "shard/s" not in quiet.stderr
    shown = run(CLEAN, "--progress")
    assert "2/2" in shown.stderr and "MB/s" in shown.stderr and "samples/s" in shown.stderr


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
