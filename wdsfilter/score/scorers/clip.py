"""CLIP score: cosine similarity of an image and its caption in an open_clip model's embedding space.

    scorer = ClipScorer("local-dir:models/tiny-clip")           # or ("ViT-B-32", "laion2b_s34b_b79k")
    prepared = [scorer.prepare(sample) for sample in samples]    # DataLoader workers, CPU, no weights
    scorer.load("cuda:0")
    rows = scorer.score_batch(prepared)   # [{"clip_score": 0.31, "clip_truncated": False}, ...]

The score is the cosine of the L2-normalised embeddings, in [-1, 1] (not CLIP's logits, which are
the cosine times the learnt logit scale, usually 100). Captions longer than the model's context
are truncated, as every CLIP does, and flagged in `clip_truncated` so the engine can count them.
"""
from __future__ import annotations

import contextlib
from typing import Any, Dict, List, Optional

from ...config import StageConfig
from ...errors import ConfigError, DataError
from ...tokens import CaptionCleaner
from ..models import ClipSource, load_model, token_count
from .base import Scorer

PRECISIONS = ("auto", "fp32", "fp16", "bf16")


class ClipScorer(Scorer):
    name = "clip"
    media = ("image",)

    def __init__(self, model: str = "ViT-B-32", pretrained: Optional[str] = None, precision: str = "auto",
                 config: Optional[StageConfig] = None, cache_dir: Optional[str] = None):
        """model: an open_clip name ("ViT-B-32"), local-dir:PATH or hf-hub:ORG/REPO.
        pretrained: for a name, a tag ("laion2b_s34b_b79k"), a local checkpoint file, "random", or
        None for the name's usual weights. precision: "auto" (bf16 autocast on CUDA where supported,
        else fp16; fp32 on CPU), "fp32", "fp16" or "bf16". config: the StageConfig of the run, for
        its image token and extra tokens, which are stripped from captions (CLIP sees the pixels)."""
        if precision not in PRECISIONS:
            raise ConfigError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        self.model = model
        self.pretrained = pretrained
        self.precision = precision
        self.cache_dir = cache_dir
        cfg = config or StageConfig()
        self.cleaner = CaptionCleaner(cfg.image_token, "strip", cfg.known_image_tokens, cfg.extra_tokens)
        self.source = ClipSource.resolve(model, pretrained, cache_dir)  # raises ConfigError at once
        self.device: Optional[str] = None
        self.autocast_dtype = None
        self._model = None
        self._transform = None
        # Built here so a tokenizer that cannot be built fails at once, not in every worker.
        self._tokenizer = self.source.tokenizer()

    # Workers get the small config; transform, tokenizer and model are rebuilt where they are used.
    def __getstate__(self):
        state = dict(self.__dict__)
        state.update(_model=None, _transform=None, _tokenizer=None)
        return state

    def columns(self) -> List[str]:
        return ["clip_score", "clip_truncated"]

    @property
    def context_length(self) -> int:
        return self.source.context_length

    # -- CPU side ------------------------------------------------------------------------------
    def prepare(self, sample: Dict[str, Any]) -> Dict[str, Any]:
        if self._transform is None:
            self._transform = self.source.image_transform()
        if self._tokenizer is None:
            self._tokenizer = self.source.tokenizer()
        image = sample.get("image")
        if image is None:
            if sample.get("video") is not None:  # the OCR scorer of the same run may still score it
                raise DataError("missing_image", f"the CLIP scorer scores images; this sample is a video "
                                f"(.{sample.get('__media_ext__', 'video')}), which it leaves unscored")
            raise DataError("missing_image", "the CLIP scorer needs a decoded image (this sample has none)")
        caption = sample.get("caption")
        if caption is None:
            raise DataError("missing_caption", "no caption to score")
        caption, _ = self.cleaner.clean(caption)
        if not caption:
            raise DataError("empty_caption", "caption is empty after removing image tokens")
        tokens = self._tokenizer(caption)[0]
        truncated = token_count(self._tokenizer, caption) > self.context_length
        return {"image": self._transform(image), "tokens": tokens, "truncated": truncated}

    # -- model side ----------------------------------------------------------------------------
    def load(self, device: str) -> None:
        import torch

        self._model = load_model(self.source, device, self.cache_dir)
        self.device = str(device)
        cuda = torch.device(device).type == "cuda"
        precision = self.precision
        if precision == "auto":
            precision = ("bf16" if torch.cuda.is_bf16_supported() else "fp16") if cuda else "fp32"
        self.autocast_dtype = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]
        self.resolved_precision = precision

    def _autocast(self):
        import torch
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=torch.device(self.device).type, dtype=self.autocast_dtype)

    def score_batch(self, inputs: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
        if self._model is None:
            raise RuntimeError("ClipScorer.score_batch called before load(device)")
        import torch
        import torch.nn.functional as F

        images = torch.stack([x["image"] for x in inputs]).to(self.device, non_blocking=True)
        tokens = torch.stack([x["tokens"] for x in inputs]).to(self.device, non_blocking=True)
        with torch.inference_mode(), self._autocast():
            image_features = self._model.encode_image(images)
            text_features = self._model.encode_text(tokens)
        # Normalise in fp32: the cosine of half-precision embeddings is off by ~1e-3.
        image_features = F.normalize(image_features.float(), dim=-1)
        text_features = F.normalize(text_features.float(), dim=-1)
        scores = (image_features * text_features).sum(dim=-1).clamp(-1.0, 1.0).cpu().tolist()
        return [{"clip_score": s, "clip_truncated": bool(x["truncated"])} for s, x in zip(scores, inputs)]

    def unload(self) -> None:
        device, self._model = self.device, None
        if device and device.startswith("cuda"):
            import torch
            torch.cuda.empty_cache()

    # -- reporting -----------------------------------------------------------------------------
    def footprint(self) -> Dict[str, Any]:
        """Hints for the memory planner (which measures the real numbers once the model loads):
        parameter bytes (fp32 weights; autocast keeps them fp32) and the shape of one input."""
        size = self.source.preprocess_cfg["size"]
        h, w = (size, size) if isinstance(size, int) else tuple(size)
        hints = {"input_image": (3, h, w), "context_length": self.context_length}
        if self._model is not None:
            hints["param_bytes"] = sum(p.numel() * p.element_size() for p in self._model.parameters())
        else:
            hints["param_bytes"] = _param_bytes_without_weights(self.source)
        return hints

    def describe(self) -> str:
        where = f"device={self.device}, precision={getattr(self, 'resolved_precision', self.precision)}" \
            if self._model is not None else f"not loaded, precision={self.precision}"
        return f"clip: model={self.source.spec}, weights={self.source.weights_text()}, {where}"


def _param_bytes_without_weights(source: ClipSource) -> Optional[int]:
    """Build the architecture on the meta device (no memory, no init cost) and count."""
    import logging
    logging.disable(logging.WARNING)  # open_clip warns "initialized randomly": true, and meant here
    try:
        import open_clip
        import torch
        from ..models import _ensure_registered
        if not source.spec.startswith(("local-dir:", "hf-hub:")):
            _ensure_registered(source.spec, source.model_cfg)
        with torch.device("meta"):
            model = open_clip.create_model(source.spec, load_weights=False, device="meta",
                                           pretrained_text=False)
        return sum(p.numel() * 4 for p in model.parameters())
    except Exception:  # a hint only: the planner measures anyway
        return None
    finally:
        logging.disable(logging.NOTSET)
