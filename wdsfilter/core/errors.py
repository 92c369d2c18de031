"""Exception types and the exit code each one means. Configuration errors raise at once; data
errors are counted and skipped.

Exit codes of every `wdsfilter` command (wdsfilter/cli.py maps exceptions to them, once):

    0  clean
    1  findings (validate: findings at the --fail-on level)
    2  usage or configuration error (a bad option, a spec no sample has, an output that cannot be
       written), found before any work starts
    3  the run failed (I/O error, shards that could not be read to their end where every sample
       counts, an internal error)
    130 / 143  interrupted by Ctrl-C / terminated by SIGTERM (after the command's cleanup)
"""

EXIT_CLEAN = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2
EXIT_RUN_FAILED = 3
EXIT_INTERRUPTED = 130  # Ctrl-C, as shells report it
EXIT_TERMINATED = 143  # SIGTERM (128 + 15), as shells report a process it killed

EXIT_MEANINGS = {EXIT_CLEAN: "clean", EXIT_FINDINGS: "findings", EXIT_USAGE: "usage or configuration error",
                 EXIT_RUN_FAILED: "the run failed (I/O, unreadable shards, internal error)"}


def exit_codes_help(codes=tuple(EXIT_MEANINGS), findings: str = EXIT_MEANINGS[EXIT_FINDINGS]) -> str:
    """The epilog of a command's --help: only the exit `codes` it can return, each with its meaning
    (`findings`: the command's own words for code 1, e.g. "findings at the --fail-on level")."""
    words = {**EXIT_MEANINGS, EXIT_FINDINGS: findings}
    return "Exit codes: " + ", ".join(f"{code} {words[code]}" for code in codes) + "; --debug shows the traceback."


EXIT_CODES_HELP = exit_codes_help()  # every code: the `wdsfilter` group's own --help


class WdsFilterError(Exception):
    """Base class of every error wdsfilter raises on purpose."""

    exit_code = EXIT_RUN_FAILED


class ConfigError(WdsFilterError, ValueError):
    """The user's configuration cannot work (a malformed spec, a caption key no sample has).

    Never swallowed by the data-error policy: a wrong caption key must stop the run, not
    silently filter every sample.
    """

    exit_code = EXIT_USAGE


class OutputError(ConfigError):
    """An output (--output, --stats-dir, --out) that cannot be written; checked before any work."""


class StarvationError(WdsFilterError, RuntimeError):
    """The pipeline read many samples (or waited long) and yielded none: it would hang."""


class UnsafeInputError(WdsFilterError, PermissionError):
    """An input that would execute code (pipe: URL, pickle) was refused."""

    exit_code = EXIT_USAGE


class RunError(WdsFilterError, RuntimeError):
    """The run could not be completed (an I/O error, shards that could not be read to their end
    where every sample must be accounted for). What was done is kept; a rerun can resume."""


class DataError(WdsFilterError):
    """One bad member or sample. Counted under `reason` and skipped; the run goes on."""

    def __init__(self, reason: str, message: str, shard: str = "", member: str = "", key: str = ""):
        self.reason = reason
        self.shard = shard
        self.member = member
        self.key = key
        where = " ".join(p for p in (f"shard={shard}" if shard else "", f"member={member}" if member else "") if p)
        super().__init__(f"{reason}: {message}" + (f" ({where})" if where else ""))


def require(module: str, purpose: str, install: str = "pip install 'wdsfilter[score]'"):
    """`module` imported, or a ConfigError saying what needs it and how to install it: an optional
    dependency that is missing (the light core has no torch, open_clip, Ray) is the user's set-up
    to fix, not a bug in wdsfilter."""
    import importlib
    try:
        return importlib.import_module(module)
    except ImportError as e:
        found = "is not installed" if getattr(e, "name", None) == module.split(".")[0] else f"could not be imported ({e})"
        raise ConfigError(f"{purpose} needs {module.split('.')[0]}, which {found}: {install}") from e


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's preemption, `kill`, `timeout`): the command stops as on Ctrl-C, its
    cleanup included (model workers stopped, temporaries removed, the output lock released;
    nothing unfinished is marked done), instead of dying where it stands."""


def exit_code_for(error: BaseException) -> int:
    """The exit code a command ends with when `error` escapes it."""
    if isinstance(error, Terminated):
        return EXIT_TERMINATED
    if isinstance(error, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    if isinstance(error, WdsFilterError):
        return error.exit_code
    return EXIT_RUN_FAILED  # OSError, MemoryError, a bug: the run failed


def describe(error: BaseException) -> str:
    """The one line printed for an error: ours speak for themselves; others get their type, and a
    bug says so."""
    text = " ".join(str(error).split("\n", 1)[0].split()) if not isinstance(error, WdsFilterError) else str(error)
    if isinstance(error, Terminated):
        return "terminated (SIGTERM); nothing unfinished was marked done"
    if isinstance(error, KeyboardInterrupt):
        return "interrupted (Ctrl-C); nothing unfinished was marked done"
    if isinstance(error, WdsFilterError):
        return text
    if isinstance(error, (OSError, MemoryError)):
        return f"the run failed: {type(error).__name__}: {text}"
    return (f"internal error: {type(error).__name__}: {text} (a bug in wdsfilter; rerun with --debug for the "
            f"traceback and report it)")
