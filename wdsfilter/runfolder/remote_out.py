"""A folder of outputs in an object store (`score --out s3://bucket/run/`), written through a local
staging folder that mirrors it.

Why staging: a run folder is many files, rewritten (shards.json, the failure ledger) and read back
(--resume, the summary reads every score file) as the run goes; every module that writes one
writes a local file whole (atomic.py), and the one rule of the folder (runfolder/) stays one rule.
This module keeps the bucket a faithful copy of that folder:

* `pull()`: before the run, every object of the remote folder is downloaded into staging, so
  --resume, --overwrite and "this folder already holds a run" are decided on the same files as
  for a local folder;
* `sync()`: uploads every file that is new or changed since its last upload, each object whole
  or not at all (one PUT, or a multipart upload completed at its end and aborted on failure;
  never a streaming open, which commits what it holds when an exception leaves its `with`
  block), a shard's `_stats.json` and `sizes.json` after the shards they count,
  and completion markers (`done/`) LAST, and only markers that were on
  disk before the files they vouch for were uploaded: a marker in the bucket always follows its
  outputs there. Files removed in staging (--overwrite) are deleted in the bucket, markers first.

Every upload and delete is fenced twice (docs/remote.md, "How writes are fenced"): `fence()` (the
run's lease, runfolder/lease.py) runs before it, and it is conditional on the object being what
this writer last saw there (conditional.py: created only where nothing is, replaced or deleted
only in the version pulled or last uploaded), so a run that lost its folder while it was stalled
neither overwrites nor deletes the new owner's objects.

A `Mirror` runs sync() in a thread every few seconds (so a run killed with SIGKILL leaves its
finished shards in the bucket), and once more at the end; temporaries are never uploaded.
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading
from typing import Callable, Dict, List, Optional, Tuple

from ..storage.atomic import is_temporary
from ..storage.conditional import PART_BYTES, Conflict, delete, holds_file, put_file, version_of
from ..storage.remote import (RemoteOutputError, credential_source, filesystem, redact_url, scheme_of, write_failure,
                              refuse_hub_run_folder)
from ..storage.remote_errors import describe
from .lease import GUARD_NAME, LEASE_NAME, LeaseLostError
from .names import CLAIMS, DONE, FINISH, WORKERS
from ..core.scratch import KEPT, OWNER, Scratch
from ..storage.shardstats import vouches_for_shards
from ..core.errors import ConfigError

log = logging.getLogger("wdsfilter")
MARKERS = DONE  # the folder whose files are uploaded last
# a folder's lease and its guard, the staging copy's own marks, a joined run's end claim: never mirrored
SKIP = (GUARD_NAME, LEASE_NAME, OWNER, KEPT, FINISH)
RECORDS = (CLAIMS, WORKERS)  # a joined run's records (runfolder/claims.py): written in place, never mirrored


def _mirrored(rel: str) -> bool:
    """An object of the remote folder that staging copies (not a lease, a record or a temporary)."""
    name = os.path.basename(rel)
    return bool(rel) and name not in SKIP and not is_temporary(name) and ".." not in rel.split("/") \
        and rel.split("/", 1)[0] not in RECORDS


class RemoteFolder:
    """One remote folder and its local staging copy."""

    def __init__(self, url: str, storage_options=None, staging: Optional[str] = None):
        self.url = url.rstrip("/")
        self.storage_options = storage_options
        self.fs, path = filesystem(self.url, storage_options)
        self.path = path.rstrip("/")
        self.scratch = None
        if staging is None:  # a working folder of this process (scratch.py: swept once it is gone)
            self.scratch = Scratch("out")
            staging = self.scratch.path
        self.local = staging
        self.sent: Dict[str, Tuple[int, int]] = {}  # relative path -> (size, mtime_ns) in the bucket
        # relative path -> the object's version as this writer last saw it (pulled, listed, or its
        # own upload): the condition of its next upload or delete. Not here: it must not exist.
        self.versions: Dict[str, str] = {}
        self.fence: Callable[[], None] = lambda: None  # raises when this writer no longer owns the folder
        # A multipart upload's part size: s3fs reads a file below twice its part size (50 MiB) whole
        # into memory for one PUT; 16 MiB parts bound that to 32 MiB (None: the filesystem's own)
        self.part_bytes: Optional[int] = PART_BYTES if scheme_of(self.url) in ("s3", "gs", "gcs") else None
        self.exclude: Tuple[str, ...] = ()  # top-level names of staging that are not this folder's
        self.before_markers: Optional[Callable[[], object]] = None  # another folder synced before the markers
        # a joined run's worker (claims.py): an upload refused because another writer's object is
        # there replaces it, after the fence (the worker still holds its claims, so the object is a
        # stray of a worker that lost the shard); never the case of a folder with one owner
        self.replace_strays = False
        self._syncing = threading.Lock()  # the mirror's thread and the run's last sync take turns
        # relative path -> size: objects of the bucket's folder not copied into staging (pull's
        # keep_in_bucket). Never deleted by a sync: they are not staging's to remove.
        self.held: Dict[str, int] = {}

    def _rel(self, path: str) -> Optional[str]:
        rel = os.path.relpath(path, self.local)
        return None if rel.startswith("..") else rel.replace(os.sep, "/")

    def fetch(self, paths) -> int:
        """Bring the held objects among staging `paths` into staging (downloaded to a temporary,
        renamed), recorded as the bucket's: they are read, never uploaded again. Returns how many."""
        n = 0
        for path in paths:
            rel = self._rel(path)
            if rel not in self.held or os.path.exists(path):
                continue
            _download(self, rel, path)
            st = os.stat(path)
            self.sent[rel] = (st.st_size, st.st_mtime_ns)
            self.held.pop(rel, None)
            n += 1
        return n

    def remote(self, rel: str) -> str:
        return f"{self.path}/{rel}"

    def adopt(self, rel: str, version: Optional[str]) -> None:
        """A staging file written to the bucket by other means (a joined run's run.json, created
        in place): recorded as uploaded, in that version."""
        st = os.stat(os.path.join(self.local, *rel.split("/")))
        self.sent[rel] = (st.st_size, st.st_mtime_ns)
        if version is not None:
            self.versions[rel] = version

    def list_now(self) -> Dict[str, dict]:
        """Every object under the folder as the bucket holds it now (not a listing fsspec cached
        earlier), by key with its details; {} when there is none. Forbidden: RemoteOutputError."""
        try:
            self.fs.invalidate_cache(self.path)
            return self.fs.find(self.path + "/", detail=True)
        except FileNotFoundError:
            return {}
        except PermissionError as e:
            raise RemoteOutputError(f"{self.shown()}: listing is forbidden ({describe(e)}); credentials: "
                                    f"{credential_source(self.url, self.storage_options)}") from None

    def refresh(self, fetch: Tuple[str, ...] = ()) -> int:
        """What the bucket holds now, after other writers (a joined run's workers): every object
        not in staging is held (its size and version known), those under the `fetch` folders
        are brought into staging. Returns how many were downloaded."""
        found = self.list_now()
        paths = []
        for key, info in found.items():
            rel = key[len(self.path) + 1:]
            if not _mirrored(rel) or rel.split("/", 1)[0] in self.exclude:
                continue
            version = version_of(info)
            local = os.path.join(self.local, *rel.split("/"))
            if rel in self.sent and self.versions.get(rel) == version:
                continue  # staging's own, as uploaded
            try:
                st = os.stat(local)
                if self.sent.get(rel) != (st.st_size, st.st_mtime_ns):
                    continue  # written here since its last upload: the next sync sends it (replace_strays)
            except FileNotFoundError:
                pass
            if version is not None:
                self.versions[rel] = version
            self.sent.pop(rel, None)
            self.held[rel] = int(info.get("size") or 0)
            with contextlib.suppress(FileNotFoundError):
                os.remove(local)  # an older copy: the bucket's is another writer's now
            if rel.split("/", 1)[0] in fetch:
                paths.append(local)
        return self.fetch(paths)

    def shown(self, rel: str = "") -> str:
        return redact_url(f"{self.url}/{rel}" if rel else self.url)

    # -- bucket -> staging ------------------------------------------------------------------------
    def pull(self, keep_in_bucket: Optional[Callable[[str], bool]] = None) -> int:
        """Download the remote folder into staging; returns how many files. keep_in_bucket(rel):
        the objects left where they are (their sizes known, `held`: --resume needs no finished
        shard's score file or filtered shard, only its marker; `fetch` brings one when it is read)."""
        found = self.list_now()
        n = 0
        for key in sorted(found):
            rel = key[len(self.path) + 1:]
            if not _mirrored(rel):
                continue
            version = version_of(found[key])
            if version is not None:
                self.versions[rel] = version
            if keep_in_bucket is not None and keep_in_bucket(rel):
                self.held[rel] = int(found[key].get("size") or 0)
                continue
            local = os.path.join(self.local, *rel.split("/"))
            _download(self, rel, local)
            st = os.stat(local)
            self.sent[rel] = (st.st_size, st.st_mtime_ns)
            n += 1
        return n

    # -- staging -> bucket ------------------------------------------------------------------------
    def _local_files(self, under: str = "") -> Dict[str, Tuple[int, int]]:
        files = {}
        top = os.path.join(self.local, under) if under else self.local
        for root, dirs, names in os.walk(top):
            dirs[:] = sorted(d for d in dirs if root != self.local or d not in self.exclude)
            for name in sorted(names):
                if name in SKIP or is_temporary(name) or name.endswith(".part"):
                    continue
                path = os.path.join(root, name)
                try:
                    st = os.stat(path)
                except FileNotFoundError:  # replaced or removed as we looked
                    continue
                files[os.path.relpath(path, self.local).replace(os.sep, "/")] = (st.st_size, st.st_mtime_ns)
        return files

    def upload(self, rel: str, stat: Tuple[int, int]) -> None:
        """One file, whole or not at all (a completed PUT or multipart upload), fenced: after the
        owner's check, and only over the version this writer last saw (conditional.py)."""
        local = os.path.join(self.local, *rel.split("/"))
        self.fence()
        try:
            version = put_file(self.fs, self.remote(rel), local, self.versions.get(rel), self.part_bytes or PART_BYTES)
        except FileNotFoundError:
            return  # removed in staging since it was listed: the next sync deletes it
        except Conflict:
            version = self._conflict(rel, local)
        except Exception as e:  # noqa: BLE001 - the store's error, named without options
            raise RemoteOutputError(f"uploading {self.shown(rel)} failed: "
                                    f"{write_failure(e, self.url, self.storage_options)}") from None
        self.versions[rel] = version
        self.sent[rel] = stat
        self.held.pop(rel, None)  # replaced by staging's

    def _conflict(self, rel: str, local: str) -> str:
        """An upload refused by its condition: the object is another writer's, unless it holds
        this file's bytes (an upload of this writer whose answer was lost, then retried)."""
        self.fence()  # lost: the new owner's object, named by the lease
        version = holds_file(self.fs, self.remote(rel), local, self.part_bytes or PART_BYTES)
        for _ in range(3 if version is None and self.replace_strays else 0):
            try:  # a stray of a worker that lost this shard: replaced, on the version seen now
                self.fs.invalidate_cache(self.remote(rel))
                seen = version_of(self.fs.info(self.remote(rel)))
            except FileNotFoundError:
                seen = None
            self.fence()
            try:
                return put_file(self.fs, self.remote(rel), local, seen, self.part_bytes or PART_BYTES)
            except Conflict:
                continue
        if version is None:
            raise RemoteOutputError(f"uploading {self.shown(rel)} was refused: another writer created, replaced or "
                                    f"deleted it while this run owned the folder; nothing of it was overwritten")
        return version

    def delete(self, rel: str) -> None:
        """One object deleted, fenced as an upload: only the version this writer last saw."""
        self.fence()
        try:
            if rel in self.versions:
                delete(self.fs, self.remote(rel), self.versions[rel])
            else:
                self.fs.rm_file(self.remote(rel))
        except FileNotFoundError:
            pass
        except Conflict:
            self.fence()
            raise RemoteOutputError(f"deleting {self.shown(rel)} was refused: another writer replaced it while this "
                                    f"run owned the folder") from None
        except Exception as e:  # noqa: BLE001
            raise RemoteOutputError(f"deleting {self.shown(rel)} failed: {describe(e)}") from None
        self.versions.pop(rel, None)
        self.sent.pop(rel, None)

    def sync(self, last: str = MARKERS) -> int:
        """Upload what changed: deletions first (files under `last` before the others), then every
        other file, then the files under `last` as they were listed BEFORE the others were."""
        with self._syncing:
            return self._sync(last)

    def _sync(self, last: str) -> int:
        ahead = self._local_files(last) if last else {}  # relative to the folder: done/<name>.json
        if self.before_markers is not None:  # the filtered shards the markers vouch for
            self.before_markers()
        current = self._local_files()
        gone = [r for r in self.sent if r not in current]
        for rel in sorted(gone, key=lambda r: not r.startswith(last + "/")):
            self.delete(rel)
        n = 0
        # the shards before the _stats.json and sizes.json that count them (a stable sort: os.walk's
        # order otherwise), whatever their names sort as
        for rel, stat in sorted(current.items(), key=lambda item: _counts_others(item[0])):
            if (not last or not rel.startswith(last + "/")) and self.sent.get(rel) != stat:
                self.upload(rel, stat)
                n += 1
        for rel, stat in ahead.items():
            if self.sent.get(rel) != stat:
                self.upload(rel, stat)
                n += 1
        return n

    def remove_staging(self) -> None:
        if self.scratch is not None:
            self.scratch.remove()
        else:
            import shutil
            shutil.rmtree(self.local, ignore_errors=True)

    def keep_staging(self) -> None:
        """Kept for the user (named in the log): never swept by a later run."""
        if self.scratch is not None:
            self.scratch.keep()


def _counts_others(rel: str) -> bool:
    """A file that vouches for others in its folder: a shard's `_stats.json`, `sizes.json`."""
    return vouches_for_shards(rel.rsplit("/", 1)[-1])


class StagedSizes:
    """A staging path's size: the file's, else that of the bucket object it stands for (an object
    a pull left in the bucket: RemoteFolder.held). A file in staging comes first, so a snapshot of
    the held sizes stays right. Picklable: the run state that checks markers with it goes to Ray
    tasks."""

    def __init__(self, folders: List[RemoteFolder]):
        self.held = {os.path.join(f.local, *rel.split("/")): size for f in folders for rel, size in f.held.items()}

    def __call__(self, path: str) -> int:
        try:
            return os.path.getsize(path)
        except FileNotFoundError:
            if path in self.held:
                return self.held[path]
            raise


class Mirror:
    """sync() of a RemoteFolder in a thread every `interval` seconds while a run writes its
    staging folder; stop() syncs a last time. A lost lease (its fence raises) ends the rounds."""

    def __init__(self, folder: RemoteFolder, interval: float = 5.0):
        self.folder, self.interval = folder, interval
        self.error: Optional[BaseException] = None
        self.lost: Optional[BaseException] = None
        self._stop = threading.Event()
        self._wake = threading.Event()  # a round now, not at the interval (a joined run's shard is done)
        self._thread = threading.Thread(target=self._loop, name="wdsfilter-remote-out", daemon=True)

    def start(self) -> "Mirror":
        self._thread.start()
        return self

    def wake(self) -> None:
        """Sync now (in the thread): a joined run's worker has finished a shard, which the other
        workers see done only once its marker is in the bucket."""
        self._wake.set()

    def _loop(self) -> None:
        while True:
            self._wake.wait(self.interval)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.folder.sync()
                self.error = None
            except LeaseLostError as e:  # the folder is another run's now: not one more upload
                self.lost = e  # the run says it, once, as its error
                return
            except Exception as e:  # noqa: BLE001 - tried again next round; stop() raises the last one
                self.error = e
                log.warning(f"{self.folder.shown()}: {e} (tried again in {self.interval:g}s)")

    def stop(self) -> None:
        """Stop the thread, then the last sync (raises RemoteOutputError when it fails, and
        LeaseLostError, syncing nothing, when the lease was lost)."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()
        if self.lost is not None:
            raise self.lost
        self.folder.sync()


def _download(folder: RemoteFolder, rel: str, path: str) -> None:
    """The object `rel` of `folder` written whole at `path` (a temporary, renamed) or not at all."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".part"
    try:
        folder.fs.get_file(folder.remote(rel), tmp)
        os.replace(tmp, path)
    except OSError as e:
        raise RemoteOutputError(f"reading {folder.shown(rel)} failed: {describe(e)}") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)


def staged_paths(text: str, folders: List[RemoteFolder]) -> str:
    """`text` with each staging path replaced by its remote URL (what a summary names)."""
    for f in folders:
        text = text.replace(f.local, f.url)
    return text


def cache_folder(url: str) -> str:
    """Where a remote run folder is copied to be read: $WDSFILTER_CACHE, else
    $XDG_CACHE_HOME/wdsfilter (~/.cache/wdsfilter), /remote-runs/<hash of the URL>."""
    import hashlib
    root = os.environ.get("WDSFILTER_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "wdsfilter")
    return os.path.join(root, "remote-runs", hashlib.sha1(url.rstrip("/").encode()).hexdigest()[:16])


def pulled(url: str, storage_options=None) -> str:
    """A local copy of the remote run folder `url` (`wdsfilter filter s3://...`, the loader's
    `scores=s3://...`), brought up to date: objects whose size or ETag changed are downloaded
    again, files no longer in the bucket removed. Processes that share the copy take turns (a
    flock). Returns the local folder, which runfolder's one reader then reads."""
    import fcntl
    import json
    refuse_hub_run_folder(url)
    folder = cache_folder(url)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, ".lock"), "a+b") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        remote = RemoteFolder(url, storage_options, staging=folder)
        listed = remote.list_now()
        if not listed:
            raise ConfigError(f"score folder {remote.shown()} does not exist (no object under it); pass the --out "
                              f"folder of a `wdsfilter score` run")
        manifest_path = os.path.join(folder, ".manifest.json")
        try:
            with open(manifest_path) as f:
                manifest = json.load(f)
        except (OSError, ValueError):
            manifest = {}
        wanted = {}
        for key, info in listed.items():
            rel = key[len(remote.path) + 1:]
            name = os.path.basename(rel)
            if _mirrored(rel) and not name.startswith(".manifest"):
                wanted[rel] = f"{info.get('size')}:{info.get('ETag') or info.get('etag') or info.get('mtime')}"
        for rel in [r for r in manifest if r not in wanted]:
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(folder, *rel.split("/")))
            manifest.pop(rel)
        for rel, version in sorted(wanted.items()):
            local = os.path.join(folder, *rel.split("/"))
            if manifest.get(rel) == version and os.path.exists(local):
                continue
            _download(remote, rel, local)
            manifest[rel] = version
        with open(manifest_path + ".part", "w") as f:
            json.dump(manifest, f)
        os.replace(manifest_path + ".part", manifest_path)
    return folder

