"""The scoring engine: shards -> decode workers -> model workers -> per-shard score files.

    DataLoader workers   sample_pipeline(emit_rejects=True) + Prepare(scorers) + Chunk   (CPU)
    main process         dispatcher: gives every sample a row, forms batches, completes shards
    model workers        ModelRunner: score_batch through the OOM back-off   (LocalPool / ProcessPool)

Memory is bounded by construction: the DataLoader holds workers x prefetch chunks, the dispatcher
holds at most two batches of pending samples, each model worker at most QUEUE_DEPTH batches, and
the rows of shards still open. A shard's outputs are written (atomically) as soon as its shard-end
marker arrived and all its samples came back, then its completion marker, so --resume picks up
at shard granularity.
"""
from __future__ import annotations

import copy
import importlib
import inspect
import logging
import math
import os
import time
from typing import Callable, Dict, List, Optional, Sequence

from ..errors import ConfigError, WdsFilterError
from ..filtering.run import score_report
from ..pipeline import check_keys
from ..shards import expand_urls, unique_urls
from ..stages import MARKER, REJECT
from .config import ScoreConfig
from .faults import disk_full, is_disk_full, read_failed_reason
from .memory import host_status
from .modelworker import LocalPool, ProcessPool
from .outlock import OutputLock
from .outputs import BASE_FIELDS, RunSummary, plot_histograms, summarize_files, write_summary, write_table
from .planner import Plan, ProbeReport, make_plan
from .prepare import SHARD_END, Chunk, Prepare, collect_probe, keep_as_is, nbytes
from .resume import RunState
from .scorers.base import REGISTRY, Scorer, make_scorer
from .embeddings import write_embeddings
from .shardwriter import write_filtered
from .transport import unpack

log = logging.getLogger("wdsfilter")


class NothingScoredError(WdsFilterError, RuntimeError):
    """The run finished and no sample got a score: the counts say why."""


# -- scorers and devices -------------------------------------------------------------------------
def _scorer_class(spec: str):
    if spec in REGISTRY:
        module, cls = REGISTRY[spec].split(":")
    elif ":" in spec:
        module, cls = spec.split(":", 1)
    else:
        raise ConfigError(f"unknown scorer {spec!r}; available: {', '.join(sorted(REGISTRY))}, "
                          f"or module:Class for your own Scorer")
    try:
        return getattr(importlib.import_module(module), cls)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"scorer {spec!r} is not available: {type(e).__name__}: {e}") from None


def resolve_scorers(cfg: ScoreConfig) -> List[Scorer]:
    """Scorer instances (unloaded) for cfg.scorers; options and threshold columns checked."""
    scorers = []
    used_options = set()
    for spec in cfg.scorers:
        if not isinstance(spec, str):
            if not all(hasattr(spec, a) for a in ("prepare", "load", "score_batch", "columns")):
                raise ConfigError(f"{spec!r} is not a Scorer (it needs prepare, load, score_batch, columns)")
            if cfg.scorer_options.get(getattr(spec, "name", "")):
                raise ConfigError(f"options {sorted(cfg.scorer_options[spec.name])} were given for the {spec.name} "
                                  f"scorer, which was passed as an object: set them on the object instead")
            scorers.append(spec)
            continue
        cls = _scorer_class(spec)
        name = spec if spec in REGISTRY else (getattr(cls, "name", "") or spec)
        options = dict(cfg.scorer_options.get(name, {}))
        used_options.add(name)
        param = inspect.signature(cls).parameters.get("config")
        if "config" not in options and param is not None and "StageConfig" in str(param.annotation):
            # The run's stage config (a `config: StageConfig` parameter): its image token and size
            # guard apply inside the scorer too.
            options["config"] = cfg.stage
        try:
            scorer = make_scorer(spec, **options) if spec in REGISTRY else cls(**options)
        except TypeError as e:
            accepted = ", ".join(p for p in inspect.signature(cls).parameters if p not in ("self", "kwargs"))
            raise ConfigError(f"scorer {name!r}: {e}; its options are: {accepted}") from None
        scorers.append(scorer)
    unknown = set(cfg.scorer_options) - used_options - {s.name for s in scorers}
    if unknown:
        raise ConfigError(f"options given for scorer(s) {sorted(unknown)} that are not in this run "
                          f"({', '.join(s.name for s in scorers)})")
    names = [s.name for s in scorers]
    if len(set(names)) != len(names) or not all(names):
        raise ConfigError(f"scorers need distinct, non-empty names; got {names}")
    columns = score_columns(scorers)
    missing = list(dict.fromkeys(c for c in [*cfg.thresholds, *cfg.max_thresholds] if c not in columns))
    if missing:
        raise ConfigError(f"threshold(s) on {missing}, which no scorer of this run writes; "
                          f"score columns: {', '.join(columns)}")
    return scorers


def score_columns(scorers: Sequence[Scorer]) -> List[str]:
    columns: List[str] = []
    for s in scorers:
        for c in s.columns():
            if c in columns or c in BASE_FIELDS:
                raise ConfigError(f"scorer {s.name!r} writes column {c!r}, which is taken; rename it")
            columns.append(c)
    return columns


def resolve_devices(cfg: ScoreConfig) -> List[str]:
    """Model worker devices, one entry per process started before planning."""
    if cfg.devices:
        return list(cfg.devices)
    if cfg.device == "cpu":
        return ["cpu"] * (cfg.replicas if isinstance(cfg.replicas, int) else 1)
    try:
        import torch
        has_cuda = torch.cuda.is_available()
    except ImportError as e:
        raise ConfigError("scoring needs PyTorch: pip install 'wdsfilter[score]'") from e
    if not has_cuda:
        if cfg.device == "auto" and cfg.gpus is None:
            return ["cpu"] * (cfg.replicas if isinstance(cfg.replicas, int) else 1)
        raise ConfigError(f"device={cfg.device!r}{f' gpus={list(cfg.gpus)}' if cfg.gpus else ''} but no CUDA device "
                          f"is available (torch.cuda.is_available() is False); use --device cpu")
    count = torch.cuda.device_count()
    if cfg.device.startswith("cuda:"):
        gpus = [int(cfg.device.split(":")[1])]
    else:
        gpus = list(cfg.gpus) if cfg.gpus is not None else list(range(count))
    bad = [g for g in gpus if g >= count]
    if bad:
        raise ConfigError(f"GPU(s) {bad} requested but only {count} visible (0..{count - 1})")
    return [f"cuda:{g}" for g in gpus]


def _identity(cfg: ScoreConfig, scorers: Sequence[Scorer]) -> dict:
    """What the outputs depend on; --resume refuses to mix outputs of different settings."""
    def simple(v):
        return isinstance(v, (str, int, float, bool, type(None))) or (
            isinstance(v, (list, tuple)) and all(simple(x) for x in v))
    described = []
    for s in scorers:
        cls = type(s)
        described.append({"name": s.name, "class": f"{cls.__module__}:{cls.__qualname__}", "columns": s.columns(),
                          "options": {k: v for k, v in sorted(vars(s).items()) if not k.startswith("_") and simple(v)}})
    stage = {k: v for k, v in cfg.stage.to_dict().items()
             if k not in ("emit_rejects", "starvation_samples", "starvation_seconds")}
    identity = {"scorers": described, "thresholds": cfg.thresholds, "stage": stage, "format": cfg.format,
                "write_shards": os.path.abspath(cfg.write_shards) if cfg.write_shards else None}
    if cfg.max_thresholds:  # only when set, so runs without maxima keep the identity they had
        identity["max_thresholds"] = cfg.max_thresholds
    return identity


def make_pool(devices: List[str], scorers: Sequence[Scorer]):
    if len(devices) == 1 and (devices[0] == "cpu" or devices[0].startswith("sim:")):
        return LocalPool(devices[0], scorers)
    return ProcessPool(devices, scorers)


# -- rows -------------------------------------------------------------------------------------
class ShardRows:
    """The rows of one shard while it is being scored."""

    def __init__(self, url: str):
        self.url = url
        self.rows: List[dict] = []
        self.prep_errors: Dict[int, dict] = {}
        self.pending = 0
        self.ended = False
        self.error: Optional[str] = None
        self.failed: Optional[str] = None  # the stream failed: not read to its end
        self.members = 0

    def add(self, key: str, status: Optional[str] = None, reason: Optional[str] = None,
            message: Optional[str] = None) -> int:
        index = len(self.rows)
        self.rows.append({"key": key, "shard": self.url, "index": index, "status": status, "reason": reason,
                          "message": message, "kept": False})
        return index


def within(row: dict, minima: Dict[str, float], maxima: Dict[str, float]) -> bool:
    """Every threshold column has a value within its bounds (a missing value never passes)."""
    def ok(c):
        v = row.get(c)
        return v is not None and not (isinstance(v, float) and math.isnan(v))
    return (all(ok(c) and row[c] >= t for c, t in minima.items())
            and all(ok(c) and row[c] <= t for c, t in maxima.items()))


def complete_row(row: dict, scorers: Sequence[Scorer], scores: dict, errors: dict,
                 thresholds: Dict[str, float], max_thresholds: Optional[Dict[str, float]] = None) -> None:
    """Fill a sample's row from its scores and its per-scorer errors (prepare or scoring).

    kept: some scorer scored it and every threshold column is within bounds. A partial row (say a
    video, which OCR scores and CLIP cannot) is kept when the thresholds only involve the scorers
    that succeeded, so filtering agrees with wdsfilter.loader(scores=...), which judges by the
    threshold columns alone; without thresholds, kept means every scorer succeeded."""
    row.update(scores)
    failed = [s.name for s in scorers if s.name in errors]
    if not failed:
        row["status"] = "scored"
    else:
        row["status"] = "partial" if len(failed) < len(scorers) else "failed"
        reasons = []
        for name in failed:
            if errors[name][0] not in reasons:
                reasons.append(errors[name][0])
        row["reason"] = ";".join(reasons)
        row["message"] = "; ".join(f"{name}: {errors[name][1]}" for name in failed)
    max_thresholds = max_thresholds or {}
    if thresholds or max_thresholds:
        row["kept"] = row["status"] in ("scored", "partial") and within(row, thresholds, max_thresholds)
    else:
        row["kept"] = row["status"] == "scored"


# -- the run ----------------------------------------------------------------------------------------
class Engine:
    def __init__(self, shards, cfg: ScoreConfig, echo: Optional[Callable[[str], None]] = None):
        self.cfg = cfg
        self.echo = echo or (lambda text: None)
        self.urls, repeats = unique_urls(expand_urls(shards, cfg.stage.allow_pipe, cfg.stage.allow_remote))
        if repeats:
            log.warning(f"{len(repeats)} shard(s) given more than once are scored once: "
                        f"{', '.join(repeats[:3])}{' ...' if len(repeats) > 3 else ''}")
        self.scorers = resolve_scorers(cfg)
        self.columns = score_columns(self.scorers)
        # The model side gets its own copies: a loaded model must never be pickled into a
        # decode worker (spawn would copy the weights into every one of them).
        self.model_scorers = [copy.deepcopy(s) for s in self.scorers]
        # One run per --out (outlock.py): taken before the run state, which deletes temporaries.
        self.lock = None if cfg.dry_run else OutputLock(cfg.out).acquire()
        try:
            self.state = RunState(cfg, self.urls, _identity(cfg, self.scorers))
        except BaseException as e:
            self.release_lock()
            if is_disk_full(e):
                raise disk_full(e, "the run state") from None
            raise
        self.summary = RunSummary(out=cfg.out, shards=len(self.urls), dry_run=cfg.dry_run)
        self.shards: Dict[str, ShardRows] = {}
        self.completed = 0
        self.rows_done = 0
        self.progress = None

    # -- planning ---------------------------------------------------------------------------
    def _probe(self, pool, todo: List[str]) -> ProbeReport:
        cfg = self.cfg
        inputs, prep_seconds, scanned = collect_probe(todo, cfg.scoring_stage_config(self.scorers), self.scorers,
                                                      cfg.probe_samples, cfg.probe_scan)
        report = ProbeReport(samples=len(inputs), scanned=scanned, prepare_seconds=prep_seconds)
        if inputs:
            report.prepared_bytes = int(sum(nbytes(x) for x in inputs) / len(inputs))
        if len(inputs) >= 2:
            measured = pool.probe(inputs)
            report.sizes = tuple(measured["sizes"])
            report.peaks = measured["peaks"]
            report.retained = measured.get("retained", {})
            report.seconds_per_sample = measured["seconds_per_sample"]
            report.timings = measured.get("timings", {})
            report.threads = measured["threads"]
            report.oom_at = measured["oom_at"]
            report.errors = measured.get("errors", {})
        return report

    def _apply(self, pool, plan: Plan, reports: List[dict]) -> None:
        first = {}
        for r in reports:
            first.setdefault(r["device"], r["worker"])
        for dp in plan.devices:
            for _ in range(dp.replicas - 1):
                pool.add_replica(dp.device)
        batch_of = {dp.device: dp for dp in plan.devices}
        self.batch_size_of = {}
        for w in pool.workers:
            dp = batch_of[pool.device_of(w)]
            pool.configure(w, batch_size=dp.batch_size, threads=dp.threads, min_free_host=plan.min_free_host,
                           scorer_batch=dp.scorer_batch)
            self.batch_size_of[w] = dp.batch_size

    # -- dispatching ----------------------------------------------------------------------------
    def _shard(self, url: str) -> ShardRows:
        s = self.shards.get(url)
        if s is None:
            s = self.shards[url] = ShardRows(url)
        return s

    def _row_done(self, n: int = 1) -> None:
        self.rows_done += n
        if self.progress is not None:
            self.progress.update(n)

    def _take(self, item: dict, pending: List[tuple]) -> None:
        marker = item.get(MARKER)
        url = item.get("__url__", "")
        s = self._shard(url)
        if marker == SHARD_END:
            s.ended, s.error, s.members = True, item.get("error"), item.get("members", 0)
            s.failed = item.get("failed")
            self._maybe_finish(s)
        elif marker:
            s.add(item.get("__key__", ""), "rejected", item.get(REJECT), item.get("__message__"))
            self._row_done()
        else:
            index = s.add(item["__key__"])
            if item["inputs"]:
                s.prep_errors[index] = item["errors"]
                s.pending += 1
                pending.append(((url, index), item["inputs"]))
            else:
                complete_row(s.rows[index], self.scorers, {}, item["errors"], self.cfg.thresholds,
                             self.cfg.max_thresholds)
                self._row_done()

    def _collect(self, pool, timeout: float) -> None:
        for _batch_id, _worker, results in pool.poll(timeout):
            touched = set()
            for (url, index), scores, errors in results:
                s = self.shards[url]
                errors = {**s.prep_errors.pop(index, {}), **errors}
                complete_row(s.rows[index], self.scorers, scores, errors, self.cfg.thresholds,
                             self.cfg.max_thresholds)
                s.pending -= 1
                touched.add(url)
            self._row_done(len(results))
            for url in touched:
                self._maybe_finish(self.shards[url])

    def _dispatch(self, pool, pending: List[tuple], final: bool = False) -> List[tuple]:
        """Send full batches to free workers; block while too much is pending; with final, send
        the rest. Returns what is still pending."""
        while pending:
            worker = pool.idle_worker()
            if worker is None:
                if len(pending) < 2 * max(self.batch_size_of.values()) and not final:
                    return pending
                self._collect(pool, 0.5)  # bounded memory: wait for a model worker
                continue
            size = self.batch_size_of[worker]
            idle_model = not pool.in_process and pool.in_flight() == 0
            if len(pending) < size and not final and not idle_model:
                return pending
            batch, pending = pending[:size], pending[size:]
            self.batch_id += 1
            pool.submit(worker, self.batch_id, batch)
            self._collect(pool, 0.0)
        return pending

    def _maybe_finish(self, s: ShardRows) -> None:
        if not (s.ended and s.pending == 0):
            return
        cfg, state = self.cfg, self.state
        if s.failed:  # not read to its end: no outputs, no marker
            self.summary.shards_failed.append({"url": s.url, "reason": read_failed_reason(s.failed)})
            del self.shards[s.url]
            return
        write_table(s.rows, self.columns, state.score_path(s.url), cfg.format)
        write_embeddings(cfg.out, state.names[s.url], s.rows)
        filtered = None
        if cfg.write_shards:
            keep = {r["key"] for r in s.rows if r["kept"]}
            try:
                filtered = write_filtered(s.url, keep, state.filtered_path(s.url), cfg.stage.rekey,
                                          cfg.stage.allow_pipe, cfg.stage.allow_remote)
            except OSError as e:  # the shard cannot be read again (a pipe: command failed): no marker
                if is_disk_full(e):
                    raise
                self.summary.shards_failed.append({"url": s.url, "reason": f"filtered shard not written: {e}"})
                del self.shards[s.url]
                return
        counts: Dict[str, int] = {}
        for r in s.rows:
            counts[r["status"]] = counts.get(r["status"], 0) + 1
        state.mark_done(s.url, {"rows": len(s.rows), "status": counts, "kept": sum(r["kept"] for r in s.rows),
                                "members": s.members, "error": s.error, "filtered": filtered})
        del self.shards[s.url]
        self.completed += 1
        if self.progress is not None:
            self.progress.set_postfix_str(f"shards {self.completed}/{self.n_todo}", refresh=False)

    def _score(self, pool, plan: Plan, todo: List[str]):
        import torch.utils.data
        from ..pipeline import sample_pipeline
        from ..tally import StatsSink, Tally
        cfg = self.cfg
        sink = StatsSink()
        tally = Tally(0, 0, name="wdsfilter score")
        pipeline = sample_pipeline(todo, cfg.scoring_stage_config(self.scorers), tally, extra=[Prepare(self.scorers)],
                                   sink=sink)
        pipeline.append(Chunk(plan.chunk))
        loader = torch.utils.data.DataLoader(
            pipeline, batch_size=None, shuffle=False, num_workers=plan.workers, collate_fn=keep_as_is,
            prefetch_factor=plan.prefetch if plan.workers else None,
            multiprocessing_context=cfg.worker_start if plan.workers else None)
        if cfg.progress:
            from tqdm import tqdm
            self.progress = tqdm(unit=" samples", desc="scoring", dynamic_ncols=True, smoothing=0.1)
            self.progress.set_postfix_str(f"shards 0/{len(todo)}")
        self.batch_id = 0
        pending: List[tuple] = []
        started = time.perf_counter()
        try:
            for chunk in loader:
                for item in unpack(chunk):
                    self._take(item, pending)
                pending = self._dispatch(pool, pending)
                self._collect(pool, 0.0)
            pending = self._dispatch(pool, pending, final=True)
            while pool.in_flight():
                self._collect(pool, 0.5)
            self._collect(pool, 0.0)
        finally:
            self.scoring_seconds = time.perf_counter() - started
            if self.progress is not None:
                self.progress.close()
        stage_tally = sink.read()
        sink.clear()
        try:
            os.rmdir(sink.folder)
        except OSError:
            pass
        return stage_tally

    # -- the whole run ---------------------------------------------------------------------------
    def release_lock(self) -> None:
        if self.lock is not None:
            self.lock.release()

    def run(self) -> RunSummary:
        try:
            return self._run()
        except OSError as e:
            if is_disk_full(e):  # stop at once, with one clear line (faults.py)
                raise disk_full(e, "the run's outputs") from None
            raise
        finally:
            self.release_lock()

    def _run(self) -> RunSummary:
        cfg, state, summary = self.cfg, self.state, self.summary
        start = time.perf_counter()
        todo = state.pending()
        if todo:  # a caption/image key no sample of the first shard has: raise before loading models
            check_keys(todo[0], cfg.scoring_stage_config())
        summary.shards_resumed = state.resumed_from_markers
        self.n_todo = len(todo)
        if state.resumed_from_markers:
            self.echo(f"resume: {state.resumed_from_markers} of {len(self.urls)} shard(s) already done, "
                      f"{len(todo)} to score")
        stage_tally = None
        if todo or cfg.dry_run:
            devices = resolve_devices(cfg)
            for scorer in self.scorers:  # downloads once, here, not in every model worker at once
                getattr(scorer, "fetch", lambda: None)()
            pool = make_pool(devices, self.model_scorers)
            worker_stats: List[dict] = []
            try:
                reports = pool.start()
                summary.scorers = list(dict.fromkeys(d for r in reports for d in r["descriptions"]))
                for d in summary.scorers:
                    self.echo(f"scorer: {d}")
                probe = self._probe(pool, todo or self.urls)
                plan = make_plan(cfg, reports, probe, host_status(), len(todo or self.urls))
                summary.plan, summary.plan_text = plan.to_dict(), plan.describe()
                self.echo(summary.plan_text)
                for w in plan.warnings:
                    log.warning(w)
                if cfg.dry_run:
                    return summary
                self._apply(pool, plan, reports)
                stage_tally = self._score(pool, plan, todo)
            finally:
                worker_stats = pool.close()
            summary.workers = worker_stats
        else:
            summary.scorers = [s.describe() for s in self.scorers]
            self.echo(f"all {len(self.urls)} shard(s) are already scored; summarising")
        for url, s in self.shards.items():
            summary.shards_failed.append({"url": url, "reason": s.error or "shard did not finish"})
        ended = set(self.shards) | {f["url"] for f in summary.shards_failed}
        for url in todo:
            if not state.is_done(url) and url not in ended:
                reason = "could not be opened"
                if stage_tally is not None and stage_tally.by_shard.get(url, {}).get("unreadable_shard"):
                    ex = [e.message for e in stage_tally.examples.get("unreadable_shard", []) if e.shard == url]
                    reason = "unreadable: " + (ex[0] if ex else "could not be opened")
                summary.shards_failed.append({"url": url, "reason": reason})
        summary.shards_scored = self.completed
        summary.samples_this_run = self.rows_done
        summary.seconds = time.perf_counter() - start
        summary.scoring_seconds = getattr(self, "scoring_seconds", 0.0)
        if stage_tally is not None:
            summary.stage_counts = {"dropped": dict(stage_tally.dropped), "notes": dict(stage_tally.notes)}
        self._finish_summary()
        return summary

    def _finish_summary(self) -> None:
        cfg, summary = self.cfg, self.summary
        files = self.state.done_score_files()
        agg = summarize_files(files, self.columns, cfg.thresholds, cfg.histogram_bins, cfg.max_thresholds)
        for k, v in agg.items():
            setattr(summary, k, v)
        summary.files = {"scores": self.state.scores_dir, "summary": os.path.join(cfg.out, "summary.json"),
                         "histograms": plot_histograms(summary.columns, cfg.thresholds,
                                                       os.path.join(cfg.out, "histograms.png"), cfg.max_thresholds),
                         "filtered shards": cfg.write_shards}
        summary.files["report"] = score_report(cfg.out, cfg.thresholds, cfg.max_thresholds)
        write_summary(summary, summary.files["summary"])
        if summary.scored == 0:
            lines = [f"no sample was scored: {summary.rows} row(s) in {len(files)} finished shard(s) of "
                     f"{summary.shards}"]
            lines += [f"  {n} {r}" for r, n in summary.reasons.items()]
            lines += [f"  shard {f['url']}: {f['reason']}" for f in summary.shards_failed]
            lines.append(f"  details: {summary.files['summary']} and the score files in {self.state.scores_dir}")
            raise NothingScoredError("\n".join(lines))


def run_scoring(shards, cfg: ScoreConfig, echo: Optional[Callable[[str], None]] = None) -> RunSummary:
    return Engine(shards, cfg, echo).run()
