"""The documented import path of the Ray engine, kept: `from wdsfilter.score.ray_runner import
score_on_ray`. The engine is score/engines/ray.py (ENGINES["ray"], score/engines/__init__.py)."""
from __future__ import annotations

from .engines.ray import run_on_ray, score_on_ray

__all__ = ["score_on_ray", "run_on_ray"]
