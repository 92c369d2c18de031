"""The interface every scorer implements. Adding a scorer is adding one file in this folder and
one line in REGISTRY.

A scorer is split the way the work is: `prepare` runs in DataLoader worker processes on CPU
(decode-side work: preprocessing, frame sampling, tokenising), `load` and `score_batch` run in the
model worker on its device. A scorer object is a small picklable config until `load` is called.
"""
from __future__ import annotations

import abc
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from ..registry import build

# name -> "module:Class", imported only when used (heavy dependencies stay optional).
REGISTRY = {
    "clip": "wdsfilter.score.scorers.clip:ClipScorer",
    "ocr": "wdsfilter.score.scorers.ocr:OcrScorer",
    "hash": "wdsfilter.score.scorers.hash:HashScorer",
    "tmars": "wdsfilter.score.scorers.tmars:TmarsScorer",
    "caption": "wdsfilter.score.scorers.caption:CaptionScorer",
    "size": "wdsfilter.score.scorers.size:SizeScorer",
    "blur": "wdsfilter.score.scorers.blur:BlurScorer",
    "nsfw": "wdsfilter.score.scorers.nsfw:NsfwScorer",
    "aesthetic": "wdsfilter.score.scorers.aesthetic:AestheticScorer",
}


class Noted(NamedTuple):
    """What prepare() returns for a sample it can score only from part of its data (a video cut
    short): the model input, and the note the sample's row gets. The row is then "partial" with
    this reason and message (rows.complete_row), on every engine: the note stays with the row in
    the main process and never travels to the model workers."""
    input: Any
    reason: str   # a finding kind as validate names it, e.g. "corrupt_video"
    message: str


# Reserved key of a sample's per-scorer errors dict (Prepare -> rows.complete_row, both engines):
# {scorer name: (reason, message)} of the inputs prepare() returned as Noted.
NOTES = "__notes__"


class Upstream(NamedTuple):
    """What a dependent scorer is given of a scorer it requires, for the same sample (attach()):
    that scorer's prepared input (as its score_batch received it: the pixels decoded once, in
    the decode worker) and its whole output dict, the private keys included (see Scorer.requires)."""
    input: Any
    output: Dict[str, Any]


def private(key: str) -> bool:
    """Output keys that start with "__" are handed to dependent scorers only: never a column."""
    return key.startswith("__")


class Scorer(abc.ABC):
    #: short name used on the command line and as the prefix of its score columns
    name: str = ""
    #: sample fields this scorer reads after decoding: "image" (PIL) and/or "video" (bytes)
    media: Sequence[str] = ("image",)
    #: whether prepare() reads the decoded image's pixels. False: it reads the member's bytes or
    #: none at all (the caption, an image header), and sample["image"] may be the member's bytes
    #: or a decoded image; a run whose scorers all say False decodes no image (nor checks its
    #: pixels: StageConfig.decode_pixels).
    image_pixels: bool = True
    #: names of the scorers whose outputs this one reads for the same sample, e.g. ("ocr", "clip").
    #: A run given this scorer adds the required ones it lacks (built with their options), runs
    #: them first, and hands this scorer their inputs and outputs through attach() in the model
    #: worker, where both engines score (modelrunner.py): nothing is decoded or sent twice. A
    #: required scorer's output dict may carry private keys (starting with "__", e.g. the OCR
    #: boxes), which dependents see and score files never do. A sample a required scorer failed
    #: on is not scored by this one (its row says why). Each scorer keeps its own back-off.
    requires: Sequence[str] = ()
    #: optional dependencies, (module, how to install it): checked with the other usage errors,
    #: before torch is imported or any model loads (scorerset.check_before_torch), so a missing one
    #: is a one-line error at once, e.g. (("imagehash", "pip install 'wdsfilter[dedup]'"),)
    needs: Sequence[Tuple[str, str]] = ()

    @abc.abstractmethod
    def columns(self) -> List[str]:
        """Names of the score columns this scorer writes, e.g. ["clip_score"]."""

    @classmethod
    def early_columns(cls, options: Dict[str, Any]) -> Optional[List[str]]:
        """The checks of `options` (this scorer's constructor options) that need no model and no
        heavy import, run before the run imports torch (a wrong model name answers at once), and the
        columns a scorer built with them writes, so thresholds are checked then too. None: known
        only once the scorer is built (its thresholds are checked then)."""
        return None

    def column_types(self) -> Dict[str, str]:
        """The Parquet type of score columns, by name: "float64", "int64", "bool", "string" or
        "list<float64>" (any pyarrow type alias, or list<alias>). A declared column has that type
        in every score file of the run, so a folder of score files has one schema even where a
        shard has no scored sample (a column of nulls): pyarrow.dataset, polars and HF datasets
        refuse files whose types differ. A column not declared is typed by its values, float64
        when it has none."""
        return {}

    @abc.abstractmethod
    def prepare(self, sample: Dict[str, Any]) -> Any:
        """CPU-side work for one decoded sample, in a DataLoader worker. Returns the model input
        (picklable: tensors / numpy arrays). Raises wdsfilter.core.errors.DataError for a sample that
        cannot be scored (its reason goes into the sample's row); returns Noted(input, reason,
        message) for one scored from incomplete data (the row becomes "partial")."""

    def fetch(self) -> None:
        """Download what load() needs. The engine calls it once, in its own process, before model
        workers start, so several workers never download into one folder at once."""

    def local_files(self) -> List[str]:
        """The files and folders of this machine that load() or prepare() read (a checkpoint, a
        model folder), absolute; default none. On a Ray cluster, a node that does not hold the
        same bytes at the same path gets a copy of them (score/engines/ray_files.py) and relocate()."""
        return []

    def relocate(self, moved: Dict[str, str]) -> None:
        """From now on read each of local_files() at moved[path] (a copy on this node). A scorer
        that lists local files but does not implement this is refused on a Ray cluster whose
        nodes lack them."""
        raise NotImplementedError

    @abc.abstractmethod
    def load(self, device: str) -> None:
        """Load the model onto `device` ("cpu", "cuda:0", ...). Called once per model worker."""

    @abc.abstractmethod
    def score_batch(self, inputs: List[Any]) -> List[Dict[str, Any]]:
        """Score prepared inputs; one dict {column: value} per input, in order. May raise
        torch.cuda.OutOfMemoryError, which the engine's back-off handles (halve and retry)."""

    def bind(self, required: Dict[str, "Scorer"]) -> None:
        """A scorer with `requires`: the required scorer objects of this run, by name. Called when
        the run's scorers are resolved (check that they fit together here: a ConfigError before
        any model loads) and again in each model process after they loaded and before this
        scorer's load(), so a dependent may use their loaded models (it must not pickle them)."""

    def attach(self, prepared: Any, upstream: Dict[str, Upstream], probe: bool = False) -> Any:
        """A scorer with `requires`, in the model worker: the input score_batch() is given for one
        sample, from this scorer's own prepared input and the required scorers' Upstream (input,
        output) for that sample. probe=True: the planner's probe asks for the input that costs
        most (e.g. every frame sent through the model), so the plan holds for every sample.
        Return `prepared` unchanged where nothing is needed."""
        return prepared

    def decode_floor(self) -> Optional[Tuple[int, int]]:
        """(short side, long side) of the smallest decoded image prepare() works from: the engine
        decodes larger JPEGs at the reduced DCT scale (1/2, 1/4, 1/8) that keeps both for every
        scorer of the run. None (the default): the full image."""
        return None

    def batch_key(self, prepared: Any) -> Any:
        """Inputs with equal keys may share a batch (e.g. OCR frames of the same size)."""
        return None

    def frame_count(self, prepared: Any) -> int:
        """How many frames (model images) one prepared input is: the planner measures memory per
        frame and the back-off fills sub-batches by frames, so a 3-frame video costs 3 images."""
        return 1

    def set_threads(self, threads: int) -> None:
        """The plan's model threads (on the CPU: the cores the decode workers leave). The engine
        sets torch's itself; a scorer running another library's threads (onnxruntime) applies it
        there. Called after load(), when the model worker is configured."""

    def unload(self) -> None:
        """Free the model (the engine calls this before re-planning or at exit)."""

    def describe(self) -> str:
        """One line for plans and summaries: model name, weights source, device."""
        return self.name


def overridden(scorer, method: str) -> Optional[Callable]:
    """scorer.<method> (batch_key, frame_count, column_types), or None where the scorer has the Scorer default
    or no such method: one batch key for all inputs, one frame per input. Callers resolve it once
    per batch, not per input."""
    bound = getattr(scorer, method, None)
    if bound is None or getattr(bound, "__func__", None) is getattr(Scorer, method):
        return None
    return bound


# How a video's per-frame values become its one value (--frame-reduce; every frame scorer).
FRAME_REDUCERS = ("mean", "max", "min")


def reduce_frames(values: Sequence[float], how: str) -> float:
    if how == "max":
        return max(values)
    if how == "min":
        return min(values)
    return sum(values) / len(values)


def pixel_reader(scorer) -> bool:
    """Whether a scorer's prepare() reads the decoded image's pixels (Scorer.image_pixels; a
    duck-typed scorer without the attribute does): only those decide how images are decoded."""
    return getattr(scorer, "image_pixels", True)


def make_scorer(name: str, **options) -> Scorer:
    return build(REGISTRY, name, "scorer", **options)
