"""What may be written or shown: every URL without its secrets, by one rule applied where files are
written and where the terminal is written, not at each place a URL is formatted.

A shard's URL may carry a password (`https://user:pass@host/x.tar`) or a presigned signature
(`?X-Amz-Signature=...`). Such a URL is needed to read the shard again, so the run keeps it in one
file, `shards.json` (written 0600: `atomic.write_json(..., private=True)`); every other file (score
files, the failure ledger, markers, summary.json, run.yaml, reports, validate's stats and reports),
folder name, log line and error shows it as `remote.redact_url` does: no `user:password@`, no query.

    published(value)   a JSON-able value (str, dict, list, tuple) with every URL in its strings redacted
    redact_text(text)  the same for one text (a message, a page, a log line)
    Redacting(stream)  a text stream (the terminal) whose every write is redacted
    RedactedRecords    the log filter on the "wdsfilter" logger (every log line of the package,
                       in a user's training process too)

Readers that match a file's URL with one given again compare published names (`published(url)`).
"""
from __future__ import annotations

import logging
from typing import Any

from .urls import redact_text, redact_url  # noqa: F401 - redact_url: the rule's other half, for callers of this module

def published(value: Any) -> Any:
    """`value` as it may be written: strings redacted (redact_text), inside dicts (keys too), lists
    and tuples; other values as they are."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {published(k): published(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(published(v) for v in value)
    return value


class Redacting:
    """A text stream (sys.stdout, sys.stderr while a command runs) whose writes are redacted; the
    rest (isatty, fileno, encoding, buffer) is the stream's own."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(redact_text(text) if isinstance(text, str) else text)
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


class RedactedRecords(logging.Filter):
    """Each log record of the "wdsfilter" logger with its URLs redacted (installed once, by the
    package's __init__: every module logs there)."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        shown = redact_text(text)
        if shown != text:
            record.msg, record.args = shown, ()
        return True
