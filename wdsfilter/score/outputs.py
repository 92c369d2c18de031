"""What a scoring run writes and reports: per-shard score tables (Parquet, or JSONL on request),
the run summary (summary.json, score histograms as a PNG and in the terminal).

Every sample has a row: key, shard, index (order in the shard), status, reason, message, kept,
then one column per score. status is "scored", "partial" (some scorers failed), "failed" (no
scorer could score it: reason says why) or "rejected" (dropped by the stages: reason says why).
The summary is computed from the score files themselves, so a resumed run reports the whole
dataset, not just the part it scored.
"""
from __future__ import annotations

import json
import math
import threading
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from ..atomic import atomic_path, write_json
from ..thresholds import Thresholds, is_missing

BASE_FIELDS = ("key", "shard", "index", "status", "reason", "message", "kept")
STATUSES = ("scored", "partial", "failed", "rejected")
EXTENSIONS = {"parquet": ".parquet", "jsonl": ".jsonl"}


# -- tables -------------------------------------------------------------------------------------
def arrow_type(name: str):
    """The pyarrow type a scorer declares by name (Scorer.column_types): a pyarrow alias
    ("float64", "int64", "bool", "string") or "list<alias>"; None for a name that is neither."""
    import pyarrow as pa
    inner = name[5:-1] if name.startswith("list<") and name.endswith(">") else None
    try:
        return pa.list_(pa.type_for_alias(inner)) if inner is not None else pa.type_for_alias(name)
    except (ValueError, TypeError):
        return None


def _score_array(values: List[Any], declared: Optional[str] = None):
    """A score column as an Arrow array (in C, no Python call per value): of its declared type,
    so every score file of a run has one schema; else of the type pyarrow infers: int64, float64
    (ints and floats mixed), bool, string, or nested for lists; a column with no value at all is
    float64, the type a score column has. A NaN is written as null, as JSONL writes it: a missing
    score, which no threshold passes (thresholds.is_missing), where duckdb and polars would count
    a NaN as above every threshold."""
    import pyarrow as pa
    if declared is not None:
        return pa.array(values, type=arrow_type(declared), from_pandas=True)
    arr = pa.array(values, from_pandas=True)
    return arr.cast(pa.float64()) if pa.types.is_null(arr.type) else arr


def preload_writer(fmt: str) -> None:
    """Warm the table writer in a background thread: pyarrow.parquet, and what pyarrow imports
    on its first array (pandas, where installed) take ~0.5 s of one core. Done lazily, that
    stalled the first shard's write; started with the scoring loop, it runs while the main
    process waits for the decode workers (before the probe, it slowed the probe as much)."""
    if fmt == "parquet":
        threading.Thread(target=_warm_parquet, daemon=True, name="wdsfilter-warm-parquet").start()


def _warm_parquet() -> None:
    import pyarrow as pa
    import pyarrow.parquet  # noqa: F401
    pa.array([0.0])


def write_table(rows: List[dict], columns: Union[Sequence[str], Mapping[str, Optional[str]]], path: str,
                fmt: str) -> None:
    """Write rows atomically: a temporary file in the same folder, then rename over `path`.
    columns: the score columns, or each with its declared type (scorerset.score_columns)."""
    names = list(BASE_FIELDS) + list(columns)
    declared = columns if isinstance(columns, Mapping) else {}
    with atomic_path(path) as tmp:
        if fmt == "jsonl":
            with open(tmp, "w") as f:
                for row in rows:
                    clean = {k: _json_scalar(row.get(k)) for k in names}
                    f.write(json.dumps(clean, ensure_ascii=False, default=json_value) + "\n")
        else:
            import pyarrow as pa
            import pyarrow.parquet as pq
            base_types = {"key": pa.string(), "shard": pa.string(), "index": pa.int64(), "status": pa.string(),
                          "reason": pa.string(), "message": pa.string(), "kept": pa.bool_()}
            arrays, fields = [], []
            for name in names:
                values = [row.get(name) for row in rows]
                arr = (pa.array(values, type=base_types[name]) if name in base_types
                       else _score_array(values, declared.get(name)))
                arrays.append(arr)
                fields.append(pa.field(name, arr.type))
            table = pa.Table.from_arrays(arrays, schema=pa.schema(fields))
            if table.num_rows:
                pq.write_table(table, tmp)
            else:  # a shard with no sample: a file of no row group (HF datasets fails on a row group of 0 rows)
                pq.ParquetWriter(tmp, table.schema).close()


def json_value(o):
    """json.dumps' `default` for what a scorer may return besides Python values: a numpy scalar
    (np.float32 from `.mean()`) or array, a torch tensor, as its Python value. json cannot write
    them, and a JSONL run (and every Ray run, whose scores travel as JSON) ended in an internal
    error at the first shard, where Parquet took them."""
    if hasattr(o, "tolist"):
        return o.tolist()
    raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")


def _json_scalar(v):
    """A JSONL value: a numpy scalar as its Python value, a NaN as null (a missing score)."""
    if hasattr(v, "tolist") and getattr(v, "ndim", None) == 0:
        v = v.tolist()
    return None if isinstance(v, float) and math.isnan(v) else v


def read_table(path: str, columns: Optional[Sequence[str]] = None) -> Dict[str, list]:
    """Column name -> values of one score file (either format)."""
    if path.endswith(".jsonl"):
        out: Dict[str, list] = {}
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        names = columns or (list(rows[0]) if rows else list(BASE_FIELDS))
        for name in names:
            out[name] = [r.get(name) for r in rows]
        return out
    import pyarrow.parquet as pq
    if columns is not None:
        present = set(pq.read_schema(path).names)
        columns = [c for c in columns if c in present]
    return pq.read_table(path, columns=columns).to_pydict()


def table_columns(paths: Sequence[str], scorers: Optional[Sequence[dict]] = None) -> List[str]:
    """The columns of a run's score files: a Parquet file's schema (one for the run). A JSON Lines
    file names its columns only in its rows, and a shard with no sample (an empty tar) has an
    empty one: the first file with a row, else the base fields and the columns of the scorers
    that run.json lists (`scorers`)."""
    for path in paths:
        if path.endswith(".parquet"):
            import pyarrow.parquet as pq
            return list(pq.read_schema(path).names)
        with open(path) as f:
            for line in f:
                if line.strip():
                    return list(json.loads(line))
    return list(BASE_FIELDS) + [c for s in scorers or () for c in s.get("columns") or ()]


def read_rows(path: str) -> List[dict]:
    cols = read_table(path)
    names = list(cols)
    n = len(cols[names[0]]) if names else 0
    return [{k: cols[k][i] for k in names} for i in range(n)]


# -- summary over score files -------------------------------------------------------------------
def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _finite(v) -> bool:
    """A number the statistics and histograms count: not NaN (a missing score) and not infinite
    (a scorer's log(0)): an infinity would make the range, the mean and every histogram bin NaN."""
    return _is_number(v) and math.isfinite(v)


def _numeric(values: Iterable[Any]) -> List[float]:
    return [float(v) for v in values if _finite(v)]


def summarize_files(paths: Sequence[str], columns: Sequence[str], thresholds: Optional[Thresholds] = None,
                    bins: int = 20) -> dict:
    """Counts, kept/dropped per threshold (minimum and maximum) and per-column statistics with
    histograms, read back from the score files (two passes over the score columns: range, then
    histogram). Integer columns with few values get one bin per value."""
    rows = kept = 0
    status: Counter = Counter()
    reasons: Counter = Counter()
    thresholds = thresholds or Thresholds()
    per_bound = [(b, {"min" if b.minimum else "max": b.value, "kept": 0, "dropped": 0, "no_score": 0})
                 for b in thresholds.bounds()]
    stats: Dict[str, dict] = {}
    for path in paths:
        t = read_table(path, ["status", "reason", "kept"] + list(columns))
        n = len(t["status"])
        rows += n
        status.update(t["status"])
        for r in t["reason"]:
            if r:
                reasons.update(str(r).split(";"))
        kept += sum(1 for k in t["kept"] if k)
        for bound, th in per_bound:
            for v in t.get(bound.column, [None] * n):
                th["no_score" if is_missing(v) else "kept" if bound.passes(v) else "dropped"] += 1
        for col in columns:
            _add_values(stats.setdefault(col, _new_column()), t.get(col, []))
    for col, st in stats.items():
        if st["kind"] == "number" and st["count"]:
            st["mean"] = st["sum"] / st["count"]
            lo, hi, n_bins, per_value = histogram_bins(st["min"], st["max"], st["integer"], bins)
            st["histogram"] = {"edges": [lo + (hi - lo) * i / n_bins for i in range(n_bins + 1)],
                               "counts": _bin_counts(paths, col, lo, hi, n_bins)}
            if per_value:
                st["histogram"]["per_value"] = True
        st.pop("sum", None)
        st.pop("integer", None)
    return {"rows": rows, "status": dict(status), "reasons": dict(reasons.most_common()), "kept": kept,
            "dropped": rows - kept, "thresholds": {b.column: th for b, th in per_bound if b.minimum},
            "max_thresholds": {b.column: th for b, th in per_bound if not b.minimum}, "columns": stats}


def _new_column() -> dict:
    return {"count": 0, "min": None, "max": None, "sum": 0.0, "true": 0, "false": 0, "kind": None, "integer": True}


def _add_values(st: dict, values: Iterable[Any]) -> None:
    """Count one file's values of a column into its statistics (booleans, or finite numbers:
    count, sum, range, whether all are integers; infinities only counted, as `infinite`)."""
    for v in values:
        if v is None:
            continue
        if isinstance(v, bool):
            st["kind"] = st["kind"] or "bool"
            st["true" if v else "false"] += 1
            st["count"] += 1
        elif _is_number(v) and math.isinf(v):  # counted apart: summary.json stays JSON (no Infinity)
            st["kind"] = "number"
            st["infinite"] = st.get("infinite", 0) + 1
        elif _finite(v):
            st["kind"] = "number"
            st["integer"] = st["integer"] and isinstance(v, int)
            st["count"] += 1
            st["sum"] += float(v)
            st["min"] = v if st["min"] is None else min(st["min"], v)
            st["max"] = v if st["max"] is None else max(st["max"], v)


def histogram_bins(lowest, highest, integer: bool, bins: int) -> Tuple[float, float, int, bool]:
    """(lo, hi, number of bins, one bin per value?) for values from `lowest` to `highest`: `bins`
    equal bins, or one bin per value for integers with at most `bins` values (ocr_frames)."""
    lo, hi = float(lowest), float(highest)
    n_bins = bins
    per_value = integer and hi - lo + 1 <= bins
    if per_value:
        n_bins, lo, hi = int(hi - lo) + 1, lo - 0.5, hi + 0.5
    if hi == lo:  # one value: a bin of some width (1e-9 is lost in the rounding of values like 1e18)
        hi = lo + max(1e-9, abs(lo) * 1e-9)
    return lo, hi, n_bins, per_value


def _bin_counts(paths: Sequence[str], col: str, lo: float, hi: float, n_bins: int) -> List[int]:
    """The second pass: a column's values counted into `n_bins` equal bins from `lo` to `hi`."""
    counts = [0] * n_bins
    for path in paths:
        for v in _numeric(read_table(path, [col]).get(col, [])):
            counts[min(n_bins - 1, int((v - lo) / (hi - lo) * n_bins))] += 1
    return counts


def text_histogram(hist: dict, width: int = 40) -> List[str]:
    counts, edges = hist["counts"], hist["edges"]
    top = max(counts) or 1
    lines = []
    for i, c in enumerate(counts):
        bar = "#" * max(1 if c else 0, round(c / top * width))
        label = (f"{edges[i] + 0.5:>9.4g}{'':13}" if hist.get("per_value")
                 else f"{edges[i]:>9.4g} .. {edges[i + 1]:<9.4g}")
        lines.append(f"    {label} {c:>8}  {bar}")
    return lines


def plot_histograms(stats: Dict[str, dict], thresholds: Thresholds, path: str) -> Optional[str]:
    """One panel per numeric score column, threshold lines drawn (red: minimum, purple: maximum);
    None when there is nothing to plot. Drawn with PIL, which the core already needs: a few
    milliseconds, where importing matplotlib alone took seconds at start-up of every summary."""
    from PIL import Image, ImageDraw
    minima, maxima = thresholds.minima, thresholds.maxima
    numeric = [(c, s) for c, s in stats.items() if s.get("histogram")]
    if not numeric:
        return None
    width, panel, margin, top = 560, 180, 40, 24
    img = Image.new("RGB", (width, panel * len(numeric)), "white")
    draw = ImageDraw.Draw(img)
    for k, (col, st) in enumerate(numeric):
        y0 = k * panel
        edges, counts = st["histogram"]["edges"], st["histogram"]["counts"]
        lo, hi = edges[0], edges[-1]
        left, right, bottom = margin, width - 10, y0 + panel - 20
        peak = max(counts) or 1

        def x_of(v: float) -> float:
            return left + (right - left) * ((v - lo) / (hi - lo) if hi > lo else 0.5)

        for c, a, b in zip(counts, edges, edges[1:]):
            if c:
                draw.rectangle([x_of(a), bottom - (bottom - y0 - top) * c / peak, max(x_of(a), x_of(b) - 1), bottom],
                               fill=(90, 130, 200))
        draw.line([left, bottom, right, bottom], fill="black")
        for v, colour in ((minima.get(col), (220, 30, 30)), (maxima.get(col), (140, 40, 160))):
            if v is not None and lo <= v <= hi:
                draw.line([x_of(v), y0 + top, x_of(v), bottom], fill=colour, width=2)
        bounds = ", ".join(b for b in (f"min {minima[col]:g}" if col in minima else "",
                                       f"max {maxima[col]:g}" if col in maxima else "") if b)
        draw.text((left, y0 + 6), f"{col} (n={st['count']}, mean={st['mean']:.4g})" + (f"  [{bounds}]" if bounds else ""),
                  fill="black")
        draw.text((left, bottom + 4), f"{lo:.4g}", fill="black")
        draw.text((right - 40, bottom + 4), f"{hi:.4g}", fill="black")
    with atomic_path(path) as tmp:
        img.save(tmp, format="PNG")
    return path


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

    def format_text(self, histograms: bool = True, plan: bool = True) -> str:
        """The terminal summary. plan=False leaves out the scorers and the plan of a dry run (the
        command line has printed them already, as the run went)."""
        if self.dry_run:
            return "\n".join((([f"scorer: {s}" for s in self.scorers] + [self.plan_text]) if plan else [])
                             + ["dry run: nothing was scored",
                                f"shards: {self.shards} ({self.shards_resumed} already done)"])
        lines = [f"scored {self.scored} of {self.rows} samples in {self.shards} shard(s)"
                 + (f" ({self.shards_resumed} shard(s) were already done)" if self.shards_resumed else "")
                 + (f"; {len(self.shards_failed)} shard(s) FAILED" if self.shards_failed else "")
                 + (f"; {len(self.shards_cut)} shard(s) CUT SHORT" if self.shards_cut else "")]
        for s in self.scorers:
            lines.append(f"  scorer: {s}")
        if self.samples_this_run:
            rate = self.samples_this_run / self.scoring_seconds if self.scoring_seconds else 0.0
            lines.append(f"  this run: {self.samples_this_run} samples in {self.seconds:.1f}s = "
                         f"{self.samples_per_second:.1f} samples/s ({rate:.1f} samples/s while scoring, "
                         f"after start-up, model load and probe)")
        for b in self.batch_sizes():
            extra = f", halved {b['halvings']}x ({', '.join(b['causes'])})" if b["halvings"] else ""
            extra += f", grown back {b['grown']}x" if b.get("grown") else ""
            lines.append(f"  batch size on {b['device']} (worker {b['worker']}, {b['scorer']}): "
                         f"planned {b['planned']}, final {b['final']}{extra}")
        lines.append("  status: " + ", ".join(f"{k} {self.status.get(k, 0)}" for k in STATUSES))
        if self.reasons:
            lines.append("  not scored / partly scored, by reason:")
            for reason, n in self.reasons.items():
                lines.append(f"    {n:>8}  {reason}")
        for col, th in [*self.thresholds.items(), *self.max_thresholds.items()]:
            bound = f">= {th['min']:g}" if "min" in th else f"<= {th['max']:g}"
            lines.append(f"  {col} {bound}: kept {th['kept']}, dropped {th['dropped']}"
                         + (f", no score {th['no_score']}" if th["no_score"] else ""))
        if self.thresholds or self.max_thresholds:
            lines.append(f"  kept {self.kept} of {self.rows} (all thresholds met)")
        for f in self.shards_failed:
            lines.append(f"  shard FAILED (no marker; --resume retries it): {f['url']}: {f['reason']}")
        for f in self.shards_cut:
            lines.append(f"  shard CUT SHORT (the samples before the break were scored, the rest have no row; "
                         f"re-create or re-download it): {f['url']}: {f['reason']}")
        for col, st in self.columns.items():
            if st.get("kind") == "number" and st.get("count"):
                lines.append(f"  {col}: n={st['count']} min={st['min']:.4g} mean={st['mean']:.4g} max={st['max']:.4g}"
                             + (f" (and {st['infinite']} infinite, left out)" if st.get("infinite") else ""))
                if histograms and st.get("histogram"):
                    lines.extend(text_histogram(st["histogram"]))
            elif st.get("kind") == "bool":
                lines.append(f"  {col}: true {st['true']}, false {st['false']}")
        for name, path in self.files.items():
            if path:
                lines.append(f"  {name}: {path}")
        return "\n".join(lines)


def write_summary(summary: RunSummary, path: str) -> None:
    write_json(path, summary.to_dict(), indent=2)
