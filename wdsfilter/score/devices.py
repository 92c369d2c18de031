"""Model devices of a local run: which devices get a model worker (cuda:N, cpu, or a device kind
the tests register, memory.DEVICE_KINDS), and the pool of model workers on them
(modelworker.LocalPool or ProcessPool)."""
from __future__ import annotations

from typing import List, Sequence

from ..core.errors import ConfigError, require
from .config import ScoreConfig
from .memory import torch_device
from .modelworker import LocalPool, ProcessPool


def resolve_devices(cfg: ScoreConfig) -> List[str]:
    """Model worker devices, one entry per process started before planning. `--device cpu
    --replicas N` starts one: the planner measures it and starts as many more of the N as the host
    budget holds (planner.cpu_replicas), never N copies of a model at once before it knows."""
    if cfg.devices:
        return list(cfg.devices)
    if cfg.device == "cpu":
        return ["cpu"]
    torch = require("torch", "scoring")
    has_cuda = torch.cuda.is_available()
    if not has_cuda:
        if cfg.device == "auto" and cfg.gpus is None:
            return ["cpu"]
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


def make_pool(devices: List[str], scorers: Sequence, depth: int = 2, replicas=1):
    """In this process for one device whose model computes on the CPU (unless the user asked for
    several model processes: `replicas`), else one process per device."""
    several = isinstance(replicas, int) and replicas > 1
    if len(devices) == 1 and torch_device(devices[0]) == "cpu" and not (several and devices[0] == "cpu"):
        return LocalPool(devices[0], scorers)
    return ProcessPool(devices, scorers, depth=depth)
