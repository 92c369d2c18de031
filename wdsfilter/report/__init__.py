"""What a scoring run folder reports, built from the folder alone (runfolder/): below score/ and
filtering/, so both write their report with the one builder here.

    statistics.py  the score columns' statistics and histograms (summary.json, histograms.png, and
                   the report's charts)
    collect.py     what the HTML report shows, gathered while runfolder/judge.py judges the rows
                   (ReportCollector: each section sees every row), then the cards' media
    sections/      the page's sections, one module each (base.Section: observe, finish, render);
                   their order and list: sections.SECTIONS
    media.py       the cards' thumbnails and captions, read from the source shards
    html.py        the pages' building blocks: style, escaping, cards; charts.py: the SVG charts
    page.py        the self-contained HTML page (write_report)

`wdsfilter score` ends with run_report (RUN_DIR/report.html, the run's own thresholds);
`wdsfilter filter` (filtering/apply.py) writes filter_report.html with the thresholds it resolved,
through the same ReportCollector, runfolder.judge.count_run and write_report.
"""
from __future__ import annotations

import os
from typing import Optional

from ..runfolder.names import REPORT
from ..core.selection import Selection


def run_report(folder: str, thresholds: Selection, allow_pipe: bool = False,
               allow_remote: bool = False) -> Optional[str]:
    """report.html for a finished `wdsfilter score` run, with the run's own thresholds (and the
    permissions its own command line gave); None (and a warning) when it cannot be written: the
    scores are what matters."""
    import logging
    try:
        return _write_run_report(folder, thresholds, allow_pipe, allow_remote)
    except Exception as e:  # noqa: BLE001 - never fail a scoring run for its report
        logging.getLogger("wdsfilter").warning(f"report.html not written: {type(e).__name__}: {e}")
        return None


def _write_run_report(folder: str, thresholds: Selection, allow_pipe: bool, allow_remote: bool) -> str:
    from ..stream.config import StageConfig
    from ..runfolder import ScoreRun
    from ..runfolder.judge import FilterResult, count_run
    from ..runfolder.shares import resolve_selection
    from ..runfolder.reader import check_sources
    from ..storage.writing import check_output_file
    from .collect import ReportCollector
    from .page import write_report
    path = os.path.join(folder, REPORT)
    run = ScoreRun.open(folder)
    run.require_sources()  # thumbnails only from the sources the run's own record names
    check_output_file(path, "--report")
    check_sources([s.url for s in run.shards], allow_pipe, allow_remote, folder)
    resolved = resolve_selection(thresholds, run)  # the run's rules, its shares resolved already
    judged = resolved.thresholds
    result = FilterResult(scores_dir=folder, thresholds=judged, shards=len(run.shards), unfinished=run.unfinished,
                          selection=resolved.selection)
    result.counts = [{"kept": 0, "dropped": 0, "no_score": 0} for _ in judged]
    collector = ReportCollector(run, judged, allow_pipe, allow_remote, StageConfig.stream_idle_seconds)
    count_run(run, judged, collector, None, result)
    return write_report(collector.finish(result), path)
