"""The dedup section of a report: the largest duplicate groups and the eval matches of a run, as
rows of thumbnails (read from the source shards by the filter report's reader), so a placeholder
image repeated 10,000 times or a leaked eval image is seen, not only counted. One section, two
pages: `wdsfilter filter --report` (and score's report.html) shows it when RUN_DIR/dedup/ exists
(`section_data`), and `wdsfilter dedup` writes it alone as RUN_DIR/dedup/report.html
(`write_report`). Best effort: a shard that cannot be read gets a note on its cards."""
from __future__ import annotations

import os
from typing import Dict, List, Optional

from ...core.errors import ConfigError
from ...runfolder.dedup import FOLDER, SUMMARY, DedupMarks
from ...runfolder.names import REPORT
from ...storage.writing import write_text_atomic
from ..html import CSS, escape, grid
from ..media import attach_media
from .base import Section

MAX_MATCHES = 30


class Dedup(Section):
    """The run's dedup (RUN_DIR/dedup/, when `wdsfilter dedup` ran); nothing otherwise."""
    section: Optional[dict] = None

    def finish(self, result) -> None:
        self.section = section_data(self.context.run)

    def examples(self) -> List[dict]:
        return self.section["examples"] if self.section else []

    def render(self, result) -> List[str]:
        return section_html(self.section) if self.section else []


def section_data(run) -> Optional[dict]:
    """The section for a report of `run` (runfolder.ScoreRun), its thumbnails still to attach
    (media.attach_media over section["examples"]); None where `wdsfilter dedup` has not
    run. Eval matches are read from dedup/<shard>.parquet (runfolder/dedup.py, their one reader);
    a dedup older than the score files is shown with a note saying so."""
    if not os.path.exists(os.path.join(run.folder, FOLDER, SUMMARY)):
        return None
    note = None
    try:
        try:
            marks = DedupMarks(run.folder, [(s.name, s.score_file) for s in run.shards])
        except ConfigError as e:  # stale: still worth seeing, with the warning
            note, marks = str(e), DedupMarks(run.folder)
        matches = []
        for shard in run.shards:
            for key, _, match in marks.eval_matches(shard.name):
                matches.append({"shard": shard.name, "key": key, "eval_match": match})
            if len(matches) > MAX_MATCHES:
                break
    except Exception as e:  # noqa: BLE001 - a damaged dedup folder costs the section, not the report
        return {"note": f"dedup results not readable: {type(e).__name__}: {e}", "examples": []}
    return build(marks.summary, {s.name: s.url for s in run.shards}, matches, note)


def build(summary: dict, urls: Dict[str, str], matches: List[dict], note: Optional[str] = None) -> dict:
    """The section from dedup/summary.json's content, the source shard of each shard name and the
    rows matching an eval image ({"shard", "key", "eval_match"}); its cards' examples in
    section["examples"] (html.card's fields)."""
    def example(m: dict, verdict: str, kept: bool) -> dict:
        return {"url": urls.get(m["shard"], ""), "key": m.get("key"), "values": {}, "kept": kept,
                "verdict": verdict, "shard": m["shard"]}
    groups = [dict(g, cards=[example(m, "survivor" if m["survivor"] else
                                     f"duplicate (not the survivor){distance(m)}", bool(m["survivor"]))
                             for m in g.get("members", [])])
              for g in summary.get("largest", [])]
    shown = [example(m, f"eval match: {m['eval_match']}", False) for m in matches[:MAX_MATCHES]]
    examples = [c for g in groups for c in g["cards"]] + shown
    return {"summary": summary, "groups": groups, "matches": shown, "more_matches": len(matches) > MAX_MATCHES,
            "note": note, "examples": [e for e in examples if e["url"] and e["key"] is not None]}


def distance(member: dict) -> str:
    """How far a group's member is from the survivor: phash bits, the embeddings' cosine."""
    parts = ([f"{member['bits']} bit{'s' * (member['bits'] != 1)}"] if member.get("bits") is not None else []) \
        + ([f"cosine {member['cosine']:.3f}"] if member.get("cosine") is not None else [])
    return f": {', '.join(parts)} from the survivor" if parts else ""


def section_html(section: dict) -> List[str]:
    out = ['<h2 id="dedup">Duplicates and eval matches (wdsfilter dedup)</h2>']
    if section.get("note"):
        out.append(f'<p class="note">{escape(section["note"])}</p>')
    summary = section.get("summary")
    if not summary:
        return out
    kinds = ", ".join(f"{n} {k}" for k, n in summary.get("per_kind", {}).items()) or "none"
    out.append(f"<p>{summary['rows']} rows; {summary['groups']} duplicate group(s) ({escape(kinds)}); "
               f"{summary['duplicates']} row(s) are duplicates of a survivor "
               f"(<code>wdsfilter filter --dedup</code> keeps the survivors and drops the eval matches).</p>")
    out.append('<p class="meta">settings: ' + escape(", ".join(f"{k}={v}" for k, v in summary.get("settings", {}).items()))
               + "</p><h3>Largest groups</h3>")
    if not section["groups"]:
        out.append("<p>no duplicate groups</p>")
    for g in section["groups"]:
        shown = len(g["cards"])
        out.append(f'<p class="group">group {g["group"]}: {g["size"]} rows ({escape(g["kind"])})'
                   f'{f", the first {shown} shown" if shown < g["size"] else ""}</p>' + grid(g["cards"], None))
    matched = ", ".join(f"{n} {k}" for k, n in summary.get("eval_matches", {}).items()) or "none"
    out.append(f"<h3>Eval matches</h3><p>{summary.get('eval_images', 0)} eval image(s) compared; rows matching "
               f"one: {escape(matched)}{f' (the first {MAX_MATCHES} shown)' if section['more_matches'] else ''}</p>"
               + (grid(section["matches"], None) if section["matches"] else ""))
    return out


def write_report(folder: str, summary: dict, urls: Dict[str, str], matches: List[dict], stage: dict) -> str:
    """RUN_DIR/dedup/report.html: the section alone. summary: dedup/summary.json's content; urls:
    shard output name -> source shard; matches: {"shard", "key", "eval_match"} of rows matching
    an eval image."""
    section = build(summary, urls, matches)
    attach_media(section["examples"], stage)
    out = ["<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>dedup</title>"
           f"<style>{CSS}</style></head><body><h1>Dedup of {escape(os.path.dirname(folder))}</h1>"]
    out += section_html(section)
    out.append("</body></html>")
    path = os.path.join(folder, REPORT)
    write_text_atomic(path, "\n".join(out))
    return path
