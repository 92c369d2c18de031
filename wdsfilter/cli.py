"""The `wdsfilter` command: a thin click layer over the Python API.

Each command lives beside the code it drives (wdsfilter/validate/cli.py, wdsfilter/score/cli.py)
and is attached here.
"""
from __future__ import annotations

import sys

import click

from . import __version__
from .errors import ConfigError, UnsafeInputError


class _Group(click.Group):
    """Turns configuration errors into a clear message and exit code 2 (usage error)."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except (ConfigError, UnsafeInputError) as e:
            click.secho(f"wdsfilter: error: {e}", fg="red", err=True)
            sys.exit(2)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="wdsfilter")
def main():
    """Validate, filter and score WebDataset shards for image-text and video-text training."""


def _not_yet(name: str, issue: str):
    @main.command(name, context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
                  help=f"(not implemented yet: {issue})")
    def command():
        raise click.UsageError(f"'wdsfilter {name}' is not implemented yet ({issue}).")
    return command


def _attach():
    from .validate.cli import validate  # the validator is part of the light core: import errors surface
    main.add_command(validate)
    from .filtering.cli import filter_command  # light: reads score files, loads no model
    main.add_command(filter_command)
    try:
        from .score.cli import score
        main.add_command(score)
    except ImportError:
        _not_yet("score", "the scoring engine")


_attach()

if __name__ == "__main__":
    main()
