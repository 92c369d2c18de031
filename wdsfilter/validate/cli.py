"""`wdsfilter validate`: a thin click layer over wdsfilter.validate.validate()."""
from __future__ import annotations

import sys

import click

from ..core import clihelp
from ..stream.config import STAGE_INPUT, STAGE_REMOTE, parse_byte_caps, stage_options
from ..core.errors import EXIT_CLEAN, EXIT_FINDINGS, EXIT_RUN_FAILED, EXIT_USAGE
from ..storage.remote_options import parse_storage_options
from ..core.progress import verbosity, verbosity_options
from ..storage.writing import check_output_file
from . import validate as run_validate
from .formats import FORMATS, render, write_report


# --help's groups (wdsfilter/core/clihelp.py): the caption and image keys first.
HELP_GROUPS = {
    "Input": (*STAGE_INPUT[:2], "config_file", *STAGE_INPUT[2:]),
    "Thresholds": ("fail_on", "max_drop", "max_side", "min_side", "max_aspect", "deep", "ranks", "loader_workers"),
    "Output": ("fmt", "output", "stats_dir"),
    "Performance": ("jobs",),
    "Remote": STAGE_REMOTE,
    "Run control": ("progress", "quiet", "verbose"),
}


@clihelp.command("validate", HELP_GROUPS, (EXIT_CLEAN, EXIT_FINDINGS, EXIT_USAGE, EXIT_RUN_FAILED),
                 findings="findings at the --fail-on level")
@click.argument("paths", nargs=-1)
@stage_options
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False),
              help="StageConfig file (JSON or YAML), or a scoring run's RUN/run.yaml: its stage options and, "
                   "without PATHS, its shards. The stage options here override it.")
@click.option("--max-side", type=click.IntRange(min=1), help="Largest allowed image side.")
@click.option("--min-side", type=click.IntRange(min=1), help="Warn on images with a side below this.")
@click.option("--max-aspect", type=click.FloatRange(min=1), help="Warn on images with long/short side above this.")
@click.option("--deep", is_flag=True, help="Decode every image and video frame instead of headers + end-of-data check.")
@click.option("--ranks", type=click.IntRange(min=1), help="Training ranks (for the too_few_shards check).")
@click.option("--loader-workers", type=click.IntRange(min=1), help="DataLoader workers per rank.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="text", show_default=True,
              help="The report's format (on stdout, or in --output).")
@click.option("--output", "-o", type=click.Path(dir_okay=False, writable=True),
              help="Write the report here; the text summary still goes to stdout.")
@click.option("--fail-on", type=click.Choice(["error", "warning"]), default="error", show_default=True,
              help="Exit 1 when findings of this severity (or worse) are found.")
@click.option("--max-drop", "max_drop", multiple=True, metavar="P%|KIND=P%",
              help="Pass although samples are lost to per-sample errors (corrupt_image, corrupt_video, "
                   "oversized_image, ...), up to P% of the samples: overall (1%) or per kind (corrupt_image=0.5%). "
                   "Whole-shard problems still fail. Repeatable.")
@click.option("--jobs", "-j", type=click.IntRange(min=1), help="Shards checked in parallel [default: CPU cores].")
@click.option("--stats-dir", type=click.Path(file_okay=False), help="Write {shard}_stats.json files and sizes.json here.")
@click.option("--progress/--no-progress", default=None,
              help="Progress on stderr: a bar on a terminal, a line every 10 s in a log [default: when stderr is a "
                   "terminal, or with -v].")
@verbosity_options(quiet="Say less: no progress; the one-line verdict and errors instead of the text report "
                         "(a --format json/junit report on stdout stays whole); with --output, nothing on stdout.",
                   verbose="Say more: progress in a log too (a line every 10 s).")
def validate_command(paths, caption_key, image_key, rekey, image_token, config_file, max_pixels, max_side, min_side,
                     max_aspect, max_bytes, deep, ranks, loader_workers, allow_pipe, allow_remote, remote_speed_limit,
                     remote_speed_time, remote_retry_budget, storage_options, fmt, output, fail_on,
                     max_drop, jobs, stats_dir, progress, quiet, verbose):
    """Check WebDataset shards for what would silently break training.

    PATHS: folders (searched recursively), globs, brace patterns (shards-{000..099}.tar), .tar,
    .tar.gz/.tgz files; or none, with --config RUN/run.yaml (a scoring run's shards). An --output or
    --stats-dir that cannot be written is a usage error, found before any shard is read. See
    docs/validate.md.
    """
    options = parse_storage_options(storage_options) or None
    if not paths and not config_file:
        raise click.UsageError("Missing argument 'PATHS...' (or --config RUN/run.yaml, a scoring run's shards)")
    if output:
        check_output_file(output, "--output", options)
    level = verbosity(quiet, verbose)  # -q: no progress; the verdict line, or nothing when the report goes to --output
    if progress is None:
        progress = level == 2 or (level == 1 and sys.stderr.isatty())
    report = run_validate(
        list(paths), config=config_file, caption_key=caption_key, image_key=image_key, rekey=rekey,
        max_pixels=max_pixels, max_side=max_side, image_token=image_token,
        allow_pipe=allow_pipe or None, allow_remote=allow_remote,  # None: the config file decides
        storage_options=options, remote_options=dict(
            remote_speed_limit=remote_speed_limit, remote_speed_time=remote_speed_time,
            remote_retry_budget=remote_retry_budget),
        byte_caps=parse_byte_caps(max_bytes), deep=deep, min_side=min_side, max_aspect=max_aspect, ranks=ranks, loader_workers=loader_workers, fail_on=fail_on, jobs=jobs, stats_dir=stats_dir, progress=progress,
        max_drop=max_drop or None)
    if output:
        write_report(report, fmt, output)  # whole or not at all
        if level > 0:
            click.echo(render(report, "text"), nl=False)
    else:
        click.echo(render(report, fmt, quiet=level == 0), nl=False)
    sys.exit(report.exit_code)


validate = validate_command  # the name wdsfilter.cli attaches
