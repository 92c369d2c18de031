"""Report -> text (the terminal summary), JSON (schema in docs/validate.md), JUnit XML (for CI).
The --stats-dir files are written by stats_files.py."""
from __future__ import annotations

import json
import os
import re
import xml.etree.ElementTree as ET
from collections import defaultdict
from typing import TYPE_CHECKING, Dict, List, Tuple

from ..storage.shards import shown_url
from .findings import ERROR, KINDS
from ..storage.writing import write_text_atomic
if TYPE_CHECKING:  # the type only: report.py renders itself through this module
    from .report import Report

FORMATS = ("text", "json", "junit")
TEXT_EXAMPLES = 3     # findings shown per kind in the text summary
TEXT_SHARDS = 20      # shards listed in the text summary
TOLERANCE_CASE = "sample drops (--max-drop)"  # the JUnit testcase of the --max-drop tolerance


def render(report: Report, fmt: str, quiet: bool = False) -> str:
    """The report in one format, as text that always encodes to UTF-8 (see escape_names); quiet
    (-q): the text report is its verdict line only (JSON and JUnit, asked for, stay whole)."""
    if fmt == "text":
        return to_text(report, quiet)
    return {"json": to_json, "junit": to_junit}[fmt](report)


def write_report(report: Report, fmt: str, path: str) -> str:
    """Write the report to `path` whole or not at all (a temporary file, then rename; an s3://,
    gs:// URL: one object, uploaded whole)."""
    return write_text_atomic(path, render(report, fmt), report.options.stage.storage_options)


# -- names that are not UTF-8 ----------------------------------------------------------------------
_REPR_ESCAPED = re.compile(r"\\udc([89a-f][0-9a-f])")


def escape_names(text: str) -> str:
    """Member names that are not UTF-8 are read with surrogateescape (their bytes kept as lone
    surrogates); here each such byte becomes a visible \\xNN, the rest of the text unchanged.
    Messages that quote a name with repr() show the byte as \\udcNN: written \\xNN too."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return _REPR_ESCAPED.sub(r"\\x\1", text) if "\\udc" in text else text


def escape_data(obj):
    """escape_names over every string of a JSON-able structure (keys included)."""
    if isinstance(obj, str):
        return escape_names(obj)
    if isinstance(obj, dict):
        return {escape_data(k): escape_data(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [escape_data(v) for v in obj]
    return obj


# -- text ----------------------------------------------------------------------------------------
def _pct(share) -> str:
    return "-" if share is None else f"{share:.1%}"


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f}"


def _common_folder(shards: List[str]) -> str:
    """The folder all (local) shards are in, to print shorter names; "" when there is none."""
    if not shards or any(":" in s.split("/", 1)[0] for s in shards):  # URLs
        return ""
    try:
        return os.path.commonpath([os.path.dirname(s) or "." for s in shards])
    except ValueError:  # mixed absolute and relative paths
        return ""


def to_text(report: Report, quiet: bool = False) -> str:
    """The terminal summary; quiet (-q): its last line, the verdict, alone."""
    if quiet:
        return escape_names(verdict_line(report) + "\n")
    o = report.options
    stage = o.stage
    rate = f", {report.bytes / report.seconds / 1e6:.1f} MB/s" if report.seconds > 0 else ""
    lines = [f"wdsfilter validate: {len(report.shards)} shard(s), {_mb(report.bytes)} MB, {report.samples} samples, "
             f"{report.kept} kept ({_pct(report.kept_share)}) in {report.seconds:.1f}s{rate}",
             f"caption key '{stage.caption_spec}', image key '{stage.image_spec}', rekey {stage.rekey}, "
             f"max pixels {stage.max_pixels / 1e6:g} MP" + (f", max side {stage.max_side}" if stage.max_side else "")
             + (", full decode (--deep)" if o.deep else ", headers + end-of-data check (--deep decodes)")]
    counts = report.counts
    if counts:
        lines += ["", "Findings by kind", f"  {'kind':<22} {'severity':<8} {'count':>7}"]
        order = sorted(counts, key=lambda k: (KINDS[k][0] != ERROR, k))
        lines += [f"  {k:<22} {KINDS[k][0]:<8} {counts[k]:>7}" for k in order]
        lines += ["", "Details"]
        by_kind: Dict[str, list] = defaultdict(list)
        for f in report.findings:
            by_kind[f.kind].append(f)
        for k in order:
            lines.append(f"  {k} ({KINDS[k][0]}, {counts[k]}): {KINDS[k][1]}")
            for f in by_kind[k][:TEXT_EXAMPLES]:
                where = " ".join(p for p in (shown_url(f.shard) if f.shard else "", f"member {f.member}" if f.member else "",
                                             f"key {f.key!r}" if f.key and f.key != f.member else "") if p)
                lines.append(f"    {where or '(all shards)'}: {f.message}")
            if counts[k] > TEXT_EXAMPLES:
                lines.append(f"    ... {counts[k] - TEXT_EXAMPLES} more (--format json lists them)")
    lines += _shard_table(report)
    suggestions = report.suggestions()
    if suggestions:
        lines += ["", "Suggestions"] + [f"  - {s}" for s in suggestions]
    lines += ["", verdict_line(report)]
    return escape_names("\n".join(lines) + "\n")


def verdict_line(report: Report) -> str:
    """PASS or FAIL, the counts, the --fail-on level and what --max-drop let pass."""
    o = report.options
    failing = report.failing
    level = "errors" if o.fail_on == ERROR else "warnings"
    verdict = (f"FAIL: {sum(failing.values())} finding(s) at the failing level ({', '.join(failing)})"
               if failing else "PASS")
    tolerated = _tolerated(report)
    within = ""
    if tolerated:
        parts = [f"{count} {kind} ({share:.2%}, --max-drop {limit})" for kind, count, share, limit in tolerated]
        within = f"; within the tolerance: {', '.join(parts)}"
    return (f"{verdict}; {report.errors} error(s), {report.warnings} warning(s); failing on {level} "
            f"(--fail-on){within}; exit code {report.exit_code}")


def _tolerated(report: Report) -> List[Tuple[str, int, float, str]]:
    """(kind, count, share of the samples, the --max-drop that let it pass) per tolerated kind."""
    o, n = report.options, report.samples or 1
    return [(kind, count, count / n, f"{f'{kind}=' if kind in o.drop_limits else ''}{o.tolerance(kind):.2%}")
            for kind, count in report.tolerated.items()]


def tolerance_lines(report: Report) -> List[str]:
    """What --max-drop let pass, a line per kind, and the overall share within its tolerance (past
    a tolerance, a too_many_dropped finding says so); none without --max-drop."""
    o, n = report.options, report.samples
    lines = [f"tolerated: {kind} {count} of {n} samples ({share:.2%}) within --max-drop {limit}"
             for kind, count, share, limit in _tolerated(report)]
    counts, shown = report.counts, {kind for kind, *_ in _tolerated(report)}
    lines += [f"{kind}: {counts.get(kind, 0)} of {n} samples ({counts.get(kind, 0) / (n or 1):.2%}), within --max-drop "
              f"{kind}={limit:.2%}" for kind, limit in o.drop_limits.items()
              if kind not in shown and counts.get(kind, 0) <= limit * n]
    dropped = n - report.kept
    if o.drop_limit is not None and dropped <= o.drop_limit * n:
        reasons = f" ({report.drop_reasons()})" if dropped else ""
        lines.append(f"{dropped} of {n} samples ({dropped / (n or 1):.2%}) would be dropped{reasons}, "
                     f"within --max-drop {o.drop_limit:.2%}")
    return lines


def _shard_table(report: Report) -> List[str]:
    """Per-shard stats, shards with findings or drops first (the JSON report lists every shard)."""
    flagged = [r for r in report.shards if r.counts or r.kept_share != 1]
    clean = [r for r in report.shards if not (r.counts or r.kept_share != 1)]
    shown = (flagged + clean)[:TEXT_SHARDS]
    base = _common_folder([r.shard for r in report.shards])
    names = [os.path.relpath(r.shard, base) if base else shown_url(r.shard) for r in shown]
    width = max(20, min(60, max(len(n) for n in names)))
    where = f" (in {base}{os.sep})" if base else ""
    lines = ["", f"Shards: {len(flagged)} with findings or drops, {len(clean)} clean{where}",
             f"  {'shard':<{width}} {'samples':>7} {'kept':>7} {'MB':>7} {'errors':>6} {'warnings':>8}"]
    for r, name in zip(shown, names):
        errors = sum(n for k, n in r.counts.items() if KINDS[k][0] == ERROR)
        warnings = sum(r.counts.values()) - errors
        name = name if len(name) <= width else "..." + name[-width + 3:]
        lines.append(f"  {name:<{width}} {r.samples:>7} {_pct(r.kept_share):>7} {_mb(r.bytes):>7} "
                     f"{errors:>6} {warnings:>8}")
    if len(report.shards) > len(shown):
        lines.append(f"  ... and {len(report.shards) - len(shown)} more shard(s) "
                     f"(--format json or --stats-dir list them all)")
    return lines


# -- json ----------------------------------------------------------------------------------------
def to_json(report: Report) -> str:
    return json.dumps(escape_data(_shown_shards(report.to_dict())), indent=2, ensure_ascii=False) + "\n"


def _shown_shards(data):
    """The report with every shard URL as it may be published (shards.shown_url: no password, no
    presigned signature): JSON and JUnit reports are CI artefacts, read by more people than the run."""
    if isinstance(data, dict):
        return {k: shown_url(v) if k == "shard" and isinstance(v, str) else _shown_shards(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_shown_shards(v) for v in data]
    return data


# -- junit ---------------------------------------------------------------------------------------
_XML_BAD = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _x(text) -> str:
    return _XML_BAD.sub("?", escape_names(str(text)))


def to_junit(report: Report) -> str:
    """One testcase per shard, one for the layout checks and, with --max-drop, one for the
    tolerance (what it let pass in <system-out>, or a too_many_dropped <failure> naming the reasons
    and shares); findings at the failing level are a <failure>, the others go to <system-out>."""
    cases = [(shown_url(r.shard), r.findings, r.counts, r.seconds, []) for r in report.shards]
    drops = [f for f in report.layout if f.kind == "too_many_dropped"]
    layout = [f for f in report.layout if f.kind != "too_many_dropped"]
    cases.append(("layout (shard count vs ranks x loader workers)", layout, _counts(layout), 0.0, []))
    o = report.options
    if o.drop_limit is not None or o.drop_limits:  # its own testcase: what it let pass, or too_many_dropped
        cases.append((TOLERANCE_CASE, drops, _counts(drops), 0.0, tolerance_lines(report)))
    failures = sum(1 for _, _, counts, _, _ in cases if any(report.is_failing(k) for k in counts))
    suites = ET.Element("testsuites", name="wdsfilter validate", tests=str(len(cases)), failures=str(failures),
                        errors="0", time=f"{report.seconds:.3f}")
    suite = ET.SubElement(suites, "testsuite", name="wdsfilter validate", tests=str(len(cases)),
                          failures=str(failures), errors="0", skipped="0", time=f"{report.seconds:.3f}")
    props = ET.SubElement(suite, "properties")
    properties = report.options.to_dict()
    if o.drop_limit is not None or o.drop_limits:
        properties["tolerated"] = report.tolerated
    for name, value in properties.items():
        text = value if isinstance(value, str) else json.dumps(value)  # null, false: not Python's None, False
        ET.SubElement(props, "property", name=name, value=_x(text))
    for name, findings, counts, seconds, notes in cases:
        case = ET.SubElement(suite, "testcase", classname="wdsfilter.validate", name=_x(name), time=f"{seconds:.3f}")
        failing = [f for f in findings if report.is_failing(f.kind)]
        other = [f for f in findings if not report.is_failing(f.kind)]
        failing_counts = {k: n for k, n in sorted(counts.items()) if report.is_failing(k)}
        if failing_counts:
            summary = ", ".join(f"{k} x{n}" for k, n in failing_counts.items())
            if name == TOLERANCE_CASE:  # its findings say the counts and shares: CI shows the message first
                summary = "; ".join(f.message for f in failing)
            failure = ET.SubElement(case, "failure", type=next(iter(failing_counts)), message=_x(summary))
            failure.text = _x(_lines(failing))
        if other or notes:
            ET.SubElement(case, "system-out").text = _x("\n".join([*notes, _lines(other)] if other else notes))
    ET.indent(suites)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def _counts(findings) -> Dict[str, int]:
    counts: Dict[str, int] = defaultdict(int)
    for f in findings:
        counts[f.kind] += 1
    return counts


def _lines(findings) -> str:
    return "\n".join(f"{f.severity} {f.kind} member={f.member!r} key={f.key!r}: {f.message}" for f in findings)
