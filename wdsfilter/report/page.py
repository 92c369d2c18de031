"""The self-contained HTML report of a score folder (report.html): inline CSS and SVG, thumbnails
as data: URIs, no network. The page is its sections (sections/, in SECTIONS' order: the counts per
rule, each score column's charts and the rows beside its thresholds, the drops by reason, tmars'
masked pairs, the failure ledger, the run's dedup) between a head and a small script that marks the
page once every image has loaded (html.SCRIPT), which the browser test reads back with chromium
--dump-dom."""
from __future__ import annotations

from ..storage.writing import write_text_atomic
from .html import CSS, SCRIPT, escape


def render(report) -> str:
    """The page: each section of report.sections (collect.Report) in order, between the page's head
    and the script the browser test reads."""
    result = report.result
    out = ["<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">",
           f"<title>wdsfilter report: {escape(result.scores_dir)}</title><style>{CSS}</style></head><body>",
           f"<h1>Scores in {escape(result.scores_dir)}</h1>"]
    for section in report.sections:
        out += section.render(result)
    out.append(f"<script>{SCRIPT}</script></body></html>")
    return "\n".join(out)


def write_report(report, path: str) -> str:
    return write_text_atomic(path, render(report))
