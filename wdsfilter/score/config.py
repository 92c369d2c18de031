"""ScoreConfig: every option of a scoring run, validated when it is built (config errors raise at
once, before any shard is read or any model is loaded)."""
from __future__ import annotations

import os
import re
from dataclasses import InitVar, dataclass, field, replace
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from ..stream.config import StageConfig
from ..core.errors import ConfigError
from ..core.selection import Selection, warn_renamed
from ..core.thresholds import Thresholds
from ..core.units import parse_size
from ..storage.writing import check_output_dir
from ..runfolder.tables import FORMATS as TABLE_FORMATS
from .ledger import RETRY_MODES
from .memory import DEVICE_KINDS
from .fastdecode import combine_floors
from .scorers.base import pixel_reader

FORMATS = tuple(TABLE_FORMATS)  # the score tables' formats, by name (runfolder/tables.py)
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
    # The rules of the run (--min, --max, --top, --bottom, --equal; wdsfilter/core/selection.py). A
    # sample is kept when some scorer scored it and every rule holds. Shares are known only when
    # every row is scored: resolved at the end of the run over its rows (runfolder/shares.py) for
    # its summary, report and thresholds.json; a row's `kept` column, written while scoring,
    # judges the other rules only (docs/score.md). dedup comes after scoring: not here.
    selection: Selection = field(default_factory=Selection)
    # Filtered copies of the shards (original member bytes of kept samples) go here: one per source
    # shard, or with samples_per_shard new shards of N kept samples each, PREFIX-000000.tar, ...,
    # written once at the end of the run by filter's resharder (runfolder/reshard.py).
    write_shards: Optional[str] = None
    samples_per_shard: Optional[int] = None
    prefix: Optional[str] = None  # [shard] with samples_per_shard
    # Model devices: "auto" (cuda when available, else cpu), "cpu", "cuda", "cuda:N".
    device: str = "auto"
    gpus: Optional[Tuple[int, ...]] = None
    # Explicit model-worker devices, one process each, e.g. ("cpu", "cpu") or ("cuda:0", "cuda:1")
    # (or a device kind registered with memory.py, as the tests' simulated "sim:gpu0").
    # Overrides device/gpus; "cpu" alone scores in the main process.
    devices: Optional[Tuple[str, ...]] = None
    # Where the CLIP scorer's JPEGs are decoded: "cpu" (PIL in the decode workers), "cuda" (in
    # batches on the model's GPU: torchvision's nvJPEG decode, resize and crop there; other images
    # and JPEGs the GPU refuses take the CPU path, per sample), "auto" (cuda when every model
    # worker is on a GPU). Local engine.
    decode_device: str = "auto"
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
    # The old names of the selection's rules, taken with a DeprecationWarning (selection= now).
    thresholds: InitVar[Optional[Dict[str, float]]] = None
    max_thresholds: InitVar[Optional[Dict[str, float]]] = None
    top_shares: InitVar[Optional[Dict[str, float]]] = None
    bottom_shares: InitVar[Optional[Dict[str, float]]] = None

    def __post_init__(self, thresholds=None, max_thresholds=None, top_shares=None, bottom_shares=None):
        # one validator per group of options, in this order: the first wrong option is the one named
        self._take_old_names(thresholds, max_thresholds, top_shares, bottom_shares)
        if not isinstance(self.stage, StageConfig):  # before the checks that read its options
            raise ConfigError(f"stage must be a StageConfig (wdsfilter.StageConfig(...)), got {type(self.stage).__name__}")
        self._check_outputs()
        self._check_scorers()
        self._check_sizes()
        self._check_modes()
        self._check_join()
        self._check_limits()
        self._check_devices()
        self._check_selection()
        self.scorer_options = {str(k): dict(v) for k, v in dict(self.scorer_options).items()}

    def _check_outputs(self) -> None:
        """--out and --write-shards: given, and writable before any work."""
        if not self.out or not isinstance(self.out, str):
            raise ConfigError("out: a folder for the score files is required (--out DIR)")
        # an s3:// --out: its bucket is checked here, the write itself when the lock object is taken
        check_output_dir(self.out, "--out", self.stage.storage_options)
        if self.write_shards:
            check_output_dir(self.write_shards, "--write-shards", self.stage.storage_options)
        self._check_reshard()

    def _check_scorers(self) -> None:
        if isinstance(self.scorers, (str, bytes)) or not isinstance(self.scorers, Sequence):
            self.scorers = (self.scorers,)
        self.scorers = tuple(self.scorers)
        if not self.scorers:
            raise ConfigError("at least one scorer is required (--scorer clip)")

    def _check_sizes(self) -> None:
        """The plan's settings: counts ('auto' or a number), byte sizes, the memory policy."""
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

    def _check_modes(self) -> None:
        """The score files' format and how the run treats an earlier one in --out (resume,
        overwrite, retry_failed)."""
        if self.format not in FORMATS:
            raise ConfigError(f"format must be one of {FORMATS}, got {self.format!r}")
        self.retry_failed = {True: "transient", False: None, "": None}.get(self.retry_failed, self.retry_failed)
        if self.retry_failed is not None:
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

    def _check_limits(self) -> None:
        """The ceilings of the plan and the probe, and what the run prints."""
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

    def _check_devices(self) -> None:
        """device, decode_device, gpus and devices: each well formed, and not contradicting another."""
        self.device = str(self.device)
        if self.decode_device not in ("auto", "cpu", "cuda"):
            raise ConfigError(f"decode_device must be auto, cpu or cuda, got {self.decode_device!r}")
        if self.decode_device == "cuda" and self.device == "cpu":
            raise ConfigError("--decode-device cuda decodes on the model's GPU, and --device cpu has none; "
                              "drop one of them")
        if not (self.device in ("auto", "cpu", "cuda") or re.match(r"^cuda:\d+$", self.device)):
            raise ConfigError(f"device must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        if self.gpus is not None:
            self.gpus = parse_gpus(self.gpus)
            if self.device == "cpu":
                raise ConfigError("gpus were given with device=cpu; drop one of them")
        if self.devices is not None:
            self.devices = parse_devices(self.devices)

    def _check_reshard(self) -> None:
        """samples_per_shard and prefix: filter's --samples-per-shard and --prefix, with write_shards."""
        n = self.samples_per_shard
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ConfigError(f"--samples-per-shard must be a whole number >= 1, got {n!r}")
        if n is not None and not self.write_shards:
            raise ConfigError("--samples-per-shard only applies with --write-shards DIR")
        if self.prefix is not None and n is None:
            raise ConfigError("--prefix names the shards --samples-per-shard writes; the copy of each source shard "
                              "keeps the source's name: add --samples-per-shard N, or drop --prefix")
        if self.prefix is not None and (not isinstance(self.prefix, str) or not self.prefix
                                        or self.prefix != os.path.basename(self.prefix) or self.prefix in (".", "..")):
            raise ConfigError(f"--prefix must be a file name's start (no folder), got {self.prefix!r}")
        if n is not None and self.prefix is None:
            self.prefix = "shard"  # filter's default

    @property
    def reshards(self) -> bool:
        """--write-shards as new shards of N at the end of the run, not a copy of each source shard."""
        return bool(self.write_shards and self.samples_per_shard)

    @property
    def copies_shards(self) -> bool:
        """--write-shards as a filtered copy of each source shard, written with its score file."""
        return bool(self.write_shards and not self.samples_per_shard)

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

    def _take_old_names(self, minima, maxima, top, bottom) -> None:
        """thresholds=, max_thresholds=, top_shares=, bottom_shares= (the fields before selection=)
        join the selection, each with a DeprecationWarning."""
        old = {"thresholds": ("min", minima), "max_thresholds": ("max", maxima), "top_shares": ("top", top),
               "bottom_shares": ("bottom", bottom)}
        given = {name: (kind, value) for name, (kind, value) in old.items() if value}
        for name in given:
            warn_renamed(name, "selection", "ScoreConfig")
        if given:
            words = {kind: dict(value) for kind, value in given.values()}
            self.selection = (self.selection or Selection()).merged(Selection.from_dict(words, "ScoreConfig"))

    def _check_selection(self) -> None:
        if not isinstance(self.selection, Selection):
            raise ConfigError(f"selection must be a wdsfilter.Selection, got {type(self.selection).__name__}")
        if self.selection.dedup:
            raise ConfigError(f"dedup is decided after scoring: run `wdsfilter dedup {self.out or 'OUT'}`, then "
                              f"`wdsfilter filter {self.out or 'OUT'} --dedup` (or wdsfilter.loader(..., dedup=True))")
        if self.copies_shards and self.selection.shares:  # written as rows are scored, before the cut is known
            c, kind, _ = self.selection.shares[0]
            raise ConfigError(f"--write-shards with --{kind} {c}=...%: a share is known only when the whole run is "
                              f"scored, after a copy of each shard is written; add --samples-per-shard N (the kept "
                              f"samples resharded at the end of the run, the share resolved by then), or run "
                              f"`wdsfilter filter {self.out} --{kind} {c}=P% --write-shards DIR` after scoring")

    @property
    def bounds(self) -> Thresholds:
        """The selection's minima and maxima as one Thresholds (the summary's counts per bound)."""
        return self.selection.bounds

    def threshold_columns(self) -> List[str]:
        """Every column a rule names, each once."""
        return self.selection.columns()

    @property
    def row_bounds(self) -> Optional[list]:
        """The rules of the row model (rows.complete_row: minima, maxima, text columns), or None
        when the run has none: decided once per run by the runners, not per row."""
        return self.selection.row_rules() or None

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
        scale they all can use (Scorer.decode_floor), and not at all where none reads pixels
        (Scorer.image_pixels: caption, size)."""
        # Only the scorers that read pixels decide how images are decoded (Scorer.image_pixels);
        # a duck-typed scorer without decode_floor needs the full image.
        pixels = [s for s in scorers if pixel_reader(s)]
        floors = [getattr(s, "decode_floor", lambda: None)() for s in pixels]
        floor = combine_floors(floors) if pixels else None
        # Scorers of different floors: the member's bytes stay, so each one is given the pixels it
        # would get alone (transport.OwnPixels decodes them again at its own scale).
        differ = floor is not None and len({tuple(f) if f else None for f in floors}) > 1
        return replace(self.stage, emit_rejects=True, starvation_samples=0, starvation_seconds=0.0,
                       check_first_shard=False, decode_floor=floor,
                       keep_image_bytes=differ or any(getattr(s, "image_bytes", False) for s in scorers),
                       decode_pixels=not scorers or bool(pixels),
                       # JPEGs left undecoded for the model's device only where every scorer that reads
                       # pixels decodes them there (--decode-device), at one scale
                       defer_jpeg=bool(pixels) and not differ and all(getattr(s, "decode_on_device", False)
                                                                      for s in pixels))


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


def parse_devices(value) -> Tuple[str, ...]:
    """'cpu' or ["cuda:0", "cuda:1"] -> the model workers' devices, each cpu, cuda:N or a registered kind."""
    devices = tuple(str(d) for d in ((value,) if isinstance(value, str) else value))
    if not devices:
        raise ConfigError("devices: empty list")
    for d in devices:
        if not (d == "cpu" or re.match(r"^cuda:\d+$", d) or re.match(r"^(\w+):\w+$", d)
                and d.partition(":")[0] in DEVICE_KINDS):
            raise ConfigError(f"devices: {d!r} is not cpu or cuda:N"
                              + "".join(f" or {k}:NAME" for k in DEVICE_KINDS))
    return devices


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


def _old_name(name: str, kind: str):
    """cfg.thresholds and friends, read: the selection's rules of that kind (with a DeprecationWarning)."""
    def get(self):
        import sys
        import warnings
        if sys._getframe(1).f_globals.get("__name__") == "dataclasses":
            return None  # dataclasses.replace copying the init arguments: the selection carries the rules
        warnings.warn(f"ScoreConfig.{name} is deprecated; read ScoreConfig.selection (a wdsfilter.Selection: "
                      f"its {'minima' if kind == 'min' else 'maxima' if kind == 'max' else kind})",
                      DeprecationWarning, stacklevel=2)
        return dict(self.selection.rules_of(kind))
    return property(get)


for _name, _kind in (("thresholds", "min"), ("max_thresholds", "max"), ("top_shares", "top"),
                     ("bottom_shares", "bottom")):
    setattr(ScoreConfig, _name, _old_name(_name, _kind))
