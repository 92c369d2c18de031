"""Exception types. Configuration errors raise at once; data errors are counted and skipped."""


class WdsFilterError(Exception):
    """Base class of every error wdsfilter raises on purpose."""


class ConfigError(WdsFilterError, ValueError):
    """The user's configuration cannot work (a malformed spec, a caption key no sample has).

    Never swallowed by the data-error policy: a wrong caption key must stop the run, not
    silently filter every sample.
    """


class StarvationError(WdsFilterError, RuntimeError):
    """The pipeline read many samples (or waited long) and yielded none: it would hang."""


class UnsafeInputError(WdsFilterError, PermissionError):
    """An input that would execute code (pipe: URL, pickle) was refused."""


class DataError(WdsFilterError):
    """One bad member or sample. Counted under `reason` and skipped; the run goes on."""

    def __init__(self, reason: str, message: str, shard: str = "", member: str = "", key: str = ""):
        self.reason = reason
        self.shard = shard
        self.member = member
        self.key = key
        where = " ".join(p for p in (f"shard={shard}" if shard else "", f"member={member}" if member else "") if p)
        super().__init__(f"{reason}: {message}" + (f" ({where})" if where else ""))
