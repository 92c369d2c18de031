"""Per-reason, per-shard counters shared by the stages of one pipeline, and the starvation watchdog.

One Tally lives in each process that runs a pipeline (the main process or a DataLoader worker):
every stage of that pipeline holds the same object, so pickling the pipeline into a worker keeps
them sharing it. Workers report their tallies to the parent through a StatsSink folder.
"""
from __future__ import annotations

import json
import os
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Dict, List, Optional

from .errors import StarvationError
from .scratch import Scratch

MAX_EXAMPLES = 3
# Reasons counted per shard, not per sample: they are not part of the "dropped" sample total.
SHARD_REASONS = ("truncated_tar", "unreadable_shard")
# Drops the user asked for (the score filter's rules and dedup), not problems of the data: the
# loader logs them at INFO, the others at WARNING.
ASKED_REASONS = ("filtered_by_score", "duplicate", "eval_match")

# Why a sample was dropped, in the users' words: the hint printed with the count.
HINTS = {
    "missing_caption": "no caption under the caption key spec; check --caption-key (wdsfilter validate names one when the shards hold a candidate)",
    "missing_image": "no image under the image key spec; check --image-key",
    "empty_caption": "caption is empty or whitespace",
    "caption_not_text": "the caption field holds a JSON number, list or object, not text; point --caption-key at a text field",
    "invalid_json": "the .json member is not valid JSON",
    "invalid_utf8": "the text member is not UTF-8",
    "corrupt_image": "the image does not decode",
    "oversized_image": "image above max_pixels (read from its header, never decoded); raise max_pixels or use oversize='reduce'",
    "empty_member": "zero-byte member",
    "truncated_tar": "the tar ends early or is corrupt; samples before the break were kept",
    "unreadable_shard": "the shard could not be opened, or is not a tar at all",
    "shard_command_failed": "the pipe: command or download of the shard failed",
    "remote_retries": "a read of a remote shard failed and was asked again from the byte it reached (remote_attempts in a row fail the shard)",
    "oversized_sample": "one sample's members add up past max_sample_bytes; its bytes were let go",
    "oversized_member": "a member over its kind's byte cap (max_text_bytes, max_image_bytes, ...); streamed past unread",
    "special_member": "a symbolic link, hard link, device or FIFO member; tar readers do not follow it",
    "corrupt_member": "a compressed member (.gz) does not decompress",
    "unsafe_member": "pickle/torch payload not loaded (safe by default; allow_unsafe=True to keep the bytes)",
    "nonadjacent_key": "members of one key are not adjacent in the tar",
    "dotted_basename": "file names with dots split at the first dot; use rekey='last-dot'",
    "duplicate_member": "the same member name appears twice in one sample; the first was kept",
    "no_extension": "member without an extension (or a dotfile) ignored",
    "foreign_image_token": "caption carried another image token; normalised to the configured one",
    "filtered_by_score": "dropped by a score threshold",
    "duplicate": "not the survivor of its duplicate group (wdsfilter dedup)",
    "eval_match": "matches an eval image (wdsfilter dedup --eval)",
    "no_score": "no score row for this key in the score files, or a row no scorer scored",
    "transform_error": "the user's transform raised on this sample",
}


@dataclass
class Example:
    shard: str
    member: str
    message: str


class Tally:
    """Counts of dropped samples (by reason, by shard) and of notes that dropped nothing."""

    def __init__(self, starvation_samples: int = 0, starvation_seconds: float = 0.0, name: str = "pipeline"):
        self.starvation_samples = starvation_samples
        self.starvation_seconds = starvation_seconds
        self.name = name
        # Samples a shuffle buffer takes in before it gives its first (pipeline.SeededShuffle's
        # initial fill): held back, not starved, so the count before the watchdog fires starts after them.
        self.held_back = 0
        # () -> what is wrong with the keys, or None: set by the select stage (FirstShardCheck).
        self.explain = None
        self.reset()

    def reset(self) -> None:
        self.samples_read = 0
        self.samples_out = 0
        self.shards_read = 0
        self.shard_urls: set = set()  # distinct shards opened (resampling opens one many times)
        self.dropped: Counter = Counter()
        self.notes: Counter = Counter()
        self.stage_of: Dict[str, str] = {}
        self.by_shard: Dict[str, Counter] = defaultdict(Counter)
        self.examples: Dict[str, List[Example]] = defaultdict(list)
        self._started: Optional[float] = None
        self._waiting: Optional[float] = None  # since when the consumer waits for the next sample
        self.position = ("", "")  # (shard, member) the reader is at

    # -- recording -------------------------------------------------------------------------
    def _record(self, counter: Counter, reason: str, stage: str, shard: str, member: str, message: str) -> None:
        counter[reason] += 1
        self.stage_of.setdefault(reason, stage)
        self.by_shard[shard][reason] += 1
        examples = self.examples[reason]
        if len(examples) < MAX_EXAMPLES:
            examples.append(Example(shard, member, message))

    def drop(self, reason: str, stage: str, shard: str = "", member: str = "", message: str = "") -> None:
        """A sample was dropped. Checks the watchdog: dropping is where starvation shows."""
        self._record(self.dropped, reason, stage, shard, member, message)
        self.check_starvation()

    def note(self, reason: str, stage: str, shard: str = "", member: str = "", message: str = "") -> None:
        """Something worth counting that dropped no sample (a bad member, a normalised token)."""
        self._record(self.notes, reason, stage, shard, member, message)

    def sample_read(self) -> None:
        if self._started is None:
            self._started = time.monotonic()
        self.samples_read += 1

    def shard_opened(self, url: Optional[str] = None) -> None:
        if self._started is None:
            self._started = time.monotonic()
        self.shards_read += 1
        if url is not None:
            self.position = (url, "")
            if len(self.shard_urls) < 100_000:
                self.shard_urls.add(url)
        self.check_starvation()

    def sample_out(self) -> None:
        self.samples_out += 1

    def waiting(self) -> None:
        """The consumer asks for the next sample (called by the watch stage): the time the stages
        take to produce it is what the starvation_seconds limit bounds. Time spent in the
        consumer (a training step, a checkpoint) does not count."""
        self._waiting = time.monotonic()

    def ticker(self, shard: str):
        """A callable(member) for a shard's reader: records where reading is and checks the
        watchdog, so a stage that produces nothing is noticed even when nothing is dropped."""
        def tick(member: str) -> None:
            self.position = (shard, member)
            if self.starvation_seconds:
                self.check_starvation()
        return tick

    # -- the watchdog ----------------------------------------------------------------------
    def check_starvation(self, stream_ended: bool = False) -> None:
        """Raise instead of hanging when nothing has come out yet after many samples or seconds.
        At the end of a finite stream, any samples read with none out is an error too."""
        seconds = self.starvation_seconds
        if seconds:
            since = self._waiting if self._waiting is not None else (None if self.samples_out else self._started)
            if since is not None and time.monotonic() - since >= seconds:
                raise StarvationError(self.stall_message(time.monotonic() - since))
        if self.samples_out:
            return
        enabled = self.starvation_samples or self.starvation_seconds
        if stream_ended and enabled and self.samples_read:
            raise StarvationError(self.starvation_message())
        # Shards opened with no sample read count too: a resampled stream of unreadable shards
        # (git-lfs pointer files named .tar) reopens them thousands of times a second.
        by_count = self.starvation_samples and (
            self.samples_read >= self.starvation_samples + self.held_back if self.samples_read
            else self.shards_read >= self.starvation_samples)
        if by_count:
            raise StarvationError(self.starvation_message())

    def stall_message(self, seconds: float) -> str:
        shard, member = self.position
        where = (f"reading shard {shard} at member {member}" if member else f"reading shard {shard}") if shard \
            else "before any shard was opened"
        head = (f"{self.name}: no sample came out for {seconds:.0f}s (starvation_seconds="
                f"{self.starvation_seconds:g}); the stages are stuck {where}.")
        if not self.samples_out:  # nothing came out at all: say why the samples read were dropped
            return head + "\n" + self.starvation_message()
        return head + "\n" + self.summary()

    def empty_epoch_message(self) -> str:
        """Why a finite epoch ended with no sample, merged over the workers (each worker that read
        samples and kept none has raised already: here the shards gave none)."""
        opened = f"from {self.shards_read} shard opening(s)" if self.shards_read else "and no shard was opened"
        return (f"{self.name}: the epoch ended with no sample ({self.samples_read} read {opened}); training "
                f"would run on nothing. Check the shard paths (a git clone without `git lfs pull` leaves "
                f"pointer files named .tar) or run `wdsfilter validate` on the shards.\n" + self.summary())

    def starvation_message(self) -> str:
        elapsed = 0.0 if self._started is None else time.monotonic() - self._started
        distinct = len(self.shard_urls) or self.shards_read
        opened = f" (opened {self.shards_read} times: resampled)" if self.shards_read > distinct else ""
        lines = [f"{self.name}: {self.samples_read} samples read from {distinct} shard(s){opened} in "
                 f"{elapsed:.0f}s and none came out; the run would hang."]
        per_sample = Counter({r: n for r, n in self.dropped.items() if r not in SHARD_REASONS})
        if per_sample:
            reason, count = per_sample.most_common(1)[0]
            lines.append(f"Stage '{self.stage_of[reason]}' rejected {count} of them: {reason} "
                         f"({HINTS.get(reason, '')}).")
        problem = self.explain() if self.explain is not None else None
        if problem:
            lines.append(problem)
        if self.notes.get("nonadjacent_key"):
            # Fragments, not wrong keys: the caption may well be there, under the asked key.
            lines.append(f"{self.notes['nonadjacent_key']} member(s) came apart from their key's other members "
                         f"(nonadjacent_key): if a shard's members of one key are scattered (written with `tar -cf "
                         f"x.tar *.txt *.jpg`, or in directory order), its samples arrive as fragments and no other "
                         f"key would help. `wdsfilter validate` says so (scattered_key); `wdsfilter sort-shard IN OUT` "
                         f"rewrites the shard.")
        lines.append(self.summary())
        return "\n".join(lines)

    # -- reporting -------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "samples_read": self.samples_read,
            "samples_out": self.samples_out,
            "shards_read": self.shards_read,
            "dropped": dict(self.dropped),
            "notes": dict(self.notes),
            "stage_of": dict(self.stage_of),
            "by_shard": {s: dict(c) for s, c in self.by_shard.items()},
            "examples": {r: [e.__dict__ for e in ex] for r, ex in self.examples.items()},
        }

    def merge_dict(self, d: dict) -> None:
        self.samples_read += d.get("samples_read", 0)
        self.samples_out += d.get("samples_out", 0)
        self.shards_read += d.get("shards_read", 0)
        self.dropped.update(d.get("dropped", {}))
        self.notes.update(d.get("notes", {}))
        for r, s in d.get("stage_of", {}).items():
            self.stage_of.setdefault(r, s)
        for shard, c in d.get("by_shard", {}).items():
            self.by_shard[shard].update(c)
        for r, ex in d.get("examples", {}).items():
            room = MAX_EXAMPLES - len(self.examples[r])
            self.examples[r].extend(Example(**e) for e in ex[:max(room, 0)])

    def problems(self) -> bool:
        """Drops or notes that are not the rules the user asked for: problems of the data."""
        return bool(self.notes) or any(n for r, n in self.dropped.items() if r not in ASKED_REASONS)

    def summary(self) -> str:
        dropped = sum(n for r, n in self.dropped.items() if r not in SHARD_REASONS)
        lines = [f"samples read: {self.samples_read}, kept: {self.samples_out}, dropped: {dropped}"]
        shards = Counter({r: n for r, n in self.dropped.items() if r in SHARD_REASONS})
        samples = Counter({r: n for r, n in self.dropped.items() if r not in SHARD_REASONS})
        for title, counter in (("shards", shards), ("dropped", samples), ("noted", self.notes)):
            for reason, count in counter.most_common():
                ex = self.examples.get(reason) or []
                where = f" e.g. {ex[0].shard} member {ex[0].member}" if ex and ex[0].member else (
                    f" e.g. {ex[0].shard}" if ex else "")
                hint = HINTS.get(reason) or HINTS.get(reason.rpartition("rejected: ")[2], "")  # the score filter's
                lines.append(f"  {title} {count:>7} {reason}: {hint}{where}")
        return "\n".join(lines)


class StatsSink:
    """A folder where each process writes its tally (atomically); the parent merges them.

    Files rather than queues: a worker never blocks on a parent that stopped reading. Unless a
    folder is given, a working folder of scratch.py's in $TMPDIR: swept by a later run once this
    process is gone, however it ended (kill -9 included).
    """

    def __init__(self, folder: Optional[str] = None):
        self._scratch = None
        if folder is None:
            self._scratch = Scratch("stats")
            folder = self._scratch.path
        self.folder = folder

    def __getstate__(self):  # a worker gets the folder, not the maker's hold on it
        return {**self.__dict__, "_scratch": None}

    def remove(self) -> None:
        """The folder and everything in it (a working folder of this process's only)."""
        if self._scratch is not None:
            self._scratch.remove()

    def write(self, tally: Tally, name: Optional[str] = None) -> None:
        name = name or f"tally-{os.getpid()}"
        tmp = os.path.join(self.folder, f".{name}.tmp")
        try:
            with open(tmp, "w") as f:
                json.dump(tally.to_dict(), f)
            os.replace(tmp, os.path.join(self.folder, f"{name}.json"))
        except FileNotFoundError:
            if os.path.isdir(self.folder):
                raise
            # removed: the run that reads it ended (a stage's last write as its generator is closed)

    def read(self) -> Tally:
        total = Tally()
        for fname in sorted(os.listdir(self.folder)):
            if fname.endswith(".json") and not fname.startswith("."):
                try:
                    with open(os.path.join(self.folder, fname)) as f:
                        total.merge_dict(json.load(f))
                except (OSError, ValueError):
                    continue  # a worker is rewriting it; the next read gets it
        return total

    def clear(self) -> None:
        for fname in os.listdir(self.folder):
            try:
                os.remove(os.path.join(self.folder, fname))
            except OSError:
                pass
