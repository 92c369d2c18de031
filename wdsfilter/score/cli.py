"""`wdsfilter score`: a thin click layer over wdsfilter.score.score (see docs/score.md)."""
from __future__ import annotations

import logging

import click

from ..errors import RunError
from ..specs import REKEY_MODES


def _echo(text: str) -> None:
    click.echo(text)


@click.command("score", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("shards", nargs=-1, required=True)
@click.option("--out", "out", required=True, metavar="DIR", help="Folder for score files, markers and summary.")
@click.option("--scorer", "scorers", multiple=True, default=("clip",), show_default=True, metavar="NAME",
              help="clip, ocr, hash (sha256 + phash for `wdsfilter dedup`), or module:Class; repeat to run several "
                   "in one pass.")
@click.option("--model", default=None, help="CLIP model name or local-dir:PATH (clip scorer).")
@click.option("--pretrained", default=None, metavar="TAG_OR_PATH", help="CLIP weights tag or file (clip scorer).")
@click.option("--precision", type=click.Choice(["auto", "fp32", "fp16", "bf16"]), default=None,
              help="clip: auto (fp16 weights on CUDA, fp32 on CPU), or fp32 to keep full precision [auto].")
@click.option("--scorer-opt", "scorer_opts", multiple=True, metavar="SCORER.KEY=VALUE",
              help="Pass any option to a scorer, e.g. ocr.max_side=960 or clip.precision=fp16. Repeatable.")
@click.option("--frames", type=int, default=None, help="clip, ocr: frames sampled per video, uniformly over its duration [3].")
@click.option("--frame-reduce", type=click.Choice(["mean", "max", "min"]), default=None,
              help="clip, ocr: how a video's per-frame scores become its score [mean].")
@click.option("--keyframes", is_flag=True, default=None, help="clip, ocr: sample keyframes only (cheapest on long clips).")
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
@click.option("--write-shards", default=None, metavar="DIR", help="Write filtered shards (original bytes) here.")
@click.option("--save-embeddings", is_flag=True, default=None,
              help="clip: also write float16 image/caption embeddings in clip-retrieval's layout: "
                   "OUT/embeddings/img_emb, text_emb and metadata.")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option("--gpus", default=None, metavar="0,1", help="GPUs to use (one model worker each, or more: --replicas).")
@click.option("--batch-size", default="auto", show_default=True, help="auto (memory planner) or N.")
@click.option("--workers", default="auto", show_default=True, help="Decode worker processes: auto or N.")
@click.option("--replicas", default="auto", show_default=True, help="Model processes per GPU: auto or N.")
@click.option("--max-memory", default=None, metavar="SIZE", help="Most memory to plan for per device (8GB, 8GiB).")
@click.option("--headroom", type=float, default=0.10, show_default=True, help="Share of memory kept free.")
@click.option("--fit", type=click.Choice(["refuse", "clamp"]), default="refuse", show_default=True,
              help="A setting that cannot fit: refuse it with the numbers, or clamp it with a warning.")
@click.option("--format", "fmt", type=click.Choice(["parquet", "jsonl"]), default="parquet", show_default=True)
@click.option("--resume", is_flag=True, help="Continue a run in --out: skip shards with a completion marker.")
@click.option("--overwrite", is_flag=True, help="Start over in an --out that holds a previous run.")
@click.option("--dry-run", is_flag=True, help="Load the models, measure, print the plan; score nothing.")
@click.option("--rekey", type=click.Choice(REKEY_MODES), default=None,
              help="Member name -> key split: first-dot (webdataset's) or last-dot (dotted basenames) [first-dot].")
@click.option("--caption-key", default=None, help="Caption spec, e.g. txt or json:description or 'txt;json:caption'.")
@click.option("--image-key", default=None, help="Image spec, e.g. 'jpg;png;webp'.")
@click.option("--config", "config_file", default=None, metavar="FILE", help="Stage options (JSON/YAML), as for validate.")
@click.option("--max-bytes", "max_bytes", multiple=True, metavar="KIND=SIZE",
              help="Byte cap of one member (text, json, image, video, other; decompressed: a .tar.gz shard), as for validate.")
@click.option("--allow-pipe", is_flag=True, default=None, help="Allow pipe: shard URLs (they run shell commands).")
@click.option("--allow-remote", is_flag=True, default=None, help="Allow remote shard URLs.")
@click.option("--engine", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="local: this machine's engine (memory planner); ray: Ray Data across a cluster "
                   "(pip install 'wdsfilter[ray]'; shards and --out on a shared filesystem).")
@click.option("--ray-address", default=None, metavar="ADDRESS",
              help="ray: a running cluster (auto, ray://host:10001); default: start a local one.")
@click.option("--ray-actors", type=click.IntRange(min=1), default=None,
              help="ray: model actors [the planner's model processes per GPU x the cluster's GPUs, else 1].")
@click.option("--ray-gpus-per-actor", type=click.FloatRange(min=0), default=None,
              help="ray: GPUs per model actor (0.5 puts two on a GPU) [1 / the planner's model processes per GPU "
                   "when the cluster has GPUs, else 0].")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@click.option("--no-histograms", is_flag=True, help="No histograms in the terminal summary.")
def score(shards, out, scorers, model, pretrained, precision, scorer_opts, frames, frame_reduce, keyframes,
          ocr_backend, ocr_model_dir, ocr_download, min_clip, max_ocr_area, mins, maxes, write_shards,
          save_embeddings, device, gpus, batch_size, workers, replicas, max_memory, headroom, fit, fmt, resume,
          overwrite, dry_run, caption_key, image_key, rekey, config_file, max_bytes, allow_pipe, allow_remote, engine,
          ray_address, ray_actors, ray_gpus_per_actor,
          no_progress, no_histograms):
    """Score every sample of SHARDS (folders, globs, brace patterns, .tar files) with CLIP, OCR
    or your own scorer; write per-shard score files, a summary and, optionally, filtered shards."""
    from ..config import StageConfig, parse_byte_caps
    from . import build_config
    from ..thresholds import parse_threshold
    from .config import parse_option
    from .engine import run_scoring

    logging.basicConfig(format="wdsfilter: warning: %(message)s", level=logging.WARNING)
    stage_overrides = {"caption_key": caption_key, "image_key": image_key, "rekey": rekey, "allow_pipe": allow_pipe,
                       "allow_remote": allow_remote, **parse_byte_caps(max_bytes)}
    if config_file:
        stage = StageConfig.from_file(config_file, **stage_overrides)
    else:
        stage = StageConfig(**{k: v for k, v in stage_overrides.items() if v is not None})
    scorer_options = {}
    for text in scorer_opts:
        name, key, value = parse_option(text)
        scorer_options.setdefault(name, {})[key] = value
    minima = dict(parse_threshold(t, "--min") for t in mins)
    maxima = dict(parse_threshold(t, "--max") for t in maxes)
    cfg = build_config(out, tuple(scorers), min_clip=min_clip, min_scores=minima, max_ocr_area=max_ocr_area,
                       max_scores=maxima, stage=stage, scorer_options=scorer_options, model=model,
                       pretrained=pretrained, precision=precision, frames=frames, frame_reduce=frame_reduce,
                       keyframes=keyframes,
                       ocr_backend=ocr_backend, ocr_model_dir=ocr_model_dir, ocr_download=ocr_download,
                       write_shards=write_shards, save_embeddings=save_embeddings, device=device, gpus=gpus,
                       batch_size=batch_size,
                       workers=workers, replicas=replicas, max_memory=max_memory, headroom=headroom, fit=fit,
                       format=fmt, resume=resume, overwrite=overwrite, dry_run=dry_run, progress=not no_progress)
    ray_given = [f for f, v in (("--ray-address", ray_address), ("--ray-actors", ray_actors),
                                ("--ray-gpus-per-actor", ray_gpus_per_actor)) if v is not None]
    if ray_given and engine != "ray":
        raise click.UsageError(f"{', '.join(ray_given)} only apply with --engine ray")
    # Errors are not caught here: the `wdsfilter` group prints one line and maps each to its exit
    # code (wdsfilter/errors.py): 2 for configuration errors, 3 for a failed run, never 1.
    if engine == "ray":
        from .ray_runner import run_on_ray
        summary = run_on_ray(list(shards), cfg, actors=ray_actors, gpus_per_actor=ray_gpus_per_actor,
                             address=ray_address, echo=_echo)
    else:
        summary = run_scoring(list(shards), cfg, echo=_echo)
    click.echo(summary.format_text(histograms=not no_histograms, plan=False))
    if summary.shards_failed:  # a failure of the run: those shards have no marker
        raise RunError(f"{len(summary.shards_failed)} shard(s) failed (listed above and in summary.json); "
                       f"run again with --resume to retry them")
