"""CLIP score: cosine similarity of an image and its caption in an open_clip model's embedding space.

    scorer = ClipScorer("local-dir:models/tiny-clip")           # or ("ViT-B-32", "laion2b_s34b_b79k")
    prepared = [scorer.prepare(sample) for sample in samples]    # DataLoader workers, CPU, no weights
    scorer.load("cuda:0")
    rows = scorer.score_batch(prepared)   # [{"clip_score": 0.31, "clip_truncated": False, ...}, ...]

A video sample is scored on `frames` frames sampled uniformly over its duration (PyAV, as the OCR
scorer samples them; keyframes=True takes keyframes only): each frame against the caption, the
per-frame scores kept in `clip_score_frames` and reduced to `clip_score` by mean, max or min.

The score is the cosine of the L2-normalised embeddings, in [-1, 1] (not CLIP's logits, which are
the cosine times the learnt logit scale, usually 100). Captions longer than the model's context
are truncated, as every CLIP does, and flagged in `clip_truncated` so the engine can count them.
"""
from __future__ import annotations

import contextlib
from typing import Any, Dict, List, Optional

from ...stream.config import StageConfig
from ...core.errors import ConfigError, DataError
from ...media.images import DEFERRED, FULL_SIZE, decode_image
from ...stream.stages import IMAGE_BYTES, CaptionCleaner
from ..fastdecode import DECODE_WORKSPACE, REDUCING_GAP, ImageTransform, device_pixels
from ..models import PRECISIONS, ClipSource, check_model, load_model, resolve_precision, tokenize
from .base import FRAME_REDUCERS, Noted, Scorer, reduce_frames
from ...media.frames import sample_frames
from ..staging import Staging
from ...runfolder.embeddings import FIELD

REDUCERS = FRAME_REDUCERS
# Private output (scorers.base.private), once a dependent scorer asked (hand_text): the caption's
# L2-normalised fp32 embedding, on the model's device, for dependent scorers (tmars scores masked frames against it without encoding it again).
TEXT = "__clip_text__"
# Private output, once a dependent scorer asked (hand_image): the sample's L2-normalised fp32
# image embeddings, one row per frame (n, dim), on the model's device (aesthetic's heads read them).
IMAGE = "__clip_image__"
# Video frames are scaled to this long side while they are decoded; the model's own transform
# then resizes them to its input size (224 for most CLIPs), so larger frames would only cost time.
VIDEO_MAX_SIDE = 512


class ClipScorer(Scorer):
    name = "clip"
    media = ("image", "video")

    COLUMNS = ("clip_score", "clip_score_frames", "clip_frames", "clip_truncated")
    DEFAULT_MODEL = "ViT-B-32"

    @classmethod
    def early_columns(cls, options: Dict[str, Any]) -> List[str]:
        check_model(options.get("model", cls.DEFAULT_MODEL), options.get("pretrained"))
        return list(cls.COLUMNS)

    def __init__(self, model: str = DEFAULT_MODEL, pretrained: Optional[str] = None, precision: str = "auto",
                 config: Optional[StageConfig] = None, cache_dir: Optional[str] = None, frames: int = 3,
                 frame_reduce: str = "mean", keyframes: bool = False, save_embeddings: bool = False,
                 reducing_gap: Optional[float] = REDUCING_GAP, decode_on_device: bool = False):
        """model: an open_clip name ("ViT-B-32"), local-dir:PATH or hf-hub:ORG/REPO.
        pretrained: for a name, a tag ("laion2b_s34b_b79k"), a local checkpoint file, "random", or
        None for the name's usual weights. precision: "auto" (fp16 weights and autocast on CUDA, fp32
        on CPU), "fp32", "fp16" or "bf16" (checked on the device it loads on). config: the
        StageConfig of the run, for
        its image token and extra tokens, which are stripped from captions (CLIP sees the pixels),
        and its max_pixels, which guards video frames. frames, frame_reduce, keyframes: how a video
        sample is scored (see the module docstring). save_embeddings: hand each row's image and
        caption embeddings to the engine (wdsfilter/runfolder/embeddings.py). reducing_gap: JPEGs are
        decoded at reduced scale down to this many times the model input (docs/clip.md; None: full
        decode, pixels within 1/255 of open_clip's own transform). decode_on_device: JPEGs cross to the
        model worker as their bytes and are decoded there, in batches on the model's device
        (`--decode-device`; the engine sets it from the run's devices), other images as before."""
        if precision not in PRECISIONS:
            raise ConfigError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        if not isinstance(frames, int) or isinstance(frames, bool) or frames < 1:
            raise ConfigError(f"clip frames must be an integer >= 1, got {frames!r}")
        if frame_reduce not in REDUCERS:
            raise ConfigError(f"clip frame_reduce must be one of {REDUCERS}, got {frame_reduce!r}")
        self.frames, self.frame_reduce, self.keyframes = frames, frame_reduce, bool(keyframes)
        self.save_embeddings = bool(save_embeddings)
        self.model = model
        self.pretrained = pretrained
        self.precision = precision
        self.cache_dir = cache_dir
        cfg = config or StageConfig()
        self.max_pixels = cfg.max_pixels
        self.cleaner = CaptionCleaner(cfg.image_token, "strip", cfg.known_image_tokens, cfg.extra_tokens)
        self.source = ClipSource.resolve(model, pretrained, cache_dir)  # raises ConfigError at once
        self.reducing_gap = reducing_gap
        self.decode_on_device = bool(decode_on_device)
        self._text = False  # hand_text(): a dependent scorer reads the caption embeddings
        self._image = False  # hand_image(): a dependent scorer reads the image embeddings
        # uint8 pixels from the decode workers; normalised on the model's device (score_batch).
        self.transform = ImageTransform(self.source.preprocess_cfg, reducing_gap)
        self.device: Optional[str] = None
        self.autocast_dtype = None
        self.input_dtype = None
        self._model = None
        self._staging = None
        # Built here so a tokenizer that cannot be built fails at once, not in every worker.
        self._tokenizer = self.source.tokenizer()

    # Workers get the small config; tokenizer and model are rebuilt where they are used.
    def __getstate__(self):
        state = dict(self.__dict__)
        state.update(_model=None, _tokenizer=None, _staging=None)
        return state

    def local_files(self) -> List[str]:
        return self.source.local_files()

    def relocate(self, moved: Dict[str, str]) -> None:
        """The weights (and the tokenizer's config of a model folder) read from a copy."""
        self.source = self.source.moved(moved)
        self._tokenizer = None  # built again from the copy where prepare() needs it

    def columns(self) -> List[str]:
        return list(self.COLUMNS)

    def column_types(self) -> Dict[str, str]:
        return {"clip_score": "float64", "clip_score_frames": "list<float64>", "clip_frames": "int64",
                "clip_truncated": "bool"}

    def hand_text(self) -> None:
        """Add each caption's normalised embedding to the outputs as the private TEXT (a dependent
        scorer's bind() asks: tmars); without it the outputs are the columns (and embeddings)."""
        self._text = True

    def hand_image(self) -> None:
        """Add each sample's normalised image embeddings (one per frame) to the outputs as the
        private IMAGE (a dependent scorer's bind() asks: aesthetic); no second image encode."""
        self._image = True

    @property
    def context_length(self) -> int:
        return self.source.context_length

    def decode_floor(self):
        """The smallest decoded image the transform needs (reduced-scale JPEG decoding)."""
        return self.transform.decode_floor()

    def workspace_bytes(self) -> int:
        """Device memory beyond the model's that scoring takes at any batch size: the JPEG decode's
        groups (fastdecode.DECODE_WORKSPACE) when JPEGs are decoded on the model's device."""
        return DECODE_WORKSPACE if self.decode_on_device else 0

    # -- CPU side ------------------------------------------------------------------------------
    def prepare(self, sample: Dict[str, Any]) -> Any:
        if self._tokenizer is None:
            self._tokenizer = self.source.tokenizer()
        image = sample.get("image")
        if image is None and sample.get("video") is None:
            raise DataError("missing_image", "the CLIP scorer needs an image or a video (this sample has neither)")
        caption = sample.get("caption")
        if caption is None:
            raise DataError("missing_caption", "no caption to score")
        caption, _ = self.cleaner.clean(caption)
        if not caption:
            raise DataError("empty_caption", "caption is empty after removing image tokens")
        tokens, truncated = tokenize(self._tokenizer, caption, self.context_length)
        if image is not None and getattr(image, "info", {}).get(DEFERRED) and IMAGE_BYTES in sample:
            # --decode-device: the JPEG's bytes cross; the model worker decodes the batch's together
            import torch
            prepared = {"jpeg": torch.frombuffer(bytearray(sample[IMAGE_BYTES]), dtype=torch.uint8),
                        "size": tuple(image.size), "tokens": tokens, "truncated": truncated}
            return prepared
        if image is not None:  # (3, H, W) uint8; the full size places the crop after a reduced decode
            pixels, partial = self.transform(image, getattr(image, "info", {}).get(FULL_SIZE)), None
        else:
            pixels, partial = self._video_frames(sample)  # (frames, 3, H, W) uint8; why it is incomplete
        prepared = {"image": pixels, "tokens": tokens, "truncated": truncated}
        # A video cut short is scored from the frames that are there; its row says so ("partial").
        return Noted(prepared, "corrupt_video", partial) if partial else prepared

    def _video_frames(self, sample: Dict[str, Any]):
        import torch

        key, url = sample.get("__key__", "?"), sample.get("__url__", "")
        what = f"sample {key}.{sample.get('__media_ext__', 'video')}" + (f" of shard {url}" if url else "")
        sampled = sample_frames(sample["video"], self.frames, keyframes=self.keyframes, max_side=VIDEO_MAX_SIDE,
                                max_pixels=self.max_pixels, what=what)  # DataError for a broken video
        return torch.stack([self.transform(frame) for frame in sampled.frames]), sampled.partial

    def frame_count(self, prepared: Dict[str, Any]) -> int:
        """A video's sampled frames, 1 for an image (the planner and back-off count frames)."""
        image = prepared.get("image")
        if image is None:  # a JPEG decoded on the device
            return 1
        return int(image.shape[0]) if image.ndim == 4 else 1

    # -- model side ----------------------------------------------------------------------------
    def load(self, device: str) -> None:
        import torch


        where = torch.device(device)
        precision = resolve_precision(self.precision, where)  # bf16 support checked on this device
        dtype = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]
        # Half-precision weights on CUDA (half the memory, no per-batch casts); on a CPU the weights
        # stay fp32 and a requested fp16/bf16 is autocast only, as before.
        weights = precision if where.type == "cuda" else "fp32"
        self._model = load_model(self.source, device, self.cache_dir, precision=weights)
        self.device = str(device)
        self.autocast_dtype = dtype
        self.input_dtype = dtype if weights != "fp32" else None
        self.resolved_precision = precision
        self._staging = Staging.for_device(where)

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

        # Images are one frame, videos several: all frames go through the image tower together,
        # each caption once, and every frame is compared with its own sample's caption.
        if any("jpeg" in x for x in inputs):
            batch = self._device_decoded(inputs)
        else:  # uint8 crosses to the device (a quarter of float32's bytes) and is normalised there
            batch = self._staging.to_device([x["image"] if x["image"].ndim == 4 else x["image"][None]
                                             for x in inputs], self.device)
        counts = [1 if "jpeg" in x else (len(x["image"]) if x["image"].ndim == 4 else 1) for x in inputs]
        images = self.transform.normalize(batch, self.input_dtype)
        tokens = self._staging.to_device([x["tokens"][None] for x in inputs], self.device)
        with torch.inference_mode(), self._autocast():
            image_features = self._model.encode_image(images)
            text_features = self._model.encode_text(tokens)
        # Normalise in fp32: the cosine of half-precision embeddings is off by ~1e-3.
        image_features = F.normalize(image_features.float(), dim=-1)
        text_features = F.normalize(text_features.float(), dim=-1)
        if self.autocast_dtype is not None and not (bool(image_features.isfinite().all())
                                                    and bool(text_features.isfinite().all())):
            # fp16 overflow (a model trained in bf16 with very large activations): say what to do.
            raise DataError("non_finite_score", f"the embeddings overflowed in {self.resolved_precision}; "
                            f"score with --precision bf16 or fp32")
        per_sample_text = text_features
        text_features = text_features.repeat_interleave(torch.tensor(counts, device=text_features.device), dim=0)
        per_frame = (image_features * text_features).sum(dim=-1).clamp(-1.0, 1.0).cpu().tolist()
        rows, start = [], 0
        for n, x in zip(counts, inputs):
            frames = per_frame[start:start + n]
            start += n
            rows.append({"clip_score": reduce_frames(frames, self.frame_reduce), "clip_score_frames": frames,
                         "clip_frames": n, "clip_truncated": bool(x["truncated"])})
            if self._text:
                rows[-1][TEXT] = per_sample_text[len(rows) - 1]
            if self._image:
                rows[-1][IMAGE] = image_features[start - n:start]
        if self.save_embeddings:
            _attach_embeddings(rows, image_features, text_features, counts, self.frame_reduce)
        return rows

    def _device_decoded(self, inputs: List[Dict[str, Any]]):
        """The batch's uint8 frames on the model's device, in input order: JPEGs decoded there
        (fastdecode.device_pixels), the decode workers' pixels copied in beside them."""
        import torch
        jpegs = [i for i, x in enumerate(inputs) if "jpeg" in x]

        def cpu_path(k: int):  # the decode workers' way: PIL (reduced-scale), the same transform
            raw = inputs[jpegs[k]]["jpeg"].numpy().tobytes()
            image = decode_image(raw, self.max_pixels, None, "skip", "RGB", self.transform.decode_floor())
            return self.transform(image, image.info.get(FULL_SIZE))
        decoded = device_pixels(self.transform, [inputs[i]["jpeg"] for i in jpegs], [inputs[i]["size"] for i in jpegs],
                                torch.device(self.device), cpu_path)
        frames = [None] * len(inputs)
        for i, pixels in zip(jpegs, decoded):
            frames[i] = pixels[None].to(self.device, non_blocking=True)
        for i, x in enumerate(inputs):
            if frames[i] is None:
                frames[i] = (x["image"] if x["image"].ndim == 4 else x["image"][None]).to(self.device)
        return torch.cat(frames)

    def unload(self) -> None:
        device, self._model = self.device, None
        if self._staging is not None:
            self._staging.release()
        if device and device.startswith("cuda"):
            import torch
            torch.cuda.empty_cache()

    # -- reporting -----------------------------------------------------------------------------
    def describe(self) -> str:
        where = f"device={self.device}, precision={getattr(self, 'resolved_precision', self.precision)}" \
            if self._model is not None else f"not loaded, precision={self.precision}"
        videos = f"videos: {self.frames} {'keyframes' if self.keyframes else 'frames'}, reduce={self.frame_reduce}"
        # The model as the user named it: an absolute path of the folder made the line too long to read.
        return f"clip: model={self.model}, weights={self.source.weights_text()}, {where}, {videos}"


def _attach_embeddings(rows, image_features, text_features, counts, how: str) -> None:
    """Each row's float16 embeddings (wdsfilter/runfolder/embeddings.py); a video's image embedding
    is reduced like its score (mean of the frames, or the max/min frame), so img . txt = clip_score."""
    start = 0
    for row, n in zip(rows, counts):
        frames, scores = image_features[start:start + n], row["clip_score_frames"]
        pick = scores.index(max(scores) if how == "max" else min(scores)) if how in ("max", "min") else None
        image = frames.mean(0) if pick is None else frames[pick]
        row[FIELD] = {"img": image.half().cpu().numpy(), "txt": text_features[start].half().cpu().numpy()}
        start += n
