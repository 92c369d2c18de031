"""`wdsfilter dedup`: a thin click layer over wdsfilter.dedup.dedup (docs/dedup.md)."""
from __future__ import annotations

import click

from ..core import clihelp
from ..core.errors import EXIT_CLEAN, EXIT_RUN_FAILED, EXIT_USAGE
from ..core.progress import TERMINAL_ONLY, progress_on, progress_option, verbosity, verbosity_options
from .groups import KINDS
from .find import NEAR_BITS, SEMANTIC_THRESHOLD, dedup
from .spill import MEMORY_MB
from ..storage.remote import parse_storage_options, storage_defaults


# --help's groups (wdsfilter/core/clihelp.py)
HELP_GROUPS = {
    "Input": ("evals",),
    "Thresholds": ("kinds", "near_bits", "semantic_threshold"),
    "Performance": ("memory_mb",),
    "Remote": ("storage_options",),
    "Run control": ("progress", "quiet", "verbose"),
}


# never 1: duplicates are its output, not findings
@clihelp.command("dedup", HELP_GROUPS, (EXIT_CLEAN, EXIT_USAGE, EXIT_RUN_FAILED))
@click.argument("run_dir", metavar="RUN")
@click.option("--kind", "kinds", multiple=True, type=click.Choice(KINDS),
              help="exact (same sha256), near (phash within --near-bits) or semantic (CLIP embedding cosine >= "
                   "--semantic-threshold, which it needs). Repeatable. [exact and near]")
@click.option("--near-bits", type=int, default=NEAR_BITS, show_default=True,
              help="Near duplicates: phashes differing in at most this many of 64 bits.")
@click.option("--semantic-threshold", type=float, default=SEMANTIC_THRESHOLD, metavar="COSINE",
              help="Semantic duplicates: cosine of the image embeddings at least this; no default, it depends on "
                   "the model: start at 0.99 and lower it while the report's semantic groups are still copies "
                   "(docs/dedup.md).")
@click.option("--eval", "evals", multiple=True, metavar="FOLDER_OR_SHARD",
              help="Eval images (a folder of images or WebDataset shards): training rows matching one exactly, "
                   "near or (with the semantic kind: the run's CLIP model is loaded) semantically are marked and "
                   "dropped by `filter --dedup`. Repeatable.")
@click.option("--memory-mb", type=int, default=MEMORY_MB, show_default=True,
              help="Working memory of the exact and near passes; records beyond it wait in RUN/dedup/tmp "
                   "(the rows also cost 5 bytes each, a duplicate group about 40).")
@click.option("--storage-option", "storage_options", multiple=True, metavar="KEY=VALUE",
              help="An fsspec storage option for a RUN in a bucket (s3://...; endpoint_url=..., repeatable; "
                   "VALUE is JSON when it parses). Never written anywhere.")
@progress_option(TERMINAL_ONLY)
@verbosity_options(quiet="Say nothing on success (RUN/dedup/summary.json has the counts); a run with shards "
                         "left out still says so, on stderr.",
                   verbose="Say more: the largest groups with every member shown, and the seconds of each step.")
def dedup_command(run_dir, kinds, near_bits, semantic_threshold, evals, memory_mb, storage_options, progress, quiet,
                  verbose):
    """Find duplicate rows of a `wdsfilter score` run (RUN, either engine) from its hashes
    (--scorer hash) and saved embeddings (--save-embeddings), keep one survivor per group (the
    highest clip_score, else the first by shard and index) and write RUN/dedup/ (RUN may be
    in a bucket: s3://...). Loads no model, except the run's CLIP to embed --eval images for the
    semantic kind."""
    level = verbosity(quiet, verbose)
    options = parse_storage_options(storage_options)
    with storage_defaults(options, [run_dir]):  # the folder, and the sources its report shows
        result = dedup(run_dir, kinds, near_bits=near_bits, semantic_threshold=semantic_threshold, evals=evals,
                       echo=click.echo if level else None, storage_options=options,
                       memory_mb=memory_mb, progress=progress_on(progress, level, terminal_only=True))
    if level:
        click.echo(result.format_text(verbose=level == 2))
    elif result.unfinished:  # -q hides counts, never that part of the run was left out
        click.echo(f"wdsfilter dedup: {len(result.unfinished)} shard(s) of {run_dir} have no complete score file "
                   f"and were left out", err=True)
