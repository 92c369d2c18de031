"""One sequential pass over one shard -> ShardResult.

Members come from tar_reader (or reading.iter_tar); each is checked once (names, safety, media,
text), media bytes are replaced by a small MediaInfo, and the members are grouped into samples by
the stages' own reading.group_samples (same window, same rekey), so the kept share is the one the
pipeline gets.
The result holds counts, the first findings of each kind and stats, never sample bytes: it is
what travels from a worker process to the parent.
"""
from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Union

from ..stream.census import KeyCensus
from ..stream.members import MemberCaps
from ..stream.reading import OVERSIZED, TarEnd, group_samples, iter_tar, screen_member
from ..storage.remote_net import RemoteUnreachable
from ..storage.shards import close_shard, is_remote, open_shard, runs_command
from ..core.specs import json_path_get, key_digest, split_name
from ..stream.stages import CaptionCleaner, select_sample
from ..core.tally import Tally
from . import tar_reader
from .checks import safety
from .checks.keys import KeyTracker
from .checks.media import ImageStats, MediaInfo, check_image
from .checks.video import VideoStats, check_video
from .checks.text import TEXT_EXTS, caption_source, check_json, check_text
from .findings import Finding, FindingLog
from .options import ValidateOptions

_MISSING = ("missing_caption", "missing_image")
SORT_SUGGESTION = ("members of one key are scattered through the shard (scattered_key): rewrite it with "
                   "`wdsfilter sort-shard SHARD SORTED.tar`, or re-create it with GNU tar --sort=name")


@dataclass
class ShardResult:
    shard: str
    bytes: int = 0
    members: int = 0
    samples: int = 0
    kept: int = 0
    dropped: Dict[str, int] = field(default_factory=dict)  # the stages' drop reasons
    counts: Dict[str, int] = field(default_factory=dict)   # findings per kind, all of them
    findings: List[Finding] = field(default_factory=list)  # the first max_findings of each kind
    # missing_caption/missing_image findings of the first and last sample, held back until the
    # parent knows whether their key continues in the neighbouring shard (then key_across_shards
    # explains them instead).
    head: List[Finding] = field(default_factory=list)
    tail: List[Finding] = field(default_factory=list)
    first_key: Optional[str] = None
    first_member: Optional[str] = None
    last_key: Optional[str] = None
    last_member: Optional[str] = None
    error: Optional[str] = None
    images: dict = field(default_factory=dict)
    videos: dict = field(default_factory=dict)
    # What the samples without a caption ("caption") or without an image ("image") carry instead.
    census: Dict[str, KeyCensus] = field(default_factory=dict)
    suggestion: Optional[str] = None
    seconds: float = 0.0
    limit: int = 100
    remote_retries: int = 0  # reads of a remote shard asked again after a failure

    @property
    def kept_share(self) -> Optional[float]:
        return self.kept / self.samples if self.samples else None

    def add(self, findings: Iterable[Finding]) -> None:
        for f in findings:
            self.counts[f.kind] = self.counts.get(f.kind, 0) + 1
            if self.counts[f.kind] <= self.limit:
                self.findings.append(f)

    def release(self, head: bool = True, tail: bool = True) -> None:
        """Move the held-back findings into the shard's findings (those not explained otherwise)."""
        if head:
            self.add(self.head)
        if tail:
            self.add(self.tail)
        self.head, self.tail = [], []

    def stats(self) -> dict:
        """The per-shard stats (the --stats-dir files and the "shards" list of the JSON report)."""
        return {"shard": self.shard, "bytes": self.bytes, "members": self.members, "samples": self.samples,
                "kept": self.kept, "kept_share": None if self.kept_share is None else round(self.kept_share, 6),
                "dropped": dict(sorted(self.dropped.items())), "findings": dict(sorted(self.counts.items())),
                "error": self.error, "images": self.images, "videos": self.videos,
                "suggestion": self.suggestion, "seconds": round(self.seconds, 4),
                **({"remote_retries": self.remote_retries} if self.remote_retries else {})}


def check_shard(url: str, options: ValidateOptions) -> ShardResult:
    """Never raises on bad data: every problem becomes a finding of the result.

    Local and remote (s3, gs, hf, http) shards are read by the fast tar_reader; one it finds unusual
    is read again through reading.iter_tar, the stages' own reader (see tar_reader.py)."""
    if not runs_command(url):
        try:
            return _ShardCheck(url, options, tar_reader.iter_members).run()
        except tar_reader.Unusual:
            pass
    return _ShardCheck(url, options, iter_tar).run()


def _close(stream) -> Optional[str]:
    """Close the shard's stream; a pipe: command or download that failed says so here (webdataset's
    Pipe raises its exit status on close). Returns that error, or None."""
    try:
        close_shard(stream)
    except OSError as e:
        if getattr(stream, "stalled", None):
            return f"the shard's command or download stalled: {stream.stalled}"
        proc = getattr(stream, "proc", None)
        if proc is not None and proc.returncode is not None:
            # webdataset runs remote URLs through curl (an argument list), pipe: URLs through a shell.
            if isinstance(proc.args, (list, tuple)) and proc.args:
                program = os.path.basename(str(proc.args[0]))
                return f"the download ({program}) failed with exit status {proc.returncode}"
            return f"the shard's command exited with status {proc.returncode}"
        return f"{type(e).__name__}: {e}"
    return None


class _ShardCheck:
    def __init__(self, url: str, options: ValidateOptions, reader: Callable = iter_tar):
        self.url = url
        self.reader = reader
        self.options = options
        stage = self.stage = options.stage
        self.log = FindingLog(url, options.max_findings)
        self.keys = KeyTracker(stage.rekey, self.log)
        self.images, self.videos = ImageStats(), VideoStats()
        self.cleaner = CaptionCleaner.from_config(stage)
        self.census = {"caption": KeyCensus(), "image": KeyCensus()}
        caption_alts = stage.caption_spec.alternatives
        self.text_exts = TEXT_EXTS | {a.ext for a in caption_alts if not a.path}
        self.json_exts = {"json"} | {a.ext for a in caption_alts if a.path}
        self.caps = MemberCaps(stage)
        self.consumed: Dict[str, set] = {}  # key -> extensions of its empty or unsafe members
        self.end: Optional[TarEnd] = None
        self.members = 0
        # key -> None when a sample of the key would be kept, else the drop reason of its first
        # sample. Samples are counted as distinct keys: a key whose members are too far apart for
        # the grouping window reaches the stages as several fragments (a scattered key).
        self.outcome: Dict[Union[str, bytes], Optional[str]] = {}  # by specs.key_digest: every key of the shard
        self.scattered: Dict[str, str] = {}  # scattered key -> its first member that came back
        self.fragments = 0
        self.retries, self.remote_size = [], None  # a remote shard's retry messages, its object's size
        self.pending: List[tuple] = []  # (kind, key, Finding or None) of missing_* findings
        self.pend_counts: Counter = Counter()
        self.head: List[Finding] = []
        self.tail: List[Finding] = []
        self.tail_key: Optional[str] = None
        self.suggestion: Optional[str] = None

    def run(self) -> ShardResult:
        started = time.perf_counter()
        url, stage = self.url, self.stage
        try:
            stream = open_shard(url, stage.allow_pipe, stage.allow_remote, stage.stream_idle_seconds,
                                stage.remote_options(), on_retry=self.retries.append)
        except OSError as e:  # a remote shard's message names the credentials used
            kind = {FileNotFoundError: "remote_object_missing", PermissionError: "remote_access_denied",
                    RemoteUnreachable: "remote_unreachable"}.get(type(e))
            if kind == "remote_unreachable":
                self.log.add(kind, "", "", str(e))
            elif kind and is_remote(url):
                self.log.add(kind, "", "", f"{e}; fix the URL, or grant access or pass other credentials")
            else:
                self.log.add("unreadable_tar", "", "", f"cannot open the shard: {e}; check the path and permissions")
            return self._result(started, str(e))
        self.remote_size = getattr(stream, "size", None) if is_remote(url) else None
        try:
            # A fresh Tally: the grouping step counts into it, and the findings say it better.
            for sample in group_samples(self._members(self.reader(stream, url, self.caps)), stage, Tally()):
                if "__marker__" not in sample:  # StageConfig(emit_rejects=True) adds shard-end markers
                    self._sample(sample)
        finally:
            failed = _close(stream)
        error = self._shard_end()
        if failed:
            # A pipe: command that exits non-zero, or a download that fails: what was read may be
            # all of the shard or part of it, so the shard is not clean.
            self.log.add("shard_command_failed", "", "",
                         f"{failed}; {self.members} member(s) were read before it. Check the command or URL")
            error = error or failed
        return self._result(started, error)

    # -- members -------------------------------------------------------------------------------
    def _members(self, items: Iterable) -> Iterator:
        keys, log, options = self.keys, self.log, self.options
        for m in items:
            if isinstance(m, TarEnd):
                self.end = m
                yield m
                continue
            name, skip = m["fname"], m.get("__skip__")
            if skip is None or skip[0] != "special_member":  # files only, as the readers count them
                self.members += 1
            key, ext = keys.member(name)
            if key is None:
                continue
            # The stages' own screening (allow_unsafe aside: an unsafe member is always reported).
            ext, skip = screen_member(m, ext, self.caps, False)
            m["__screened__"] = (ext, skip)
            if skip is not None:
                reason, message = skip
                if reason == "empty_member":
                    log.add("empty_member", name, key, "zero-byte member; ignored")
                elif reason == "unsafe_member":
                    safety.check_member(name, key, ext, log)
                else:
                    log.add(reason, name, key, message)
                self.consumed.setdefault(key, set()).add(ext)
                yield m  # the grouping step lists it in the sample's "__skipped__"
                continue
            data = m["data"]
            kind = self.caps.kind(ext)  # as the stages see it: an --image-key extension is an image
            if kind == "image":
                m["data"] = check_image(name, key, data, options, log, self.images)
            elif kind == "video" and ext in self.stage.image_spec.exts:
                # Only a clip under the image key is read in training: an .mp4 beside the image
                # (a preview, an audio track) is nobody's video, and not opened at all, so a
                # broken one is no error of the set (issue 35 item 16).
                m["data"] = check_video(name, key, data, options, log, self.videos)
            elif ext in self.json_exts:
                check_json(name, key, data, log)
            elif ext in self.text_exts:
                check_text(name, key, data, log)
            yield m

    # -- samples -------------------------------------------------------------------------------
    def _sample(self, sample: dict) -> None:
        """Would the stages keep this sample? Mirrors select -> clean_captions -> decode."""
        self.fragments += 1
        stage = self.stage
        key = sample["__key__"]
        caption, image, drop, _ = select_sample(sample, stage)
        held: List[Finding] = []
        if drop is not None:
            if drop == "empty_caption":
                alt = caption_source(sample, stage.caption_spec, "empty_caption")
                self.log.add("empty_caption", self._name(sample, alt.ext), key, f"caption under '{alt}' is empty")
            elif drop == "caption_not_text":
                alt = caption_source(sample, stage.caption_spec, "caption_not_text")
                value = json_path_get(sample.get("__parsed_" + alt.ext), alt.path)
                self.log.add("caption_not_text", self._name(sample, alt.ext), key,
                             f"caption under '{alt}' is a JSON {type(value).__name__} ({str(value)[:60]}), not text")
            if drop == "oversized_sample":
                self.log.add("oversized_sample", self._name(sample, next(e for e in sample if not e.startswith("__"))),
                             key, sample[OVERSIZED])
            elif drop != "dotted_basename":  # explained by the member names, not by the specs
                no_caption, no_image = caption is None and drop == "missing_caption", image is None
                for what, missing in (("caption", no_caption), ("image", no_image)):
                    if missing:
                        self.census[what].add(sample, sample.get("__parsed_json"))
                held = self._missing(sample, no_caption, no_image)
        else:
            cleaned, foreign = self.cleaner.clean(caption)
            if foreign or not cleaned.strip():
                name = self._name(sample, caption_source(sample, stage.caption_spec, None).ext)
                if foreign:
                    token = self.cleaner.image_token
                    self.log.add("foreign_image_token", name, key,
                                 f"caption has {', '.join(foreign)}; " + (f"the configured image token is {token!r}"
                                 if token else "no image token is configured (--image-token)"))
                if not cleaned.strip():
                    drop = "empty_caption"
                    self.log.add("empty_caption", name, key, "caption is empty once special tokens are removed")
            if drop is None:
                media = sample[image.ext]
                if isinstance(media, MediaInfo) and media.drop:
                    drop = media.drop  # reported with the member
        digest = key_digest(key)
        if digest not in self.outcome:
            self.outcome[digest] = drop
        else:  # a fragment of a key already seen: the window did not reach its other members
            self.scattered.setdefault(key, self._name(sample, next((e for e in sample if not e.startswith("__")), "")))
            if drop is None:
                self.outcome[digest] = None
        self._hold(key, held)

    def _missing(self, sample: dict, no_caption: bool, no_image: bool) -> List[Finding]:
        key = sample["__key__"]
        consumed = self.consumed.get(key, ())
        first = self._name(sample, next((e for e in sample if not e.startswith("__")), ""))
        found = []
        stage = self.stage
        if no_caption and not any(e in consumed for e in stage.caption_spec.exts):
            found.append(Finding("missing_caption", self.url, first, key,
                                 f"sample {key!r} has no caption under '{stage.caption_spec}' "
                                 f"(members: {self._exts(sample)})"))
        if no_image and not any(e in consumed for e in stage.image_spec.exts):
            found.append(Finding("missing_image", self.url, first, key,
                                 f"sample {key!r} has no image under '{stage.image_spec}' "
                                 f"(members: {self._exts(sample)})"))
        return found

    def _hold(self, key: str, found: List[Finding]) -> None:
        """The first sample's and the latest sample's missing_* findings wait for the end of shard
        (key_across_shards may explain them); the others wait in `pending` (scattered_key may)."""
        if key == self.keys.first[1]:
            self.head += found
            return
        self._pend(self.tail)
        self.tail, self.tail_key = found, key

    def _pend(self, found: List[Finding]) -> None:
        # Kept in full only as many as the log would list; the rest are (kind, key) for the counts.
        for f in found:
            self.pend_counts[f.kind] += 1
            self.pending.append((f.kind, f.key, f if self.pend_counts[f.kind] <= 2 * self.log.limit else None))

    def _explained(self, kind: str, key: str) -> bool:
        """A missing_* finding of a fragment whose key has the member elsewhere in the shard: the
        member is there, under the asked key, only too far away (scattered_key says so)."""
        if key not in self.scattered:
            return False
        spec = self.stage.caption_spec if kind == "missing_caption" else self.stage.image_spec
        return bool(self.keys.exts_of(key) & set(spec.exts))

    def _name(self, sample: dict, ext: str) -> str:
        return self.keys.name(sample["__key__"], ext)

    @staticmethod
    def _exts(sample: dict) -> str:
        return ", ".join(e for e in sample if not e.startswith("__")) or "none"

    # -- end of shard ----------------------------------------------------------------------------
    @property
    def samples(self) -> int:
        return len(self.outcome)

    @property
    def kept(self) -> int:
        return sum(1 for reason in self.outcome.values() if reason is None)

    @property
    def dropped(self) -> Counter:
        """Drop reasons per key; a scattered key that no fragment of would be kept is lost to the
        scattering, whatever its fragments lack (the stages count those as missing_caption/_image)."""
        scattered = {key_digest(k) for k in self.scattered}
        return Counter("scattered_key" if digest in scattered else reason
                       for digest, reason in self.outcome.items() if reason is not None)

    def _shard_end(self) -> Optional[str]:
        end, log = self.end, self.log
        error = end.error if end else None
        if error and end.failed and is_remote(self.url):
            log.add("remote_read_failed", end.member or "", "", f"{end.failed}; {self.samples} sample(s) "
                    f"({end.members} members) were read before it. Validate it again")
        elif error:
            if end.not_a_tar:
                log.add("unreadable_tar", "", "", f"{error}; no member could be read. Is it a tar (a git-lfs "
                                                  f"pointer file, an HTML error page)? Re-create or re-download it")
            else:
                key = split_name(end.member, self.stage.rekey)[0] or ""
                if self.keys.last and end.member == self.keys.last[0]:
                    # Broke at a member boundary: the last sample may have had more members.
                    readable = (f"{self.samples} sample(s) ({end.members} members) are readable before the "
                                f"break, the last one perhaps incomplete")
                else:  # broke inside end.member: its sample is incomplete if it had members before
                    partial = 1 if key and self.keys.exts_of(key) else 0
                    readable = (f"{self.samples - partial} complete sample(s) ({end.members} members) are "
                                f"readable before the break")
                log.add("truncated_tar", end.member, key, f"{error}; {readable}. Re-create or re-download this shard")
        if self.tail_key is not None and self.keys.last and self.tail_key != self.keys.last[1]:
            self._pend(self.tail)  # the last member's key is not the last sample's: nothing to hold
            self.tail = []
        # A key whose later fragment only repeats member names is duplicated, not scattered
        # (duplicate_key says so); scattered keys brought a new member after other keys.
        returned = {key for _, key in self.keys.returns}
        self.scattered = {k: m for k, m in self.scattered.items() if k in returned}
        self.keys.finish(self.scattered)
        if self.scattered:
            self._scattered_finding()
        self._release_pending()
        if not self.samples:
            if not error:
                log.add("empty_shard", "", "", "the shard holds no samples" + (
                    f" ({self.members} member(s), none part of a sample)" if self.members else " (no member at all)")
                        + "; readers skip it. img2dataset writes such a shard when every URL of it failed")
        elif self.kept == 0:
            log.add("all_filtered", "", "", self._all_filtered_message())
        return error

    def _scattered_finding(self) -> None:
        n, total = len(self.scattered), self.samples
        lost = sum(1 for key in self.scattered if self.outcome[key_digest(key)] is not None)
        key, member = next(iter(self.scattered.items()))
        self.suggestion = SORT_SUGGESTION
        self.log.add("scattered_key", member, key,
                     f"{n} of {total} keys ({n / total:.0%}) have members too far apart in the tar for readers to "
                     f"put together (e.g. member {member} comes back after other keys): readers see "
                     f"{self.fragments} half-samples and fragments instead of {total} samples, and {lost} sample(s) "
                     f"are lost. `tar -cf x.tar *.txt *.json *.jpg` and archiving a folder in directory order write "
                     f"shards like this. Rewrite it: wdsfilter sort-shard {self.url} SORTED.tar, or re-create it "
                     f"with GNU tar --sort=name")
        # What the fragments lack is in the shard under the asked keys: no other key would help.
        for what, spec in (("caption", self.stage.caption_spec), ("image", self.stage.image_spec)):
            if any(self.keys.exts_of(k) & set(spec.exts) for k in self.scattered):
                self.census[what] = KeyCensus()

    def _release_pending(self) -> None:
        """Log the held missing_* findings that scattering does not explain (once per scattered key)."""
        said = set()
        for kind, key, finding in self.pending:
            if key in self.scattered:
                if self._explained(kind, key) or (kind, key) in said:
                    continue
                said.add((kind, key))
            if finding is None:
                self.log.counts[kind] += 1  # counted; beyond what the report lists
            else:
                self.log.add(finding.kind, finding.member, finding.key, finding.message)
        self.pending = []
        self.head = [f for f in self.head if not self._explained(f.kind, f.key)]
        self.tail = [f for f in self.tail if not self._explained(f.kind, f.key)]

    def _all_filtered_message(self) -> str:
        dropped = self.dropped
        reasons = ", ".join(f"{r} {n}" for r, n in dropped.most_common())
        text = f"0 of {self.samples} samples would be kept (dropped: {reasons})"
        self.suggestion = self._suggest(dropped.most_common(1)[0][0])
        return text + (f"; {self.suggestion}" if self.suggestion else "")

    def _suggest(self, top: str) -> Optional[str]:
        """The select stage's first-shard hint: another spec (census.KeyCensus) or --rekey last-dot;
        for a scattered shard, the rewrite. None when no fix is known (then none is promised)."""
        if top == "scattered_key":
            return SORT_SUGGESTION
        if top == "dotted_basename":
            return "member names have dots in their basenames (img.v2.0001.jpg); use --rekey last-dot"
        what = {"missing_caption": "caption", "missing_image": "image"}.get(top)
        if what is None:
            return None
        spec = self.stage.caption_spec if what == "caption" else self.stage.image_spec
        return self.census[what].suggest(what, spec)

    def _result(self, started: float, error: Optional[str]) -> ShardResult:
        log = self.log
        first, last = self.keys.first, self.keys.last
        size = os.path.getsize(self.url) if os.path.isfile(self.url) else (self.remote_size or 0)
        return ShardResult(
            shard=self.url, bytes=size, members=self.members, samples=self.samples, kept=self.kept,
            dropped=dict(self.dropped), counts=dict(log.counts), findings=list(log.items),
            head=self.head, tail=self.tail,
            first_member=first and first[0], first_key=first and first[1],
            last_member=last and last[0], last_key=last and last[1], error=error,
            images=self.images.to_dict(), videos=self.videos.to_dict(),
            census={w: c for w, c in self.census.items() if c.samples}, suggestion=self.suggestion,
            seconds=time.perf_counter() - started, limit=log.limit, remote_retries=len(self.retries))
