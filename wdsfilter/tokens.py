"""Special tokens in captions, held in a picklable object (never a module global).

A global set in the parent process is silently lost in spawn/forkserver DataLoader workers, so the
configured image token lives in the CaptionCleaner that each stage carries with it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Tuple

from .config import StageConfig


@dataclass
class CaptionCleaner:
    image_token: Optional[str]
    mode: str  # normalise | strip | keep
    known_image_tokens: Tuple[str, ...]
    extra_tokens: Tuple[str, ...] = ()

    @classmethod
    def from_config(cls, cfg: StageConfig) -> "CaptionCleaner":
        return cls(cfg.image_token, cfg.effective_token_mode, cfg.known_image_tokens, cfg.extra_tokens)

    @property
    def foreign_tokens(self) -> Tuple[str, ...]:
        return tuple(t for t in self.known_image_tokens if t != self.image_token)

    def find_foreign(self, caption: str) -> Tuple[str, ...]:
        return tuple(t for t in self.foreign_tokens if t in caption)

    def clean(self, caption: str) -> Tuple[str, Tuple[str, ...]]:
        """(cleaned caption, foreign tokens that were found)."""
        foreign = self.find_foreign(caption)
        if self.mode == "keep":
            return caption, foreign
        if self.mode == "normalise":
            for token in foreign:
                caption = caption.replace(token, self.image_token)
            return caption, foreign
        # strip: remove every image token and the extra tokens, for models that see pixels.
        for token in set(self.known_image_tokens) | {self.image_token or ""} | set(self.extra_tokens):
            if token:
                caption = caption.replace(token, " ")
        return re.sub(r"\s+", " ", caption).strip(), foreign
