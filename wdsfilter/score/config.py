"""ScoreConfig: every option of a scoring run, validated when it is built (config errors raise at
once, before any shard is read or any model is loaded)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from ..config import StageConfig
from ..errors import ConfigError
from ..thresholds import Thresholds
from ..units import parse_size

FORMATS = ("parquet", "jsonl")
FIT_POLICIES = ("refuse", "clamp")
def _auto_or_int(value, what: str, minimum: int) -> Union[str, int]:
    if value is None or value == "auto":
        return "auto"
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{what} must be 'auto' or an integer, got {value!r}") from None
    if number < minimum or (not isinstance(value, int) and str(number) != str(value).strip()):
        raise ConfigError(f"{what} must be 'auto' or an integer >= {minimum}, got {value!r}")
    return number


@dataclass
class ScoreConfig:
    # Where results go: DIR/scores/<shard>.parquet, DIR/done/<shard>.json, DIR/summary.json.
    out: str = ""
    # Scorer names from wdsfilter.score.scorers.base.REGISTRY ("clip", "ocr"), "module:Class"
    # import paths, or Scorer instances (Python API). Several run in one pass over the data.
    scorers: Tuple[Any, ...] = ("clip",)
    # Constructor options per scorer name, e.g. {"clip": {"model": "ViT-B-32"}}.
    scorer_options: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    # Minimum and maximum score per column (--min, --max). A sample is kept when some scorer
    # scored it and every threshold column has a value within its bounds.
    thresholds: Dict[str, float] = field(default_factory=dict)
    max_thresholds: Dict[str, float] = field(default_factory=dict)
    # Shares of the run (--top COL=P%, --bottom COL=P%: percent per column). Known only when every
    # row is scored: resolved at the end of the run over its rows (runfolder/shares.py) for its
    # summary, report and thresholds.json; a row's `kept` column, written while scoring, judges
    # the minima and maxima only (docs/score.md).
    top_shares: Dict[str, float] = field(default_factory=dict)
    bottom_shares: Dict[str, float] = field(default_factory=dict)
    # Filtered copies of the shards (original member bytes of kept samples) go here.
    write_shards: Optional[str] = None
    # Model devices: "auto" (cuda when available, else cpu), "cpu", "cuda", "cuda:N".
    device: str = "auto"
    gpus: Optional[Tuple[int, ...]] = None
    # Explicit model-worker devices, one process each, e.g. ("cpu", "cpu") or ("cuda:0", "cuda:1")
    # (or a device kind registered with memory.py, as the tests' simulated "sim:gpu0").
    # Overrides device/gpus; "cpu" alone scores in the main process.
    devices: Optional[Tuple[str, ...]] = None
    batch_size: Union[str, int] = "auto"
    workers: Union[str, int] = "auto"  # decode (DataLoader) worker processes
    replicas: Union[str, int] = "auto"  # model processes per GPU
    prefetch: Union[str, int] = "auto"  # chunks each decode worker keeps ready
    # The most memory the run plans to use on each model device (GPU memory; host RAM on CPU).
    max_memory: Optional[int] = None
    # Share of the memory budget kept free for fragmentation and other processes.
    headroom: float = 0.10
    # A user setting that cannot fit: "refuse" (ConfigError with the numbers) or "clamp" (warn).
    fit: str = "refuse"
    # Ceilings for the automatic batch size (big CPU batches gain nothing and delay results).
    max_batch: int = 512
    cpu_max_batch: int = 32
    # Back-off halves the batch when free host RAM falls under this (None: the planner decides).
    min_free_host: Optional[int] = None
    format: str = "parquet"
    resume: bool = False
    overwrite: bool = False
    # Score again the samples the failure ledger lists (ledger.py) in a finished run: "transient"
    # (out of memory, a scorer's exception, a dead worker ...) or "all" (data errors too). Implies
    # resume: shards without a marker are scored too.
    retry_failed: Optional[str] = None
    dry_run: bool = False
    # Many workers on one --out (docs/scale.md): this process is one of any number that claim the
    # run's shards one by one (runfolder/claims.py); it starts the run in --out or joins the run
    # there, with the same settings and shards. task_index of task_count: the slice of the shard
    # list it takes first (else SLURM_ARRAY_TASK_ID / JOB_COMPLETION_INDEX, score/join.py); steal:
    # then the shards no worker claimed yet of the others' slices.
    join: bool = False
    task_index: Optional[int] = None
    task_count: Optional[int] = None
    steal: bool = True
    progress: bool = True
    # What the run tells `echo` (the command line: -q 0, default 1, -v 2): 0 nothing, 1 the scorers
    # and the plan in one line, 2 the whole plan (a dry run always shows it).
    verbosity: int = 2
    histogram_bins: int = 20
    # Prepared samples used to measure activation memory and speed before planning.
    probe_samples: int = 16
    # How many samples the probe may read looking for scorable ones before giving up.
    probe_scan: int = 2000
    # ... and for how long (seconds): the probe never holds up a small job.
    probe_seconds: float = 30.0
    # Start method of the decode workers: None is torch's default (fork on Linux: fast start).
    worker_start: Optional[str] = None
    stage: StageConfig = field(default_factory=StageConfig)

    def __post_init__(self):
        if not self.out or not isinstance(self.out, str):
            raise ConfigError("out: a folder for the score files is required (--out DIR)")
        from ..writing import check_output_dir  # an unwritable output is a usage error, before any work
        # an s3:// --out: its bucket is checked here, the write itself when the lock object is taken
        check_output_dir(self.out, "--out", self.stage.storage_options)
        if self.write_shards:
            check_output_dir(self.write_shards, "--write-shards", self.stage.storage_options)
        if isinstance(self.scorers, (str, bytes)) or not isinstance(self.scorers, Sequence):
            self.scorers = (self.scorers,)
        self.scorers = tuple(self.scorers)
        if not self.scorers:
            raise ConfigError("at least one scorer is required (--scorer clip)")
        self.batch_size = _auto_or_int(self.batch_size, "batch_size", 1)
        self.workers = _auto_or_int(self.workers, "workers", 0)
        self.replicas = _auto_or_int(self.replicas, "replicas", 1)
        self.prefetch = _auto_or_int(self.prefetch, "prefetch", 1)
        self.max_memory = parse_size(self.max_memory, "max_memory")
        self.min_free_host = parse_size(self.min_free_host, "min_free_host")
        if not 0 <= self.headroom < 1:
            raise ConfigError(f"headroom must be in [0, 1), got {self.headroom}")
        if self.fit not in FIT_POLICIES:
            raise ConfigError(f"fit must be one of {FIT_POLICIES}, got {self.fit!r}")
        if self.format not in FORMATS:
            raise ConfigError(f"format must be one of {FORMATS}, got {self.format!r}")
        self.retry_failed = {True: "transient", False: None, "": None}.get(self.retry_failed, self.retry_failed)
        if self.retry_failed is not None:
            from .ledger import RETRY_MODES
            if self.retry_failed not in RETRY_MODES:
                raise ConfigError(f"retry_failed must be one of {RETRY_MODES} (or True: transient), got "
                                  f"{self.retry_failed!r}")
            if self.overwrite:
                raise ConfigError("retry_failed and overwrite exclude each other: retry_failed continues a run")
            if self.dry_run:
                raise ConfigError("retry_failed scores; dry_run scores nothing: drop one of them")
            self.resume = True
        if self.resume and self.overwrite:
            raise ConfigError("resume and overwrite exclude each other: resume continues a run, overwrite restarts it")
        self._check_join()
        if self.max_batch < 1 or self.cpu_max_batch < 1:
            raise ConfigError("max_batch and cpu_max_batch must be >= 1")
        if not self.probe_seconds > 0:
            raise ConfigError(f"probe_seconds must be > 0, got {self.probe_seconds}")
        if self.probe_samples < 2:
            raise ConfigError("probe_samples must be >= 2 (two probe batch sizes give the per-sample memory)")
        if self.verbosity not in (0, 1, 2):
            raise ConfigError(f"verbosity must be 0 (quiet), 1 or 2 (verbose), got {self.verbosity!r}")
        if self.histogram_bins < 1:
            raise ConfigError("histogram_bins must be >= 1")
        self.device = str(self.device)
        if not (self.device in ("auto", "cpu", "cuda") or re.match(r"^cuda:\d+$", self.device)):
            raise ConfigError(f"device must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        if self.gpus is not None:
            self.gpus = parse_gpus(self.gpus)
            if self.device == "cpu":
                raise ConfigError("gpus were given with device=cpu; drop one of them")
        if self.devices is not None:
            if isinstance(self.devices, str):
                self.devices = (self.devices,)
            self.devices = tuple(str(d) for d in self.devices)
            if not self.devices:
                raise ConfigError("devices: empty list")
            from .memory import DEVICE_KINDS  # kinds registered by the tests ("sim:NAME")
            for d in self.devices:
                if not (d == "cpu" or re.match(r"^cuda:\d+$", d) or re.match(r"^(\w+):\w+$", d)
                        and d.partition(":")[0] in DEVICE_KINDS):
                    raise ConfigError(f"devices: {d!r} is not cpu or cuda:N"
                                      + "".join(f" or {k}:NAME" for k in DEVICE_KINDS))
        bounds = Thresholds.build(self.thresholds, self.max_thresholds)
        self.thresholds, self.max_thresholds = dict(bounds.minima), dict(bounds.maxima)
        self._check_shares()
        self.scorer_options = {str(k): dict(v) for k, v in dict(self.scorer_options).items()}
        if not isinstance(self.stage, StageConfig):
            raise ConfigError("stage must be a StageConfig")

    def _check_join(self) -> None:
        for name in ("task_index", "task_count"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ConfigError(f"{name} must be a whole number >= 0, got {value!r}")
        if self.task_index is not None or self.task_count is not None:
            self.join = True  # a slice is a worker's
        if not self.join:
            if not self.steal:
                raise ConfigError("--no-steal applies to the workers of a joined run (--join, --task-index)")
            return
        if self.overwrite:
            raise ConfigError("--join and --overwrite exclude each other: workers join the run in --out; start over "
                              "with a new --out (or one run with --overwrite first)")
        if self.retry_failed:
            raise ConfigError("--join and --retry-failed exclude each other: retry the failed samples of a finished "
                              "run with one `wdsfilter score --retry-failed` (docs/scale.md)")
        self.resume = True  # a worker continues the run it joins: the shards with a marker are done

    @property
    def bounds(self) -> Thresholds:
        """thresholds and max_thresholds as one Thresholds (the keep test of a row)."""
        return Thresholds(dict(self.thresholds), dict(self.max_thresholds))

    def _check_shares(self) -> None:
        from ..runfolder.shares import check_percent
        self.top_shares = {str(c): check_percent(p, f"--top {c}") for c, p in dict(self.top_shares or {}).items()}
        self.bottom_shares = {str(c): check_percent(p, f"--bottom {c}")
                              for c, p in dict(self.bottom_shares or {}).items()}
        if self.write_shards and self.shares:  # the shards are written as rows are scored, before the cut is known
            c, option = self.shares[0]
            raise ConfigError(f"--write-shards with {option} {c}=...%: a share is known only when the whole run is "
                              f"scored, after the shards are written; score without --write-shards, then run "
                              f"`wdsfilter filter {self.out} {option} {c}=P% --write-shards DIR`")

    @property
    def shares(self) -> List[Tuple[str, str]]:
        """(column, "--top" or "--bottom") of every share given."""
        return [(c, "--top") for c in self.top_shares] + [(c, "--bottom") for c in self.bottom_shares]

    def threshold_columns(self) -> List[str]:
        """Every column a threshold or a share names, each once."""
        return list(dict.fromkeys([*self.bounds.columns(), *(c for c, _ in self.shares)]))

    @property
    def row_bounds(self) -> Optional[Thresholds]:
        """bounds for the row model (rows.complete_row), or None when the run has no thresholds:
        decided once per run by the runners, not per row."""
        return self.bounds or None

    def plan_text(self, plan) -> Optional[str]:
        """What of the plan is shown at this verbosity: all of it, one line, or nothing."""
        if self.verbosity >= 2 or (self.dry_run and self.verbosity):
            return plan.describe()
        return plan.headline() if self.verbosity else None

    def scoring_stage_config(self, scorers: Sequence = ()) -> StageConfig:
        """The stage config of the scoring pipeline: rejects flow on as markers (every sample
        gets a row), and the starvation watchdog is off because markers keep the stream moving;
        a run that scores nothing is reported by the engine with its counts instead. The keys
        are checked once on the whole first shard before scoring (keycheck.check_keys), so the
        readers do not check again. With the run's `scorers`, JPEGs are decoded at the reduced
        scale they all can use (Scorer.decode_floor)."""
        from .fastdecode import combine_floors
        # A duck-typed scorer without decode_floor needs the full image.
        floor = combine_floors([getattr(s, "decode_floor", lambda: None)() for s in scorers]) if scorers else None
        return replace(self.stage, emit_rejects=True, starvation_samples=0, starvation_seconds=0.0,
                       check_first_shard=False, decode_floor=floor,
                       keep_image_bytes=any(getattr(s, "image_bytes", False) for s in scorers))


def parse_gpus(value) -> Tuple[int, ...]:
    """'0,1' or [0, 1] -> (0, 1)."""
    if isinstance(value, str):
        parts = [p for p in value.replace(" ", "").split(",") if p]
    else:
        parts = list(value)
    try:
        gpus = tuple(int(p) for p in parts)
    except (TypeError, ValueError):
        raise ConfigError(f"gpus must be a list of GPU indices like 0,1; got {value!r}") from None
    if not gpus or any(g < 0 for g in gpus):
        raise ConfigError(f"gpus must be a list of GPU indices like 0,1; got {value!r}")
    if len(set(gpus)) != len(gpus):
        raise ConfigError(f"gpus lists a GPU twice ({value!r}); use replicas=N for several model processes per GPU")
    return gpus


def parse_option(text: str) -> Tuple[str, str, Any]:
    """'clip.model=ViT-B-32' -> ("clip", "model", "ViT-B-32"); values are read as JSON when they
    parse (numbers, true/false, lists), else kept as strings."""
    import json
    name_key, sep, value = text.partition("=")
    name, dot, key = name_key.partition(".")
    if not sep or not dot or not name.strip() or not key.strip():
        raise ConfigError(f"--scorer-opt expects SCORER.OPTION=VALUE (e.g. clip.model=ViT-B-32), got {text!r}")
    try:
        parsed = json.loads(value)
    except ValueError:
        parsed = value
    return name.strip(), key.strip(), parsed
