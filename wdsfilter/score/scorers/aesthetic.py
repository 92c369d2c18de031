"""Aesthetic score: LAION's linear aesthetic predictor (LAION-Aesthetics V1) on the CLIP scorer's
image embedding of the same pass.

    wdsfilter score SHARDS --scorer aesthetic --model ViT-L-14 --pretrained openai --out OUT
    wdsfilter filter OUT --min aesthetic=5

A scorer built on another (Scorer.requires = ("clip",), as tmars is): in the model worker the CLIP
scorer hands it each sample's L2-normalised image embeddings (clip.IMAGE, one per frame; no second
image encode) and it applies one `nn.Linear(d, 1)` head, vendored in aesthetic_heads/ (MIT, LAION
AI; README.md there). Column `aesthetic` (the predicted rating: about 1 to 10, LAION-Aesthetics
kept >= 5, 6 or 6.5) and `aesthetic_frames` (one per frame; a video's are reduced as the clip
scorer's frame_reduce says).

The heads were trained on OpenAI CLIP embeddings: ViT-B/32 and ViT-L/14 (and ViT-B/16). Another
CLIP's embedding is another space, where the head's output means nothing, so a run whose CLIP is
not one of them is refused in one line before any model loads (bind), naming them. head="auto"
(default) takes the head of the run's `--model NAME --pretrained openai`; a local copy of those
weights (`--pretrained FILE`, `local-dir:`, `hf-hub:`) needs the head named
(`--scorer-opt aesthetic.head=vit_l_14`), and is refused when its embedding width is not the
head's. The tiny test CLIP is refused either way. A sample CLIP could not score (no caption: the
CLIP scorer needs one) gets no aesthetic score either.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from ...core.errors import ConfigError, DataError
from .base import Scorer, Upstream, reduce_frames
from .clip import ClipScorer, IMAGE

HEAD_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "aesthetic_heads")


@dataclass(frozen=True)
class Head:
    file: str    # in HEAD_DIR
    model: str   # the open_clip name of the CLIP it was trained on (with --pretrained openai)
    width: int   # its image embedding's length


HEADS = {
    "vit_b_32": Head("sa_0_4_vit_b_32_linear.pth", "ViT-B-32", 512),
    "vit_b_16": Head("sa_0_4_vit_b_16_linear.pth", "ViT-B-16", 512),
    "vit_l_14": Head("sa_0_4_vit_l_14_linear.pth", "ViT-L-14", 768),
}
TRAINED_FOR = "ViT-B-32, ViT-B-16 or ViT-L-14 with --pretrained openai"


def head_path(name: str) -> str:
    return os.path.join(HEAD_DIR, HEADS[name].file)


def choose_head(source, head: str) -> str:
    """The head for the run's CLIP (models.ClipSource), or a ConfigError naming the models the
    heads were trained for."""
    width = int(source.model_cfg.get("embed_dim", 0))
    builtin = source.weights in ("tag", "file", "random")
    family = source.spec[:-len("-quickgelu")] if source.spec.endswith("-quickgelu") else source.spec
    shown = source.spec + (f" --pretrained {source.pretrained}" if source.weights == "tag" else
                           f" ({source.weights_text().split(';')[0]})")
    if source.is_tiny:
        raise ConfigError(f"the aesthetic heads were trained on OpenAI CLIP image embeddings ({TRAINED_FOR}); "
                          f"the tiny test CLIP ({width}-value embeddings) has no head: score aesthetic with one of those")
    if head == "auto":
        found = [name for name, h in HEADS.items() if h.model == family]
        if builtin and found and source.weights == "tag" and source.pretrained == "openai":
            return found[0]
        raise ConfigError(f"the aesthetic heads were trained on OpenAI CLIP image embeddings ({TRAINED_FOR}); this "
                          f"run's CLIP is {shown}: pass e.g. --model ViT-L-14 --pretrained openai, or, for a local copy "
                          f"of those weights, name its head: --scorer-opt aesthetic.head={'|'.join(HEADS)}")
    want = HEADS[head]
    if width != want.width:
        raise ConfigError(f"the {head} aesthetic head takes the {want.width}-value image embeddings of {want.model} "
                          f"(openai); this run's CLIP {shown} gives {width}: the heads fit {TRAINED_FOR}")
    if builtin and family != want.model:
        raise ConfigError(f"the {head} aesthetic head was trained on {want.model} (openai) embeddings; this run's CLIP "
                          f"is {shown}: the heads fit {TRAINED_FOR}")
    if source.weights == "tag" and source.pretrained != "openai":
        raise ConfigError(f"the {head} aesthetic head was trained on OpenAI's {want.model} embeddings; {shown} embeds "
                          f"images elsewhere: pass --pretrained openai")
    return head


class AestheticScorer(Scorer):
    name = "aesthetic"
    media = ("image", "video")
    requires = ("clip",)
    image_pixels = False  # the CLIP scorer's embedding, not pixels of its own

    @classmethod
    def early_columns(cls, options: Dict[str, Any]) -> List[str]:
        return list(cls(**options).columns())

    def __init__(self, head: str = "auto"):
        """head: "auto" (the head of the run's --model with --pretrained openai) or one of
        vit_b_32, vit_b_16, vit_l_14 for a local copy of those OpenAI weights."""
        if head != "auto" and head not in HEADS:
            raise ConfigError(f"aesthetic head must be auto or one of {', '.join(HEADS)}, got {head!r}")
        self.head = head
        self.resolved: Optional[str] = None
        self._clip = None
        self._weight = None
        self._bias = None

    def __getstate__(self):  # the bound clip scorer travels on its own; bind() runs again there
        return dict(self.__dict__, _clip=None, _weight=None, _bias=None)

    def columns(self) -> List[str]:
        return ["aesthetic", "aesthetic_frames"]

    def column_types(self) -> Dict[str, str]:
        return {"aesthetic": "float64", "aesthetic_frames": "list<float64>"}

    def bind(self, required: Dict[str, Scorer]) -> None:
        clip = required["clip"]
        if not isinstance(clip, ClipScorer):
            raise ConfigError("aesthetic needs the built-in clip scorer (ClipScorer)")
        self.resolved = choose_head(clip.source, self.head)
        clip.hand_image()  # the private image embeddings attach() reads
        self._clip = clip

    def decode_floor(self):
        return (0, 0)  # the CLIP scorer's pixels

    # -- CPU side ------------------------------------------------------------------------------
    def prepare(self, sample: Dict[str, Any]) -> Any:
        if sample.get("image") is None and sample.get("video") is None:
            raise DataError("missing_image", "the aesthetic scorer needs an image or a video (this sample has neither)")
        return "video" if sample.get("image") is None else "image"

    # -- model side ----------------------------------------------------------------------------
    def attach(self, prepared: Any, upstream: Dict[str, Upstream], probe: bool = False) -> Any:
        return upstream["clip"].output[IMAGE]  # (frames, d) normalised, on the model's device

    def frame_count(self, prepared) -> int:
        return int(prepared.shape[0])

    def load(self, device: str) -> None:
        import torch
        if self.resolved is None:
            raise RuntimeError("AestheticScorer.load before bind(): the run binds it to its clip scorer")
        state = torch.load(head_path(self.resolved), map_location="cpu", weights_only=True)
        weight, bias = state["weight"].float(), state["bias"].float()
        if tuple(weight.shape) != (1, HEADS[self.resolved].width) or tuple(bias.shape) != (1,):
            raise ConfigError(f"{head_path(self.resolved)} is not the {self.resolved} head (weight {tuple(weight.shape)})")
        self._weight, self._bias = weight[0].to(device), bias.to(device)

    def score_batch(self, inputs: List[Any]) -> List[Dict[str, Any]]:
        import torch
        if self._weight is None:
            raise RuntimeError("AestheticScorer.score_batch called before load(device)")
        features = torch.cat([x.to(self._weight.device, torch.float32) for x in inputs])
        with torch.inference_mode():
            scores = (features @ self._weight + self._bias).cpu().tolist()
        how = self._clip.frame_reduce if self._clip is not None else "mean"
        rows, start = [], 0
        for x in inputs:
            frames = scores[start:start + len(x)]
            start += len(x)
            rows.append({"aesthetic": reduce_frames(frames, how), "aesthetic_frames": frames})
        return rows

    def unload(self) -> None:
        self._weight = self._bias = None

    def describe(self) -> str:
        head = self.resolved or self.head
        return f"aesthetic: LAION aesthetic predictor V1, head {head} on the clip scorer's image embeddings"
