"""`score --write-shards DIR --samples-per-shard N [--prefix P]`: the kept samples of the whole run
resharded once, at its end (`Run.finish`: the local engine, the Ray driver, and the one worker of
a joined run that finishes it), by filter's resharder over the score files (runfolder/reshard.py):
the shards `wdsfilter filter RUN --write-shards DIR --samples-per-shard N --prefix P` writes with
the run's rules, byte for byte, with the same sidecars (`_stats.json`, sizes.json, README.md,
thresholds.json, filter_run.json), so either command finds the other's shards whole.

Every write into DIR is fenced by the run's lease (runner.Run guards DIR with --out). Only a
complete run is resharded: while a shard has failed or is unfinished nothing is written to DIR
(the run exits 3; `--resume` or another worker finishes it and reshards then, over every shard's
rows), so DIR never holds part of the data set looking whole. An earlier reshard of the same run
folder in DIR is replaced (a resumed run's rows are other rows); another folder's is refused at
the start of the run (before any scoring) unless --overwrite, and a file filter did not write is
never replaced.
"""
from __future__ import annotations

import os
from typing import Callable, Optional

from ..core.errors import ConfigError
from ..core.progress import Passes
from ..core.selection import Selection
from ..runfolder.reader import ScoreRun
from ..runfolder.reshard import Resharder, made_from, reshard_run
from ..runfolder.names import THRESHOLDS
from ..runfolder.shares import resolve_selection, write_thresholds
from ..storage.remote import is_fsspec_url


def check_folder(write_shards: str, scores_dir: str, overwrite: bool) -> None:
    """Before any scoring: DIR holds no reshard of another score folder (unless --overwrite)."""
    scores = scores_dir if is_fsspec_url(scores_dir) else os.path.abspath(scores_dir)
    previous = made_from(write_shards)
    if previous is not None and previous != scores and not overwrite:
        raise ConfigError(f"--write-shards {write_shards} holds shards resharded from another score folder "
                          f"({previous}); pass --overwrite to replace them, or write to another folder")


def reshard_kept(cfg, rules: Selection, scores_dir: str, complete: bool, echo: Callable[[str], None],
                 shown: Optional[str] = None) -> Optional[dict]:
    """The run's kept samples (by `rules`, its selection with the shares resolved) into shards of
    cfg.samples_per_shard in cfg.write_shards; sizes.json's table, or None where the run is not
    complete (nothing written). scores_dir: the run folder as filter_run.json names it (a bucket's
    URL, not its staging copy); shown: DIR as the user gave it."""
    shown = shown or cfg.write_shards
    if not complete:
        if cfg.verbosity:
            echo(f"--write-shards: not resharded while shards of the run are unfinished; `--resume` reshards "
                 f"{shown} at its end")
        return None
    run = ScoreRun.open(cfg.out)
    resolved = resolve_selection(rules, run, empty_keeps_none=True)
    writer = Resharder(cfg.write_shards, cfg.samples_per_shard, cfg.prefix, cfg.stage.rekey, cfg.stage.allow_pipe,
                       cfg.stage.allow_remote, cfg.stage.stream_idle_seconds, writes_report=False)
    with Passes(cfg.progress and cfg.verbosity > 0) as passes:
        def progress(kept: int):
            return passes.start("writing shards", "samples", total=kept, parts=-(-kept // cfg.samples_per_shard))
        sizes = reshard_run(run, scores_dir, resolved.thresholds, None, writer, overwrite=cfg.overwrite,
                            replace_own=True, echo=echo if cfg.verbosity else None, shown=shown, progress=progress)
        passes.end(writer.progress)
    write_thresholds(os.path.join(cfg.write_shards, THRESHOLDS), resolved.selection)  # as filter: the loader call
    if cfg.verbosity:
        echo(f"resharded {sum(sizes.values())} kept sample(s) into {len(sizes)} shard(s) of "
             f"{cfg.samples_per_shard} in {shown}")
    return sizes
