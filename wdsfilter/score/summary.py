"""The run summary: summary.json and the terminal's closing lines, built once from an engine's
outcome and the statistics of the score tables (statistics.py)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional

from ..storage.atomic import write_json
from ..runfolder.names import FAILURES_MERGED
from ..runfolder.tables import STATUSES
from .ledger import summary_lines
from ..report.statistics import one_value_text, text_histogram
from ..storage.shards import shown_url


# -- the run summary ------------------------------------------------------------------------------
@dataclass
class RunSummary:
    out: str
    shards: int = 0  # shards in the input
    shards_scored: int = 0  # completed by this run
    shards_resumed: int = 0  # already complete (skipped with resume)
    shards_failed: List[dict] = field(default_factory=list)  # could not be read at all
    shards_cut: List[dict] = field(default_factory=list)  # scored up to a break in the tar (url, reason)
    rows: int = 0
    status: Dict[str, int] = field(default_factory=dict)
    reasons: Dict[str, int] = field(default_factory=dict)
    kept: int = 0
    dropped: int = 0
    thresholds: Dict[str, dict] = field(default_factory=dict)  # minimum per column: kept/dropped/no_score
    max_thresholds: Dict[str, dict] = field(default_factory=dict)  # maximum per column: the same counts
    columns: Dict[str, dict] = field(default_factory=dict)
    scorers: List[str] = field(default_factory=list)
    plan: Dict[str, Any] = field(default_factory=dict)
    plan_text: str = ""
    workers: List[dict] = field(default_factory=list)
    stage_counts: Dict[str, Any] = field(default_factory=dict)
    samples_this_run: int = 0
    seconds: float = 0.0  # the whole run: start-up, model load, probe, scoring, summary
    scoring_seconds: float = 0.0  # the scoring loop alone (decode workers and models running)
    dry_run: bool = False
    files: Dict[str, Optional[str]] = field(default_factory=dict)
    # the failure ledger (ledger.py) by reason: samples, shards, transient
    failures: Dict[str, dict] = field(default_factory=dict)
    # --retry-failed: samples retried, now scored, still listed
    retried: Dict[str, int] = field(default_factory=dict)
    # a joined run's worker (--join, join.py): its token and task, the run's shards done/failed/live
    # as it last saw them, whether it wrote the run's end (finished) and, then, every worker's counts
    joined: Dict[str, Any] = field(default_factory=dict)

    @property
    def scored(self) -> int:
        return self.status.get("scored", 0) + self.status.get("partial", 0)

    @property
    def samples_per_second(self) -> float:
        return self.samples_this_run / self.seconds if self.seconds else 0.0

    def batch_sizes(self) -> List[dict]:
        """Planned and finally used batch size per model worker and scorer (in frames for a scorer
        that counts them: an image is one frame), how often the back-off halved it and why, and
        how often it grew back."""
        out = []
        for w in self.workers:
            for name, b in (w.get("backoff") or {}).items():
                halved = [e for e in b["events"] if e["kind"] != "grow"]
                out.append({"worker": w.get("worker"), "device": w.get("device"), "scorer": name,
                            "planned": b["planned_batch_size"], "final": b["final_batch_size"],
                            "halvings": len(halved), "causes": sorted({e["kind"] for e in halved}),
                            "grown": len(b["events"]) - len(halved)})
        return out

    def to_dict(self) -> dict:
        d = asdict(self)
        d["scored"] = self.scored
        d["samples_per_second"] = round(self.samples_per_second, 2)
        d["batch_sizes"] = self.batch_sizes()
        return d

    def format_text(self, histograms: bool = True, plan: bool = True, scorers: bool = True, quiet: bool = False) -> str:
        """The terminal summary. plan=False leaves out the scorers and the plan of a dry run (the
        command line has printed them already, as the run went); scorers=False the scorer lines of
        a run (printed at its start); quiet (-q): the one-line result and what failed only. Each
        section is rendered by its own method, in the order of the page."""
        if self.dry_run:
            return self._dry_run_text(plan)
        if self.joined and not self.joined.get("finished"):
            return self._worker_text()
        if quiet:
            return "\n".join([self._headline(quiet)] + self._shard_lines())
        return "\n".join([self._headline(quiet), *self._speed_lines(scorers), *self._batch_size_lines(),
                          *self._status_lines(), *self._threshold_lines(), *self._retry_lines(),
                          *summary_lines(self.failures, self.files.get("failures") or FAILURES_MERGED),
                          *self._shard_lines(), *self._column_lines(histograms), *self._file_lines(),
                          *self._joined_worker_lines()])

    def _dry_run_text(self, plan: bool) -> str:
        return "\n".join((([f"scorer: {s}" for s in self.scorers] + [self.plan_text]) if plan else [])
                         + ["dry run: nothing was scored",
                            f"shards: {self.shards} ({self.shards_resumed} already done)"])

    def _headline(self, quiet: bool) -> str:
        return (f"scored {self.scored} of {self.rows} samples in {self.shards} shard(s)"
                + (f" ({self.shards_resumed} shard(s) were already done)" if self.shards_resumed else "")
                + (f"; {len(self.shards_failed)} shard(s) FAILED" if self.shards_failed else "")
                + (f"; {len(self.shards_cut)} shard(s) CUT SHORT" if self.shards_cut else "")
                + (f"; kept {self.kept}" if quiet and (self.thresholds or self.max_thresholds) else ""))

    def _speed_lines(self, scorers: bool) -> List[str]:
        """The scorers (unless printed at the run's start) and this run's speed."""
        lines = [f"  scorer: {s}" for s in (self.scorers if scorers else ())]
        if self.samples_this_run:
            rate = self.samples_this_run / self.scoring_seconds if self.scoring_seconds else 0.0
            lines.append(f"  this run: {self.samples_this_run} samples in {self.seconds:.1f}s = "
                         f"{self.samples_per_second:.1f} samples/s ({rate:.1f} samples/s while scoring, "
                         f"after start-up, model load and probe)")
        return lines

    def _batch_size_lines(self) -> List[str]:
        lines = []
        for b in self.batch_sizes():
            extra = f", halved {b['halvings']}x ({', '.join(b['causes'])})" if b["halvings"] else ""
            extra += f", grown back {b['grown']}x" if b.get("grown") else ""
            lines.append(f"  batch size on {b['device']} (worker {b['worker']}, {b['scorer']}): "
                         f"planned {b['planned']}, final {b['final']}{extra}")
        return lines

    def _status_lines(self) -> List[str]:
        """Rows per status, and the samples not (or partly) scored per reason."""
        lines = ["  status: " + ", ".join(f"{k} {self.status.get(k, 0)}" for k in STATUSES)]
        if self.reasons:
            lines.append("  not scored / partly scored, by reason:")
            lines += [f"    {n:>8}  {reason}" for reason, n in self.reasons.items()]
        return lines

    def _threshold_lines(self) -> List[str]:
        lines = []
        for col, th in [*self.thresholds.items(), *self.max_thresholds.items()]:
            bound = f">= {th['min']:g}" if "min" in th else f"<= {th['max']:g}"
            lines.append(f"  {col} {bound}: kept {th['kept']}, dropped {th['dropped']}"
                         + (f", no score {th['no_score']}" if th["no_score"] else ""))
        if self.thresholds or self.max_thresholds:
            lines.append(f"  kept {self.kept} of {self.rows} (all thresholds met)")
        return lines

    def _retry_lines(self) -> List[str]:
        if not self.retried:
            return []
        return [f"  retried {self.retried['samples']} failed sample(s): {self.retried['scored']} now scored, "
                f"{self.retried['samples'] - self.retried['scored']} still listed"]

    def _column_lines(self, histograms: bool) -> List[str]:
        lines = []
        for col, st in self.columns.items():
            lines += column_lines(col, st, histograms)
        return lines

    def _file_lines(self) -> List[str]:
        return [f"  {name}: {path}" for name, path in self.files.items() if path]

    def _joined_worker_lines(self) -> List[str]:
        """A joined run's end, written by its last worker: every worker's counts."""
        return [f"  worker {w['token']} (pid {w['pid']} on {w['host']}"
                + (f", task {w['task']}" if w.get("task") else "")
                + f"): {w.get('shards_done') or 0} shard(s), {w.get('rows') or 0} samples"
                + (f", {w['shards_failed']} failed" if w.get("shards_failed") else "")
                for w in self.joined.get("workers") or ()]

    def _worker_text(self) -> str:
        """A joined run's worker that did not write the run's end: its own share, and where the
        run stands."""
        j, run = self.joined, self.joined.get("run") or {}
        lines = [f"worker {j['worker']}" + (f" (task {j['task']})" if j.get("task") else "")
                 + f": scored {self.shards_scored} shard(s), {self.samples_this_run} samples in {self.seconds:.1f}s"
                 + (f"; {len(self.shards_failed)} shard(s) FAILED" if self.shards_failed else ""),
                 f"  the run: {run.get('done', 0)} of {run.get('shards', 0)} shard(s) done"
                 + (f", {run['failed']} failed" if run.get("failed") else "")
                 + (f", {run['live']} held by other workers" if run.get("live") else "")]
        if j.get("by"):
            lines.append(f"  the run's summary and report are written by {j['by']} ({self.out}/summary.json)")
        else:
            lines.append(f"  the run's summary and report are written by the worker that finds every shard done; "
                         f"`wdsfilter score --status {self.out}` shows where it stands")
        for f in self.shards_failed:
            lines.append(f"  shard FAILED (no marker; a worker started later retries it): {shown_url(f['url'])}: "
                         f"{f['reason']}")
        return "\n".join(lines)

    def _shard_lines(self) -> List[str]:
        lines = [f"  shard FAILED (no marker; --resume retries it): {shown_url(f['url'])}: {f['reason']}"
                 for f in self.shards_failed]
        return lines + [f"  shard CUT SHORT (the samples before the break were scored, the rest have no row; "
                        f"re-create or re-download it): {shown_url(f['url'])}: {f['reason']}" for f in self.shards_cut]


def column_lines(col: str, st: dict, histograms: bool = True) -> List[str]:
    """One score column's statistics as the terminal summary shows them (statistics.py's dict)."""
    one = one_value_text(st["histogram"]) if st.get("kind") == "number" and st.get("histogram") else None
    if one:  # a column of one value (clip_frames on an image-only set): one line, no statistics
        return [f"  {col}: {one}"]
    if st.get("kind") == "number" and st.get("count"):
        return ([f"  {col}: n={st['count']} min={st['min']:.4g} mean={st['mean']:.4g} max={st['max']:.4g}"
                 + (f" (and {st['infinite']} infinite, left out)" if st.get("infinite") else "")]
                + (text_histogram(st["histogram"]) if histograms and st.get("histogram") else []))
    if st.get("kind") == "bool":
        return [f"  {col}: true {st['true']}, false {st['false']}"]
    if st.get("kind") in (None, "number"):  # only None/NaN (or infinities): said, not left out
        return [f"  {col}: no values" + (f" ({st['infinite']} infinite)" if st.get("infinite") else "")]
    return []


def write_summary(summary: RunSummary, path: str) -> None:
    write_json(path, summary.to_dict(), indent=2)
