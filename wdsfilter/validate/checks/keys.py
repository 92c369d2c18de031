"""Member names of one shard, as webdataset turns them into (key, extension).

Checks every name once, in tar order, exactly (no window): the stages merge members of one key
that are a few members apart, but plain webdataset and most other readers make half-samples.
Holds the keys of the shard (specs.key_digest: a short key as it is, a long one as a 16-byte
digest; never member bytes) to tell duplicates and returning keys apart.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Set, Tuple, Union

from ...core.specs import is_dotted, key_digest, reserved_ext, split_name
from ..findings import FindingLog


class KeyTracker:
    def __init__(self, rekey: str, log: FindingLog):
        self.rekey = rekey
        self.log = log
        # key digest -> extensions seen: every key of a shard is remembered, so by a bounded
        # stand-in, not a long name (50,000 names of 4,000 characters held 450 MB)
        self.seen: Dict[Union[str, bytes], Set[str]] = {}
        self.last_key: Optional[str] = None
        self.first: Optional[Tuple[str, str]] = None  # (member, key) of the first keyed member
        self.last: Optional[Tuple[str, str]] = None
        self._names: Dict[Tuple[str, str], str] = {}  # (key, ext) -> name, only where the case differs
        self.returns: List[Tuple[str, str]] = []  # (member, key) of members whose key came back

    def exts_of(self, key: str) -> Set[str]:
        """The extensions seen so far under `key` (empty when it was never seen)."""
        return self.seen.get(key_digest(key), set())

    def member(self, name: str) -> Tuple[Optional[str], Optional[str]]:
        """(key, lower-cased extension), or (None, None) for a member webdataset ignores."""
        key, ext = split_name(name, self.rekey)
        log = self.log
        if key is None:
            base = name.rsplit("/", 1)[-1]
            if base.startswith("."):
                log.add("dotfile", name, "", f"hidden file {base!r} is not part of any sample")
            else:
                log.add("no_extension", name, name, f"{base!r} has no extension, so it is not part of any sample")
            return None, None
        lext = ext.lower()
        reserved = reserved_ext(lext)
        if reserved:
            log.add("reserved_extension", name, key, reserved)
            return None, None
        if lext != ext:
            self._names[(key, lext)] = name
            log.add("mixed_case_extension", name, key,
                    f"extension '.{ext}' is not lower case: webdataset and wdsfilter read it as '{lext}', but HF "
                    f"datasets keeps '{ext}' (not decoded) and DALI matches it only with case_sensitive_extensions=False")
        if self.rekey == "first-dot" and is_dotted(ext):
            intended = name.rsplit(".", 1)[0]
            log.add("dotted_basename", name, intended,
                    f"webdataset splits at the first dot: key {key!r}, extension {ext!r}, so every "
                    f"'{key}.*' file lands in one sample; --rekey last-dot gives key {intended!r}")
        digest = key_digest(key)
        exts = self.seen.get(digest)
        if exts is None:
            self.seen[digest] = {lext}
        elif lext in exts:
            log.add("duplicate_key", name, key, f"member {name!r} appears again in this shard; the first one is used")
        else:
            if key != self.last_key:
                self.returns.append((name, key))  # reported by finish(), unless the key is scattered
            exts.add(lext)
        self.last_key = key
        if self.first is None:
            self.first = (name, key)
        self.last = (name, key)
        return key, lext

    def finish(self, scattered) -> None:
        """At the end of the shard: a key that came back is a nonadjacent_key warning when the
        stages' window still puts it together; `scattered` keys (fragments) have their own error."""
        for name, key in self.returns:
            if key not in scattered:
                self.log.add("nonadjacent_key", name, key,
                             f"key {key!r} comes back after other keys; plain webdataset makes a half-sample of it "
                             f"(wdsfilter's stages merge it)")
        self.returns = []

    def name(self, key: str, ext: str) -> str:
        """The member name as written in the tar for a sample's (key, lower-cased extension)."""
        return self._names.get((key, ext)) or f"{key}.{ext}"
