"""The `wdsfilter` command: a thin click layer over the Python API.

Each command lives beside the code it drives (wdsfilter/validate/cli.py, wdsfilter/score/cli.py)
and is attached here. Errors are turned into exit codes here, once, for every command: a command
raises (wdsfilter.core.errors), the group prints one line and exits with the error's code. The
traceback is printed only with --debug (anywhere on the command line) or WDSFILTER_DEBUG=1.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import traceback

import click

from . import __version__
from .core.errors import EXIT_CODES_HELP, Terminated, describe, exit_code_for
from .core.progress import library_logs_off
from .core.publish import Redacting

DEBUG_FLAG = "--debug"


def _debug_wanted(ctx: click.Context) -> bool:
    return bool(ctx.meta.get("wdsfilter.debug")) or os.environ.get("WDSFILTER_DEBUG", "") not in ("", "0")


# Each command's module, imported when the command runs (or a listing, --help or `main.commands`
# needs them all): `wdsfilter filter` does not wait for the validator's decoders or the scoring
# engine to import (start-up is part of what tools/bench_filter.py times).
COMMANDS = {"validate": ("validate.cli", "validate"), "sort-shard": ("sortshard", "sort_shard_cli"),
            "filter": ("filtering.cli", "filter_command"), "dedup": ("dedup.cli", "dedup_command"),
            "score": ("score.cli", "score")}


class _Group(click.Group):
    """Maps every error a command raises to one clear line and its exit code."""

    @property
    def commands(self):
        for name in list(COMMANDS):
            self._load(name)
        return self._commands

    @commands.setter
    def commands(self, value):
        self._commands = value

    def _load(self, name: str) -> None:
        if name in self._commands or name not in COMMANDS:
            return
        import importlib
        module, attribute = COMMANDS[name]
        try:
            command = getattr(importlib.import_module(f"{__package__}.{module}"), attribute)
        except ImportError:
            if name != "score":
                raise  # the light core: its import errors surface
            command = _not_yet("score", "the scoring engine")
        if not command.epilog:  # every command's --help states the exit codes
            command.epilog = EXIT_CODES_HELP
        self._commands[name] = command

    def get_command(self, ctx, cmd_name):
        self._load(cmd_name)
        return self._commands.get(cmd_name)

    def parse_args(self, ctx, args):
        # --debug is accepted after the command name too (`wdsfilter validate x --debug`), for
        # every command, without each command declaring it.
        end = args.index("--") if "--" in args else len(args)
        if DEBUG_FLAG in args[:end]:
            ctx.meta["wdsfilter.debug"] = True
            args = [a for a in args[:end] if a != DEBUG_FLAG] + args[end:]
        return super().parse_args(ctx, args)

    def invoke(self, ctx):
        previous = _stop_on_sigterm()
        library_logs_off(_debug_wanted(ctx))
        # every line a command prints (its output, log lines, the error) shows URLs without their
        # password or presigned signature (publish.py)
        streams = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = Redacting(sys.stdout), Redacting(sys.stderr)
        try:
            return super().invoke(ctx)
        except click.exceptions.UsageError as e:
            # one line, as every other error (click prints usage, a hint and the error on three)
            command = e.ctx.command_path if e.ctx is not None else "wdsfilter"
            click.secho(f"{command}: error: {e.format_message()} (see '{command} --help')", fg="red", err=True)
            sys.exit(e.exit_code)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort, SystemExit):
            raise  # commands that exit chose their code
        except BaseException as e:  # noqa: B036 -- Ctrl-C and bugs get a line and a code too
            e = _known_failure(e)
            if _debug_wanted(ctx):
                traceback.print_exc(file=sys.stderr)
            command = f"wdsfilter {ctx.invoked_subcommand}" if ctx.invoked_subcommand else "wdsfilter"
            message = describe(e)
            if isinstance(e, KeyboardInterrupt) and _resumable(ctx.invoked_subcommand):
                message += "; rerun the same command with --resume to continue"
            click.secho(f"{command}: error: {message}", fg="red", err=True)
            sys.exit(exit_code_for(e))
        finally:
            sys.stdout, sys.stderr = streams
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)


def _known_failure(error: BaseException) -> BaseException:
    """A decode worker's death reaches the command through torch's SIGCHLD handler, which raises
    wherever the main thread is, often while another error unwinds (the chunk it was sending was
    cut): it is still the run's failure (exit 3, --resume), not a bug."""
    if isinstance(error, RuntimeError):
        from .score.faults import decode_worker_died  # a command's own rule, loaded with the command
        died = decode_worker_died(error)
        if died is not None:
            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # torch's handler would raise again mid-report
            return died
    return error


def _resumable(name) -> bool:
    """Whether the command can continue a stopped run (it has --resume)."""
    # by its name: `main.commands` would import every command's module on the way out
    command = main.get_command(None, name) if name in COMMANDS else None
    return command is not None and any("--resume" in p.opts for p in command.params)


def _terminated(signum, frame):
    raise Terminated()


def _stop_on_sigterm():
    """SIGTERM raises Terminated, so a command cleans up as on Ctrl-C (Python's default is to die
    at once: model worker processes left holding their devices, temporaries and the lock left).
    Returns the previous handler (None where no handler can be set: not the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _terminated)


def _set_debug(ctx, _param, value):
    if value:
        ctx.meta["wdsfilter.debug"] = True


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]}, epilog=EXIT_CODES_HELP)
@click.version_option(__version__, prog_name="wdsfilter")
@click.option(DEBUG_FLAG, is_flag=True, expose_value=False, callback=_set_debug, is_eager=True,
              help="Print the traceback of an error (also accepted after the command name; or WDSFILTER_DEBUG=1).")
def main():
    """Validate, filter and score WebDataset shards for image-text and video-text training."""


def run() -> None:
    """The `wdsfilter` process (its console script and `python -m wdsfilter`): main, ended without
    the interpreter's teardown when the command wrote nothing (core/process_exit.py)."""
    from .core.process_exit import end_now_if_nothing_to_close
    try:
        main()
    except SystemExit as done:
        end_now_if_nothing_to_close(done.code)
        raise


def _not_yet(name: str, issue: str) -> click.Command:
    def command():
        raise click.UsageError(f"'wdsfilter {name}' is not implemented yet ({issue}).")
    return click.Command(name, callback=command, help=f"(not implemented yet: {issue})",
                         context_settings={"ignore_unknown_options": True, "allow_extra_args": True})


if __name__ == "__main__":
    run()
