"""Every JSON the validator writes conforms to its schema (wdsfilter/validate/schema.py, no unknown
field allowed), and docs/validate.md documents every field, kind and broken case."""
import json
import os
import re
import subprocess
import sys

import pytest

from wdsfilter.validate import schema, validate
from wdsfilter.validate.findings import KINDS
from wdsfilter.validate.stats_files import write_stats

jsonschema = pytest.importorskip("jsonschema")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARDS = os.path.join(REPO, "sample_shards")
BROKEN = os.path.join(SHARDS, "broken")
DOCS = os.path.join(REPO, "docs", "validate.md")


def check(instance, which):
    jsonschema.Draft202012Validator.check_schema(which)
    jsonschema.Draft202012Validator(which).validate(instance)


@pytest.mark.parametrize("paths, options", [
    ([BROKEN], dict(caption_key="txt;json:caption", image_key="jpg;png;mp4", image_token="<__dj__image>")),
    ([SHARDS], dict(ranks=4, loader_workers=8, min_side=100, max_aspect=2.0, deep=True)),
    ([os.path.join(SHARDS, "videos-000000.tar")], dict(image_key="mp4", fail_on="warning")),
    ([os.path.join(SHARDS, "json-captions-000000.tar")], {}),
])
def test_reports_and_stats_files_conform(tmp_path, paths, options):
    report = validate(paths, jobs=1, **options)
    data = json.loads(json.dumps(report.to_dict()))  # what --format json writes
    check(data, schema.REPORT)
    written = write_stats(report, str(tmp_path))
    for path in written:
        with open(path, encoding="utf-8") as f:
            check(json.load(f), schema.SIZES_FILE if path.endswith("sizes.json") else schema.STATS_FILE)


def test_an_unknown_field_fails_the_schema():
    data = validate(os.path.join(SHARDS, "images-000000.tar"), jobs=1).to_dict()
    data["summary"]["new_field"] = 1
    with pytest.raises(jsonschema.ValidationError):
        check(data, schema.REPORT)


def test_schema_module_prints_the_schemas():
    out = subprocess.run([sys.executable, "-m", "wdsfilter.validate.schema"], capture_output=True, text=True,
                         check=True, cwd=REPO).stdout
    assert json.loads(out)["title"] == "wdsfilter validate report"


def _documented_names(text):
    return set(re.findall(r"`([a-z_0-9]+)`", text))


def test_docs_describe_every_field_kind_and_broken_case():
    with open(DOCS, encoding="utf-8") as f:
        text = f.read()
    names = _documented_names(text)
    fields = set(schema.REPORT["properties"]) | set(schema.STATS_FILE["properties"])
    for sub in ("options", "summary", "layout"):
        fields |= set(schema.REPORT["properties"][sub]["properties"])
    for sub in (schema.FINDING, schema.IMAGES, schema.VIDEOS):
        fields |= set(sub["properties"])
    assert not fields - names, f"undocumented fields: {sorted(fields - names)}"
    assert not set(KINDS) - names, f"undocumented kinds: {sorted(set(KINDS) - names)}"
    for kind, (severity, _) in KINDS.items():  # the kinds table gives each kind its severity
        assert re.search(rf"\| `{kind}` \| {severity} \|", text), kind
    with open(os.path.join(BROKEN, "MANIFEST.json"), encoding="utf-8") as f:
        cases = [c["case"] for c in json.load(f)["cases"]]
    assert all(f"`{case}`" in text for case in cases), [c for c in cases if f"`{c}`" not in text]
    assert f"schema_version` is {schema.SCHEMA_VERSION}" in text
