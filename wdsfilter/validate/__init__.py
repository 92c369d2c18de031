"""wdsfilter validate: find what would silently break training on a set of WebDataset shards.

    from wdsfilter.validate import validate
    report = validate("shards/", caption_key="json:description", ranks=8, loader_workers=4)
    report.passed, report.counts, report.kept_share, report.findings, report.to_dict()

`wdsfilter.validate(...)` works too (this module is callable). Light: no torch, no webdataset.
See docs/validate.md.
"""
from __future__ import annotations

import dataclasses
import logging
import sys
import time
import types
from typing import Optional, Sequence, Union

from ..stream.config import StageConfig
from ..core.errors import ConfigError
from ..storage.shards import expand_urls, is_remote, refuse_unreachable, unique_urls
from .findings import ERROR, KINDS, WARNING, Finding
from .options import ValidateOptions
from .progress import Progress
from .report import SCHEMA_VERSION, Report
from .runner import run_checks
from .shard_check import ShardResult, check_shard

_STAGE_FIELDS = {f.name for f in dataclasses.fields(StageConfig)}
log = logging.getLogger("wdsfilter")


def stage_config(config: Union[None, str, dict, StageConfig] = None, **overrides) -> StageConfig:
    """The StageConfig to validate against: a config file (JSON/YAML), a dict or a StageConfig, with
    the options that are not None on top."""
    unknown = sorted(set(overrides) - _STAGE_FIELDS)
    if unknown:
        raise ConfigError(f"unknown stage option(s) {unknown}")
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if config is None:
        return StageConfig(**overrides)
    if isinstance(config, str):  # a file of stage options, or a run recipe (OUT/run.yaml): its stage
        from ..runfolder.runyaml import recipe_stage_and_shards
        stage, _ = recipe_stage_and_shards(config)
        unknown = sorted(set(stage) - _STAGE_FIELDS)
        if unknown:
            raise ConfigError(f"{config}: unknown option(s) {unknown}; known: {sorted(_STAGE_FIELDS)}")
        return StageConfig(**{**stage, **overrides})
    if isinstance(config, dict):
        return StageConfig(**{**config, **overrides})
    if isinstance(config, StageConfig):
        return dataclasses.replace(config, **overrides)
    raise ConfigError(f"config must be a path, a dict or a StageConfig, got {type(config).__name__}")


def validate(paths: Union[None, str, Sequence[str]] = None, *, config: Union[None, str, dict, StageConfig] = None,
             caption_key: Optional[str] = None, image_key: Optional[str] = None, rekey: Optional[str] = None,
             max_pixels: Optional[int] = None, max_side: Optional[int] = None, image_token: Optional[str] = None,
             allow_pipe: Optional[bool] = None, allow_remote: Optional[bool] = None, deep: bool = False,
             min_side: Optional[int] = None, max_aspect: Optional[float] = None, ranks: Optional[int] = None,
             loader_workers: Optional[int] = None, fail_on: str = "error", jobs: Optional[int] = None,
             uneven_ratio: float = 2.0, max_findings: int = 100, stats_dir: Optional[str] = None,
             progress: bool = False, byte_caps: Optional[dict] = None,
             storage_options: Optional[dict] = None, max_drop=None, remote_options: Optional[dict] = None) -> Report:
    """Check shards (folders, globs, brace patterns, .tar/.tar.gz/.tgz files) and return a Report.

    byte_caps: StageConfig byte caps, e.g. {"max_image_bytes": 128 << 20} (config.parse_byte_caps).
    storage_options: fsspec options for remote shards (s3://, gs://, hf://): endpoint, profile...
    remote_options: StageConfig's remote_* fields (remote_speed_limit, remote_retry_budget, ...).
    max_drop: the share of samples that may be lost to per-sample errors (corrupt_image, ...)
    before the verdict fails: "1%" (or 1), {"corrupt_image": 0.5}, or texts as --max-drop takes them.
    config: a file of stage options, or a scoring run's recipe (OUT/run.yaml): its stage options, and
    its shards where `paths` is empty (a replay validated first).
    Configuration errors (a malformed key spec, no shard found, a refused pipe:/remote URL) raise at
    once; everything wrong with the data is a finding of the report."""
    if not paths:
        from ..runfolder.runyaml import recipe_stage_and_shards
        paths = recipe_stage_and_shards(config)[1] if isinstance(config, str) else []
        if not paths:
            raise ConfigError("no shards to validate: give PATHS, or --config a run's run.yaml that names them")
    stage = stage_config(config, caption_key=caption_key, image_key=image_key, rekey=rekey,
                         max_pixels=max_pixels, max_side=max_side, image_token=image_token,
                         allow_pipe=allow_pipe, allow_remote=allow_remote, storage_options=storage_options,
                         **(byte_caps or {}), **_remote_fields(remote_options))
    options = ValidateOptions(stage=stage, deep=deep, min_side=min_side, max_aspect=max_aspect, ranks=ranks,
                              loader_workers=loader_workers, uneven_ratio=uneven_ratio, max_findings=max_findings,
                              fail_on=fail_on, jobs=jobs, max_drop=max_drop)
    if stats_dir:
        from ..storage.writing import check_output_dir
        check_output_dir(stats_dir, "--stats-dir", stage.storage_options)  # before any shard is read
    # A shard given twice (a folder and a file in it) is validated once, as score scores it once:
    # else it is counted twice, listed twice in the JUnit report, and --stats-dir writes a
    # {stem}-2_stats.json for a shard that does not exist.
    urls, repeats = unique_urls(expand_urls(paths, stage.allow_pipe, stage.allow_remote, stage.storage_options))
    if repeats:
        log.warning(f"{len(repeats)} shard(s) given more than once are validated once: "
                    f"{', '.join(repeats[:3])}{' ...' if len(repeats) > 3 else ''}")
    report = validate_urls(urls, options, progress=progress)
    if stats_dir:
        from .stats_files import write_stats
        write_stats(report, stats_dir)
    return report


def _remote_fields(options: Optional[dict]) -> dict:
    unknown = sorted(k for k in (options or {}) if not k.startswith("remote_"))
    if unknown:
        raise ConfigError(f"remote_options takes StageConfig's remote_* fields, got {unknown}")
    return dict(options or {})


def validate_urls(urls: Sequence[str], options: ValidateOptions, progress: bool = False) -> Report:
    """The engine under validate(): shards in parallel, cross-shard checks in this process."""
    started = time.perf_counter()
    refuse_unreachable(urls, options.stage)
    results = [None] * len(urls)
    bar = Progress(len(urls)) if progress else None
    try:
        for i, result in run_checks(urls, options):
            results[i] = result
            if bar is not None:
                bar.update(result)
    finally:  # its ticker thread stops with it, also when the run stops on an error
        if bar is not None:
            bar.close()
    if any(is_remote(u) for u in urls):
        from .checks.remote_sizes import check_remote_sizes
        check_remote_sizes(results, options.stage.storage_options, options.stage.remote_options().answer_seconds)
    return Report.build(results, options, time.perf_counter() - started)


class _CallableModule(types.ModuleType):
    """`wdsfilter.validate(...)` calls validate(): the package and the function share one name."""

    def __call__(self, *args, **kwargs) -> Report:
        return validate(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

__all__ = ["validate", "validate_urls", "stage_config", "Report", "ShardResult", "Finding", "ValidateOptions",
           "check_shard", "KINDS", "ERROR", "WARNING", "SCHEMA_VERSION"]
