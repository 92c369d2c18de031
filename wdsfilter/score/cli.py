"""`wdsfilter score`: a thin click layer over wdsfilter.score.score (see docs/score.md)."""
from __future__ import annotations

import logging

import click

from ..core import clihelp
from ..core.errors import EXIT_CLEAN, EXIT_RUN_FAILED, EXIT_USAGE, RunError
from ..core.progress import progress_option, verbosity, verbosity_options
from ..stream.config import STAGE_INPUT, STAGE_REMOTE, stage_options
from ..core.selection import text_and_recipe_options
from .engines import ENGINES
from ..runfolder.tables import FORMATS


def _echo(text: str) -> None:
    click.echo(text)


def _given(ctx: click.Context, param: str) -> bool:
    """Whether the option was given on the command line (or in the environment), not a default."""
    from click.core import ParameterSource
    return ctx.get_parameter_source(param) not in (None, ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP)


def _print_status(folders, storage_options) -> None:
    """`wdsfilter score RUN --status`: where a run stands (score/join.py), nothing scored."""
    if len(folders) != 1:
        raise click.UsageError("--status takes one run folder: `wdsfilter score RUN --status` (or --out RUN)")
    from ..storage.remote import parse_storage_options
    from .join import status_text
    click.echo(status_text(folders[0], parse_storage_options(storage_options or ()) or None))


class EngineChoice(click.Choice):
    """--engine's choices: the names in ENGINES (score/engines/__init__.py) when the command runs."""

    def __init__(self):
        super().__init__(())

    @property
    def choices(self):
        return tuple(ENGINES)

    @choices.setter
    def choices(self, _value) -> None:  # click's __init__ sets them; the registry is read instead
        pass


def _check_engine(cfg, engine: str, ctx: click.Context) -> None:
    """An engine's own options only with that engine; --join only with an engine that joins."""
    for name, other in ENGINES.items():
        given = [f"--{p.replace('_', '-')}" for p in other.options if name != engine and ctx.params.get(p) is not None]
        if given:
            raise click.UsageError(f"{', '.join(given)} only apply with --engine {name}")
    if cfg.join and not ENGINES[engine].joins:
        raise click.UsageError(f"--join makes this process one worker of many on --out (--engine "
                               f"{' or '.join(n for n, e in ENGINES.items() if e.joins)}); --engine {engine} is one "
                               f"driver for the whole run: drop one of them (docs/scale.md)")


# --help's groups (wdsfilter/core/clihelp.py): the caption and image keys, the scorer and model, and
# --out first in theirs.
HELP_GROUPS = {
    "Input": (*STAGE_INPUT[:2], "config_file", *STAGE_INPUT[2:]),
    "Model and scorers": ("scorers", "model", "pretrained", "precision", "scorer_opts", "frames", "frame_reduce",
                          "keyframes", "ocr_backend", "ocr_model_dir", "ocr_download"),
    "Thresholds": ("min_clip", "max_ocr_area", "mins", "maxes", "tops", "bottoms", "equals", "recipes"),
    "Output": ("out", "write_shards", "samples_per_shard", "prefix", "save_embeddings", "fmt"),
    "Performance": ("device", "gpus", "decode_device", "batch_size", "workers", "replicas", "max_memory", "headroom",
                    "fit", "engine", "ray_address", "ray_actors", "ray_gpus_per_actor"),
    "Remote": STAGE_REMOTE,
    "Run control": ("resume", "overwrite", "retry_failed", "dry_run", "join", "task_index", "task_count", "steal",
                    "status", "progress", "no_histograms", "quiet", "verbose"),
}


# never 1: score has no findings (a failed shard is a failed run, 3)
@clihelp.command("score", HELP_GROUPS, (EXIT_CLEAN, EXIT_USAGE, EXIT_RUN_FAILED))
@click.argument("shards", nargs=-1)
@click.option("--out", "out", default=None, metavar="RUN",
              help="The run folder: score files, markers, summary and run.yaml (required, here or in --config).")
@click.option("--scorer", "scorers", multiple=True, default=("clip",), show_default=True, metavar="NAME",
              help="clip, ocr, hash (sha256 + phash for `wdsfilter dedup`), tmars (CLIP score with the text masked; "
                   "brings ocr and clip), caption (language, words, characters), size (from headers), blur, nsfw, "
                   "aesthetic (LAION's head on CLIP's embedding; brings clip), or module:Class; repeat to run several "
                   "in one pass (docs/scorers.md).")
@click.option("--model", default=None, help="CLIP model name or local-dir:PATH (clip scorer).")
@click.option("--pretrained", default=None, metavar="TAG_OR_PATH", help="CLIP weights tag or file (clip scorer).")
@click.option("--precision", type=click.Choice(["auto", "fp32", "fp16", "bf16"]), default=None,
              help="clip: auto (fp16 weights on CUDA, fp32 on CPU), or fp32 to keep full precision [auto].")
@click.option("--scorer-opt", "scorer_opts", multiple=True, metavar="SCORER.KEY=VALUE",
              help="Pass any option to a scorer, e.g. ocr.max_side=960 or clip.precision=fp16. Repeatable.")
@click.option("--frames", type=int, default=None, help="clip, ocr, blur, nsfw: frames sampled per video, uniformly over its duration [3].")
@click.option("--frame-reduce", type=click.Choice(["mean", "max", "min"]), default=None,
              help="clip, ocr: how a video's per-frame scores become its score [mean].")
@click.option("--keyframes", is_flag=True, default=None, help="clip, ocr, blur, nsfw: sample keyframes only (cheapest on long clips).")
@click.option("--ocr-backend", type=click.Choice(["rapidocr", "easyocr"]), default=None,
              help="ocr: text detector; rapidocr's weights ship in its wheel (offline) [rapidocr].")
@click.option("--ocr-model-dir", default=None, metavar="DIR",
              help="ocr: folder of the detector weights (easyocr: craft_mlt_25k.pth).")
@click.option("--ocr-download/--no-ocr-download", default=None,
              help="ocr (easyocr): download missing detector weights [download].")
@click.option("--min-clip", type=float, default=None, help="Keep samples with clip_score >= X.")
@click.option("--max-ocr-area", type=float, default=None, help="Keep samples with ocr_area <= X (share of the frame).")
@click.option("--min", "mins", multiple=True, metavar="COLUMN=X", help="Keep samples with COLUMN >= X. Repeatable.")
@click.option("--max", "maxes", multiple=True, metavar="COLUMN=X", help="Keep samples with COLUMN <= X. Repeatable.")
@click.option("--top", "tops", multiple=True, metavar="COLUMN=P%",
              help="Keep the P% of scored samples with the highest COLUMN, resolved over the whole run when it "
                   "ends (as `wdsfilter filter --top`; not with --write-shards). Repeatable.")
@click.option("--bottom", "bottoms", multiple=True, metavar="COLUMN=P%",
              help="Keep the P% of scored samples with the lowest COLUMN (as --top). Repeatable.")
@text_and_recipe_options
@click.option("--write-shards", default=None, metavar="DIR",
              help="Write the kept samples here (original members and bytes): a copy of each source shard under its "
                   "name, or with --samples-per-shard new shards of N, resharded at the end of the run.")
@click.option("--samples-per-shard", type=int, default=None, metavar="N",
              help="With --write-shards: new shards of N kept samples each (the last may be short), written once "
                   "at the end of the run, as `wdsfilter filter RUN --write-shards DIR --samples-per-shard N` writes them.")
@click.option("--prefix", default=None, metavar="PREFIX",
              help="With --samples-per-shard: the written shards are PREFIX-000000.tar, ... [shard]")
@click.option("--save-embeddings", is_flag=True, default=None,
              help="clip: also write float16 image/caption embeddings in clip-retrieval's layout: "
                   "RUN/embeddings/img_emb, text_emb and metadata.")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option("--gpus", default=None, metavar="0,1", help="GPUs to use (one model worker each, or more: --replicas).")
@click.option("--decode-device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="Where CLIP's JPEGs are decoded: cuda (batched on the model's GPU; other images and JPEGs it "
                   "refuses on the CPU), cpu (decode workers), auto (cuda when the model workers are on GPUs).")
@click.option("--batch-size", default="auto", show_default=True, help="auto (memory planner) or N.")
@click.option("--workers", default="auto", show_default=True, help="Decode worker processes: auto or N.")
@click.option("--replicas", default="auto", show_default=True, help="Model processes per GPU: auto or N.")
@click.option("--max-memory", default=None, metavar="SIZE", help="Most memory to plan for per device (8GB, 8GiB).")
@click.option("--headroom", type=float, default=0.10, show_default=True, help="Share of memory kept free.")
@click.option("--fit", type=click.Choice(["refuse", "clamp"]), default="refuse", show_default=True,
              help="A setting that cannot fit: refuse it with the numbers, or clamp it with a warning.")
@click.option("--format", "fmt", type=click.Choice(list(FORMATS)), default="parquet", show_default=True,
              help="The score files' format.")
@click.option("--resume", is_flag=True, help="Continue a run in --out: skip shards with a completion marker.")
@click.option("--overwrite", is_flag=True, help="Start over in an --out that holds a previous run.")
@click.option("--retry-failed", "retry_failed", is_flag=False, flag_value="transient", default=None,
              type=click.Choice(["transient", "all"]),
              help="Score again the samples the failure ledger (RUN/failures.parquet) lists: transient failures "
                   "(out of memory, a scorer's exception, a dead worker, a broken read), or `all` (data errors "
                   "too); the rows are replaced in place. Implies --resume.")
@click.option("--dry-run", is_flag=True, help="Load the models, measure, print the plan; score nothing.")
@click.option("--join", is_flag=True,
              help="Be one of many workers on --out (local, shared, s3://, gs://): start the run there or join it "
                   "with the same settings and shards; shards are claimed one by one (docs/scale.md).")
@click.option("--task-index", type=click.IntRange(min=0), default=None, metavar="I",
              help="--join: this worker takes the I-th of --task-count slices of the shards first "
                   "[SLURM_ARRAY_TASK_ID, JOB_COMPLETION_INDEX]. Implies --join.")
@click.option("--task-count", type=click.IntRange(min=1), default=None, metavar="N",
              help="--join: the number of slices (tasks) [SLURM_ARRAY_TASK_COUNT]. Implies --join.")
@click.option("--steal/--no-steal", default=True, show_default=True,
              help="--join: once its slice is done, take the shards no worker claimed yet of the others' slices "
                   "(--no-steal: its slice only).")
@click.option("--status", is_flag=True,
              help="Print where the run in RUN (`wdsfilter score RUN --status`, or --out RUN) stands: shards "
                   "done/claimed/failed/free, samples, workers and their last heartbeat; score nothing.")
@stage_options
@click.option("--config", "config_file", default=None, metavar="FILE",
              help="A run recipe (YAML/JSON: shards, out, scorers, scorer_options, thresholds, stage, engine, ...; "
                   "every run writes its own to RUN/run.yaml), or stage options only. Options given here override it.")
@click.option("--engine", type=EngineChoice(), default="local", show_default=True,
              help="; ".join(f"{name}: {engine.help}" for name, engine in ENGINES.items()) + ".")
@click.option("--ray-address", default=None, metavar="ADDRESS",
              help="ray: a running cluster (auto, ray://host:10001); default: start a local one.")
@click.option("--ray-actors", type=click.IntRange(min=1), default=None,
              help="ray: model actors [the planner's model processes per GPU x the cluster's GPUs, else 1].")
@click.option("--ray-gpus-per-actor", type=click.FloatRange(min=0), default=None,
              help="ray: GPUs per model actor (0.5 puts two on a GPU) [1 / the planner's model processes per GPU "
                   "when the cluster has GPUs, else 0].")
@progress_option("on; off with -q")
@click.option("--no-histograms", is_flag=True, help="No histograms in the terminal summary.")
@verbosity_options(quiet="Say less: the result and errors only (no progress, scorer lines, plan or histograms).",
                   verbose="Say more: the whole plan (by default one line).")
def score(shards, out, scorers, model, pretrained, precision, scorer_opts, frames, frame_reduce, keyframes,
          ocr_backend, ocr_model_dir, ocr_download, min_clip, max_ocr_area, mins, maxes, tops, bottoms,
          equals, recipes, write_shards, samples_per_shard, prefix,
          save_embeddings, device, gpus, decode_device, batch_size, workers, replicas, max_memory, headroom, fit, fmt,
          resume, overwrite, retry_failed, dry_run, join, task_index, task_count, steal, status, caption_key,
          image_key, rekey, image_token, max_pixels, config_file, max_bytes, allow_pipe, allow_remote,
          remote_speed_limit, remote_speed_time, remote_retry_budget, storage_options, engine,
          ray_address, ray_actors, ray_gpus_per_actor,
          progress, no_histograms, quiet, verbose):
    """Score every sample of SHARDS (folders, globs, brace patterns, .tar files) with CLIP, OCR
    or your own scorer; write per-shard score files, a summary and, optionally, filtered shards."""
    from ..stream.config import StageConfig, stage_overrides
    from . import SHORTCUTS, build_config
    from .recipe import FLAGS, merge, read_recipe
    from ..core.selection import Selection
    from .config import parse_option
    from ..core.progress import library_logs_off

    logging.basicConfig(format="wdsfilter: warning: %(message)s", level=logging.WARNING)
    library_logs_off()  # on the handler just made too
    if status:  # where a run stands, nothing scored
        return _print_status([out] if out else list(shards), storage_options)
    level = verbosity(quiet, verbose)
    recipe = read_recipe(config_file) if config_file else {}
    given_stage = stage_overrides(caption_key=caption_key, image_key=image_key, rekey=rekey, image_token=image_token,
                                  max_pixels=max_pixels, max_bytes=max_bytes, allow_pipe=allow_pipe,
                                  allow_remote=allow_remote, storage_options=storage_options,
                                  remote_speed_limit=remote_speed_limit, remote_speed_time=remote_speed_time,
                                  remote_retry_budget=remote_retry_budget)
    stage = StageConfig(**{**(recipe.get("stage") or {}), **given_stage})
    scorer_options = {}
    for text in scorer_opts:
        name, key, value = parse_option(text)
        scorer_options.setdefault(name, {})[key] = value
    # The rules: the recipe file's, then the flags' (a flag replaces the file's rule on its column).
    flags = Selection.parse(mins, maxes, tops, bottoms, equals, recipes=recipes).merged(
        Selection.from_keywords(min_clip=min_clip, max_ocr_area=max_ocr_area))
    selection = Selection.from_dict(recipe.get("thresholds"), f"--config {config_file}").merged(flags)
    # Only the options given on the command line override the recipe (click's defaults do not).
    ctx = click.get_current_context()
    given = {key: ctx.params[flag] for flag, key in FLAGS.items() if _given(ctx, flag)}  # recipe.FLAGS
    if "scorer_options" in given:
        given["scorer_options"] = scorer_options
    merged = merge(recipe, given, SHORTCUTS)
    shards = list(shards) or recipe.get("shards") or []
    out = merged.pop("out", None) if out is None else out
    merged.pop("out", None)
    if not shards:
        raise click.UsageError("no SHARDS: give them on the command line or as shards: in --config")
    if not out:
        raise click.UsageError("no --out: give it on the command line or as out: in --config")
    if not _given(ctx, "engine"):
        engine = recipe.get("engine", engine)
    cfg = build_config(out, tuple(merged.pop("scorers", ("clip",))), stage=stage, selection=selection, resume=resume,
                       overwrite=overwrite, retry_failed=retry_failed, dry_run=dry_run, progress=progress is not False,
                       verbosity=level, join=join, task_index=task_index, task_count=task_count, steal=steal, **merged)
    _check_engine(cfg, engine, ctx)
    # Errors are not caught here: the `wdsfilter` group prints one line and maps each to its exit
    # code (wdsfilter/core/errors.py): 2 for configuration errors, 3 for a failed run, never 1.
    chosen = ENGINES[engine]
    summary = chosen.load()(list(shards), cfg, echo=_echo, **{kw: ctx.params[p] for p, kw in chosen.options.items()})
    # The scorer lines were printed as the run began, unless -q kept them back.
    click.echo(summary.format_text(histograms=not no_histograms and level > 0, plan=False, scorers=level == 0,
                                   quiet=level == 0))
    if summary.shards_failed:  # a failure of the run: those shards have no marker
        again = "start a worker again (--join): it retries them" if cfg.join else "run again with --resume to retry them"
        raise RunError(f"{len(summary.shards_failed)} shard(s) failed (listed above and in summary.json); {again}")
