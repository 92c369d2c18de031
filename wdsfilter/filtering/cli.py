"""`wdsfilter filter`: a thin click layer over wdsfilter.filtering.filter_scores (docs/filter.md)."""
from __future__ import annotations

import os
import sys

import click

from ..core import clihelp
from ..core.errors import EXIT_CLEAN, EXIT_RUN_FAILED, EXIT_USAGE, RunError
from ..core.process_exit import wrote_nothing
from ..core.progress import TERMINAL_ONLY, progress_on, progress_option, verbosity, verbosity_options
from ..core.selection import text_and_recipe_options, Selection
from ..core.thresholds import shorthand_options
from ..storage.remote import parse_storage_options, storage_defaults


# --help's groups (wdsfilter/core/clihelp.py): the rules first, then where the kept samples go.
HELP_GROUPS = {
    "Input": ("source_root", "allow_pipe"),
    "Thresholds": ("min_clip", "max_ocr_area", "mins", "maxes", "tops", "bottoms", "equals", "recipes", "dedup"),
    "Output": ("write_shards", "samples_per_shard", "prefix", "unique_keys", "interleave", "overwrite", "save",
               "export_uids", "report", "no_report"),
    "Remote": ("allow_remote", "storage_options"),
    "Run control": ("dry_run", "allow_incomplete", "progress", "quiet", "verbose"),
}


# never 1: shards of the scoring run left out are a failed run (3) unless --allow-incomplete
@clihelp.command("filter", HELP_GROUPS, (EXIT_CLEAN, EXIT_USAGE, EXIT_RUN_FAILED))
@click.argument("scores_dir", metavar="RUN")
@click.option("--min", "mins", multiple=True, metavar="COL=X", help="Keep rows with COL >= X. Repeatable.")
@click.option("--max", "maxes", multiple=True, metavar="COL=X", help="Keep rows with COL <= X. Repeatable.")
@click.option("--top", "tops", multiple=True, metavar="COL=P%",
              help="Keep the P% of scored rows with the highest COL (ties with the cut value kept too). Repeatable.")
@click.option("--bottom", "bottoms", multiple=True, metavar="COL=P%",
              help="Keep the P% of scored rows with the lowest COL (ties kept too). Repeatable.")
@text_and_recipe_options
@click.option("--write-shards", default=None, metavar="OUT",
              help="Write the kept samples (original members and bytes) into new shards here.")
@click.option("--samples-per-shard", type=int, default=1000, show_default=True,
              help="Samples per written shard (the last may be short).")
@click.option("--prefix", default="shard", show_default=True, help="Written shards are PREFIX-000000.tar, ...")
@click.option("--overwrite", is_flag=True, help="Replace shards in OUT written with other settings.")
@click.option("--unique-keys", is_flag=True,
              help="Key the written samples 000000000, 000000001, ... in the order written (unique in OUT, where "
                   "sources numbered per shard repeat keys); each .json keeps source_key and source_shard.")
@click.option("--interleave", type=click.IntRange(min=0), default=0, metavar="N",
              help="Take N source shards at a time in turn, one sample of each (round robin), instead of one "
                   "source after another. [default: 0, source order]")
@click.option("--dry-run", is_flag=True, help="Count only: write no shard, report or thresholds file.")
@click.option("--save", is_flag=True,
              help="Without --write-shards: write RUN/thresholds.json and RUN/filter_report.html "
                   "(exploring writes nothing unless asked).")
@click.option("--export-uids", default=None, metavar="FILE.npy",
              help="Write the kept samples' uids in DataComp's subset format (sorted u8,u8 pairs: its resharder's "
                   "--subset-file, a filtering-track submission).")
@click.option("--report", "report", default="", metavar="PATH",
              help="Where the HTML report goes [OUT/report.html with --write-shards, RUN/filter_report.html "
                   "with --save, else none: the score run's report.html stays].")
@click.option("--no-report", is_flag=True, help="Write no HTML report.")
@click.option("--source-root", default=None, metavar="DIR",
              help="Read each source shard from DIR by its file name (data moved since scoring, or a run folder "
                   "from someone else), never where the folder says.")
@click.option("--allow-pipe", is_flag=True,
              help="Run the `pipe:` commands RUN names as source shards (for --write-shards and the "
                   "report's thumbnails). Never taken from the folder: only when you trust the command.")
@click.option("--allow-remote", is_flag=True,
              help="Read the source shards RUN names by URL (http(s)://, s3://, gs://, ...). Off unless given: "
                   "permissions come from the command line, never from a folder (validate's and score's "
                   "--allow-remote, on by default, is about the URLs named on their command line; a RUN or OUT "
                   "given here as a URL is read and written without it).")
@click.option("--dedup", is_flag=True,
              help="Keep only the survivor of each duplicate group and drop eval matches, as `wdsfilter dedup "
                   "RUN` marked them (docs/dedup.md).")
@click.option("--storage-option", "storage_options", multiple=True, metavar="KEY=VALUE",
              help="An fsspec storage option for a RUN in a bucket, its sources and outputs (endpoint_url=..., "
                   "anon=true; repeatable; VALUE is JSON when it parses). Never written anywhere.")
@click.option("--allow-incomplete", is_flag=True,
              help="Exit 0 even when shards of the scoring run have no complete score file (they are left out).")
@shorthand_options
@progress_option(TERMINAL_ONLY)
@verbosity_options(quiet="Say nothing on success (the files are still written); shards of the scoring run left "
                         "out are still named, on stderr.",
                   verbose="Say more: a line per shard written with --write-shards.")
def filter_command(scores_dir, mins, maxes, tops, bottoms, equals, recipes, write_shards, samples_per_shard, prefix,
                   overwrite, unique_keys, interleave, dry_run, save, export_uids, report, no_report, allow_pipe,
                   allow_remote, dedup, allow_incomplete, source_root, progress, quiet, verbose, storage_options=()):
    """Choose thresholds after scoring: count what --min/--max/--top/--bottom/--equal/--dedup/--recipe
    keep in the run folder of a `wdsfilter score` run (RUN, either engine) and, with
    --write-shards, reshard the kept samples (with thresholds.json and an HTML report beside
    them). No model is loaded."""
    _numpy_without_blas_threads()
    from .apply import filter_scores  # after numpy is loaded with one BLAS thread: apply imports it
    source = click.get_current_context().get_parameter_source
    given = [f"--{name.replace('_', '-')}" for name in ("samples_per_shard", "prefix", "overwrite", "unique_keys",
                                                         "interleave")
             if source(name) is not click.core.ParameterSource.DEFAULT]
    if given and write_shards is None:  # they would be ignored, silently
        raise click.UsageError(f"{', '.join(given)} only apply with --write-shards OUT")
    if save and (write_shards is not None or dry_run):
        raise click.UsageError("--save is for exploring without --write-shards (which writes thresholds.json and the "
                               "report anyway); --dry-run writes nothing")
    selection = Selection.parse(mins, maxes, tops, bottoms, equals, dedup=dedup, recipes=recipes)
    level = verbosity(quiet, verbose)
    # Errors go to the group (wdsfilter/cli.py): one line, exit 2 for usage/configuration, 3 when
    # the run failed (a source shard missing or changed, an I/O error).
    with storage_defaults(parse_storage_options(storage_options), [scores_dir, write_shards, report]):
        result = filter_scores(scores_dir, selection, write_shards=write_shards,
                               samples_per_shard=samples_per_shard, prefix=prefix, dry_run=dry_run,
                               report=None if no_report else report, save=save, overwrite=overwrite,
                               echo=click.echo if level else None, shard_echo=click.echo if level == 2 else None,
                               allow_pipe=allow_pipe, allow_remote=allow_remote, source_root=source_root,
                               unique_keys=unique_keys, interleave=interleave, export_uids=export_uids,
                               progress=progress_on(progress, level, terminal_only=True))
    if level:
        click.echo(result.format_text())
    elif result.unfinished:  # -q hides counts, never that part of the run was left out
        click.echo(f"wdsfilter filter: {len(result.unfinished)} shard(s) of the scoring run in {scores_dir} are not "
                   f"finished and were left out", err=True)
    if dry_run:  # a count: nothing written, no thread left (the process ends without teardown)
        wrote_nothing()
    if result.unfinished and not allow_incomplete:  # thresholds and shards from part of the data: loud
        raise RunError(f"{len(result.unfinished)} shard(s) of the scoring run in {scores_dir} are not finished "
                       f"(listed above): finish them with `wdsfilter score ... --resume`, or pass --allow-incomplete")


def _numpy_without_blas_threads() -> None:
    """Import numpy (pyarrow imports it anyway) with OpenBLAS at one thread: filter does no linear
    algebra, and OpenBLAS starting a thread per core when it loads costs ~0.05 s of CPU on 2 cores,
    a tenth of a dry run over 4 M rows (tools/bench_filter.py). The setting is this process's
    own: the environment is put back at once, so what filter starts (a `pipe:` source) gets the
    user's; a user's own OPENBLAS_NUM_THREADS is left as it is."""
    if "numpy" in sys.modules or "OPENBLAS_NUM_THREADS" in os.environ:
        return
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        import numpy  # noqa: F401
    finally:
        del os.environ["OPENBLAS_NUM_THREADS"]
