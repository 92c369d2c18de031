"""JSON Schemas (draft 2020-12) of the JSON report (--format json) and of a {shard}_stats.json file.

The contract behind SCHEMA_VERSION: within one version fields are only ever added, never renamed,
removed or retyped; consumers should ignore fields they do not know. The tests check every report
they make against these schemas (with no unknown field allowed, so a new field cannot slip in
undocumented), and docs/validate.md describes every field.

    python -m wdsfilter.validate.schema            # prints the report schema
    python -m wdsfilter.validate.schema stats      # prints the stats-file schema
"""
from __future__ import annotations

import json
import sys

from ..storage.shardstats import SIZES
from .findings import KINDS, SEVERITIES
from .report import SCHEMA_VERSION

_INT = {"type": "integer", "minimum": 0}
_NUM = {"type": "number", "minimum": 0}
_SHARE = {"type": ["number", "null"], "minimum": 0, "maximum": 1}
_KIND = {"enum": sorted(KINDS)}
_COUNTS = {"type": "object", "propertyNames": _KIND, "additionalProperties": _INT}
_REASONS = {"type": "object", "additionalProperties": _INT}  # the stages' drop reasons


def _object(properties: dict, required=None) -> dict:
    return {"type": "object", "properties": properties, "required": sorted(required or properties),
            "additionalProperties": False}


FINDING = _object({
    "kind": _KIND,
    "severity": {"enum": list(SEVERITIES)},
    "shard": {"type": "string"},    # "" for findings of no single shard (too_few_shards)
    "member": {"type": "string"},   # "" when the finding is about the shard or the set
    "key": {"type": "string"},
    "message": {"type": "string"},
})

IMAGES = _object({
    "count": _INT,
    "formats": {"type": "object", "additionalProperties": _INT},
    "min_side": {"type": ["integer", "null"]},
    "max_side": {"type": ["integer", "null"]},
    "mean_megapixels": {"type": ["number", "null"]},
})

VIDEOS = _object({
    "count": _INT,
    "frames": _INT,
    "duration_s": _NUM,
    "min_duration_s": {"type": ["number", "null"]},
    "max_duration_s": {"type": ["number", "null"]},
    "sizes": {"type": "object", "additionalProperties": _INT},  # "WxH" -> videos, the 10 most common
})

SHARD_PROPERTIES = {
    "shard": {"type": "string"},
    "bytes": _INT,
    "members": _INT,
    "samples": _INT,
    "kept": _INT,
    "kept_share": _SHARE,
    "dropped": _REASONS,
    "findings": _COUNTS,
    "error": {"type": ["string", "null"]},
    "images": IMAGES,
    "videos": VIDEOS,
    "suggestion": {"type": ["string", "null"]},
    "seconds": _NUM,
    "remote_retries": _INT,
}
OPTIONAL_SHARD = ("remote_retries",)  # only where a remote read was retried
SHARD = _object(SHARD_PROPERTIES, required=[k for k in SHARD_PROPERTIES if k not in OPTIONAL_SHARD])

REPORT = dict(_object({
    "schema_version": {"const": SCHEMA_VERSION},
    "tool": {"const": "wdsfilter validate"},
    "wdsfilter_version": {"type": "string"},
    "status": {"enum": ["pass", "fail"]},
    "exit_code": {"enum": [0, 1]},  # of the report: 0 pass, 1 findings at the --fail-on level
    "options": _object({
        "caption_key": {"type": "string"},
        "image_key": {"type": "string"},
        "rekey": {"enum": ["first-dot", "last-dot"]},
        "max_pixels": {"type": ["integer", "null"]},
        "max_side": {"type": ["integer", "null"]},
        "oversize": {"enum": ["skip", "reduce"]},
        "image_token": {"type": ["string", "null"]},
        "deep": {"type": "boolean"},
        "min_side": {"type": ["integer", "null"]},
        "max_aspect": {"type": ["number", "null"]},
        "ranks": {"type": ["integer", "null"]},
        "loader_workers": {"type": ["integer", "null"]},
        "uneven_ratio": {"type": "number"},
        "fail_on": {"enum": list(SEVERITIES)},
        "max_drop": _SHARE,  # --max-drop 1%: 0.01; null without a tolerance
        "max_drop_by_reason": {"type": "object", "additionalProperties": _SHARE},
    }),
    "summary": _object({
        "shards": _INT, "bytes": _INT, "members": _INT, "samples": _INT, "kept": _INT, "kept_share": _SHARE,
        "errors": _INT, "warnings": _INT, "seconds": _NUM,
        "tolerated": _COUNTS,  # kinds at the failing level that --max-drop lets pass
    }),
    "counts": _COUNTS,
    "dropped": _REASONS,
    "severities": {"type": "object", "propertyNames": _KIND, "additionalProperties": {"enum": list(SEVERITIES)}},
    "suggestions": {"type": "array", "items": {"type": "string"}},
    "layout": _object({
        "shards": _INT, "ranks": {"type": ["integer", "null"]}, "loader_workers": {"type": ["integer", "null"]},
        "samples_min": {"type": ["integer", "null"]}, "samples_median": {"type": ["number", "null"]},
        "samples_max": {"type": ["integer", "null"]}, "readers": _INT, "readers_without_shard": _INT,
    }, required=["shards", "ranks", "loader_workers", "samples_min", "samples_median", "samples_max"]),
    "shards": {"type": "array", "items": SHARD},
    "findings": {"type": "array", "items": FINDING},
    "omitted": _COUNTS,
}), **{"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "wdsfilter validate report"})

STATS_FILE = dict(_object(dict(SHARD_PROPERTIES, **{
    "successes": _INT,  # = samples; the field DataComp's resharder reads
    "complete": {"type": "boolean"},  # false: the shard's stream failed, not read to its end (no sizes.json entry)
    "schema_version": {"const": SCHEMA_VERSION},
    "tool": {"const": "wdsfilter validate"},  # tells our files from another tool's {shard}_stats.json
    "listed_findings": {"type": "array", "items": FINDING},
}), required=[k for k in SHARD_PROPERTIES if k not in OPTIONAL_SHARD] + [
    "successes", "complete", "schema_version", "tool", "listed_findings"]), **{"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "wdsfilter validate shard stats"})

SIZES_FILE = {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": SIZES,
              "type": "object", "additionalProperties": _INT}


if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else "report"
    print(json.dumps({"report": REPORT, "stats": STATS_FILE, "sizes": SIZES_FILE}[which], indent=2))
