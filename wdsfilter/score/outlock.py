"""Lock files. One scoring run per output folder (and one `filter --write-shards` run per OUT): an exclusive lock on `<out>/.lock`, held for
the whole run; and `file_lock`, which makes processes that share a folder take turns (a model
download into one folder).

The lock is `fcntl.flock` on an open file: the kernel drops it when the process ends in any way
(SIGKILL and out-of-memory kills included), so a lock left by a killed run is no lock at all and
the next run takes it over without a stale-PID guess. Forked children (decode workers) let go of
their copy of the descriptor at once, so the lock ends with the run's own process. The file itself stays; it records who holds
the lock (pid, host, start time) for the message a second run prints. flock works on local
filesystems and on NFS (Linux emulates it with POSIX locks there); a Ray run holds it on the driver.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import time
from contextlib import contextmanager
from typing import Iterator, Optional

from ..errors import ConfigError
from ..remote import LockLostError

LOCK_NAME = ".lock"
log = logging.getLogger("wdsfilter")


# The descriptors of the output locks this process holds. A forked child (a DataLoader decode
# worker) shares the locked open file, and flock holds until every descriptor of it is closed:
# when a run was killed with kill -9, its orphaned decode workers kept the lock until they noticed
# (seconds, or as long as a decode takes), and a --resume at once was refused, naming the dead pid.
_HELD = set()


def _let_go_in_child() -> None:
    """After a fork, in the child: point the held locks' descriptors at /dev/null. dup2 closes
    the child's reference to the locked file without unlocking it (no LOCK_UN) for the run, and
    the file object the child inherited closes /dev/null if it is ever closed there."""
    for fd in list(_HELD):
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, fd)
        os.close(null)
    _HELD.clear()


os.register_at_fork(after_in_child=_let_go_in_child)


class OutputLockedError(ConfigError):
    """Another live run holds the lock on this output folder (a usage error: exit code 2)."""


class OutputLock:
    def __init__(self, out: str, command: str = "score", option: str = "--out"):
        self.path = os.path.join(out, LOCK_NAME)
        self.command, self.option = command, option  # who takes it, for the message a second run prints
        self._file = None  # a file object, so a lock dropped without release() is closed by the GC

    def acquire(self) -> "OutputLock":
        import fcntl  # POSIX only, like the rest of the process model (spawned model workers, pipes)
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        f = open(self.path, "a+b")
        fd = f.fileno()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            f.close()
            raise OutputLockedError(
                f"{os.path.dirname(self.path)} is in use by another wdsfilter {self.command} run{holder}; wait for "
                f"it to finish or stop it, or use another {self.option} (a run that was killed holds no lock)") from None
        except BaseException:
            f.close()
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                  "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}).encode(), 0)
        self._file = f
        _HELD.add(fd)
        return self

    def release(self) -> None:
        if self._file is not None:
            _HELD.discard(self._file.fileno())
            self._file.close()  # closing the descriptor drops the flock
            self._file = None

    def __enter__(self) -> "OutputLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return f" (pid {info['pid']} on {info['host']}, started {info['started']})"
    except (OSError, ValueError, KeyError, TypeError):
        return ""


@contextmanager
def file_lock(path: str) -> Iterator[None]:
    """Hold an exclusive flock on `path` (created if missing), waiting for any other holder."""
    import fcntl
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)  # released when the file closes, or its process dies
        yield


# -- a run folder in an object store ------------------------------------------------------------
REMOTE_LOCK_NAME = ".lock.json"
HEARTBEAT_SECONDS = 30.0  # the owner rewrites its lock object this often
STALE_SECONDS = 120.0  # a lock whose heartbeat is older than this is taken over


class RemoteOutputLock:
    """One run per remote output folder: a lock object `<out>/.lock.json` (owner: host, pid, run
    id, start time; `heartbeat`: the time the owner last rewrote it, every HEARTBEAT_SECONDS).
    An object store has no lock that ends with its process, so:

    * taken with a conditional create (S3 `If-None-Match: *`): of two runs, one wins;
    * held: another run refuses the folder while the heartbeat is younger than STALE_SECONDS and
      its owner is not a process known dead (same host, no such pid: a run killed with SIGKILL is
      taken over at once, as a local flock would be);
    * taken over when stale: rewritten conditional on the stale object's ETag (`If-Match`), so of
      two runs taking over, one wins; the other refuses;
    * released: deleted, if it is still this run's.
    """

    def __init__(self, url: str, storage_options=None, command: str = "score", option: str = "--out",
                 stale_seconds: Optional[float] = None):
        from ..remote import filesystem
        self.url = url.rstrip("/") + "/" + REMOTE_LOCK_NAME
        self.fs, self.path = filesystem(self.url, storage_options)
        self.gcs = self.url.split("://", 1)[0] in ("gs", "gcs")  # its conditions are generations, not ETags
        self.storage_options = storage_options
        self.command, self.option = command, option
        self.stale_seconds = STALE_SECONDS if stale_seconds is None else stale_seconds
        self.info = {"host": socket.gethostname(), "pidns": _pid_namespace(), "pid": os.getpid(),
                     "run": os.urandom(8).hex(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": command}
        self.etag: Optional[str] = None
        self.last_beat = 0.0
        self.took_over: Optional[dict] = None  # the stale lock this run replaced
        self.lost: Optional[str] = None  # why the lock is another run's now (heartbeat)

    def _body(self) -> bytes:
        return json.dumps({**self.info, "heartbeat": time.time()}).encode()

    def _put(self, **conditions) -> None:
        if self.gcs:  # GCS: the same conditions as generations (0: must not exist)
            self.etag = _gcs_put(self.fs, self.path, self._body(),
                                 "0" if conditions.get("mode") == "create" else conditions.get("IfMatch"))
        else:
            out = self.fs.pipe_file(self.path, self._body(), **conditions)
            self.etag = (out or {}).get("ETag") if isinstance(out, dict) else None
        self.last_beat = time.monotonic()

    def acquire(self) -> "RemoteOutputLock":
        from ..remote import redact_url
        folder = redact_url(self.url.rsplit("/", 1)[0])
        try:
            self._put(mode="create")
            return self
        except FileExistsError:
            pass
        except PermissionError as e:  # the run's first write: it probes the folder before any work
            raise ConfigError(f"{self.option} {folder}: access denied for writing ({_short(e)}); credentials: "
                              f"{_credentials(self)}") from None
        except OSError as e:
            raise ConfigError(f"{self.option} {folder}: the lock object cannot be written ({_short(e)})") from None
        except Exception as e:  # noqa: BLE001 - botocore's errors are no OSError
            from ..remote import missing_credentials, no_credentials
            if no_credentials(e):
                raise ConfigError(f"{self.option} {folder}: cannot be written: "
                                  f"{missing_credentials(self.url, self.storage_options)}") from None
            raise
        holder, etag = self._holder()
        why = _stale(holder, self.stale_seconds)
        if holder is not None and why is None:
            raise OutputLockedError(
                f"{folder} is in use by another wdsfilter {holder.get('command', self.command)} run (pid "
                f"{holder.get('pid')} on {holder.get('host')}, started {holder.get('started')}, heartbeat "
                f"{time.time() - float(holder.get('heartbeat', 0)):.0f}s ago); wait for it to finish or stop it, or "
                f"use another {self.option} (a lock whose heartbeat is older than {self.stale_seconds:g}s is taken over)")
        try:  # stale (or unreadable): replace exactly that object, or lose to the run that did
            self._put(**({"IfMatch": etag} if etag else {"mode": "create"}))
        except OSError as e:
            raise OutputLockedError(f"{folder}: another run took over its stale lock first ({_short(e)}); "
                                    f"use another {self.option} or try again") from None
        self.took_over = holder or {}
        log.warning(f"{folder}: took over the lock of a run that is gone ({why or 'unreadable lock'}: pid "
                    f"{(holder or {}).get('pid')} on {(holder or {}).get('host')})")
        return self

    def _holder(self):
        """(the lock's content, its ETag): the ETag read first, so a lock replaced in between is
        one whose conditional takeover fails, never one taken over unseen."""
        try:
            self.fs.invalidate_cache(self.path)  # a listing cached by this process is not the lock now
            etag = self.fs.info(self.path).get("generation" if self.gcs else "ETag")
            return json.loads(self.fs.cat_file(self.path)), etag
        except FileNotFoundError:  # released as we looked
            return None, None
        except (OSError, ValueError):
            return None, None

    def heartbeat(self) -> None:
        """Rewrite the lock with the time now (at most every HEARTBEAT_SECONDS), conditional on
        it being this run's. A lock another run took over (this one was stalled past STALE_SECONDS)
        is LockLostError: from then on the folder is the other run's, and this one writes no more
        into it. A store that gives no ETag gets the lock read back first instead."""
        if self.lost or self.etag is None and self.last_beat == 0.0 \
                or time.monotonic() - self.last_beat < HEARTBEAT_SECONDS:
            return
        try:
            if not self.etag:
                self._check_still_ours()
            self._put(**({"IfMatch": self.etag} if self.etag else {}))
        except LockLostError:
            raise
        except OSError as e:
            self._check_still_ours()
            log.warning(f"{self.url}: the lock could not be renewed ({_short(e)}); another run may take it over")
            self.last_beat = time.monotonic()

    def _check_still_ours(self) -> None:
        holder, _ = self._holder()
        if holder is not None and holder.get("run") != self.info["run"]:
            from ..remote import redact_url
            self.lost = (f"{redact_url(self.url)}: another wdsfilter {holder.get('command', 'run')} (pid "
                         f"{holder.get('pid')} on {holder.get('host')}) took over this run's lock while it was "
                         f"stalled; nothing more was uploaded")
            raise LockLostError(self.lost)

    def release(self) -> None:
        holder, _ = self._holder()
        if holder is not None and holder.get("run") == self.info["run"]:
            try:
                self.fs.rm_file(self.path)
            except OSError:
                pass  # left behind: stale in STALE_SECONDS, or at once for a run on this host
        self.etag, self.last_beat = None, 0.0


def _gcs_put(fs, path: str, data: bytes, generation: Optional[str]) -> Optional[str]:
    """One GCS object written in one request, conditional on its generation (`ifGenerationMatch`:
    "0" = must not exist, else exactly that version; None = unconditional): GCS's form of S3's
    If-None-Match / If-Match. gcsfs offers only the "0" case (mode="create"). A failed condition is
    HTTP 412, which gcsfs raises as FileExistsError. Returns the new generation."""
    bucket, key, _ = fs.split_path(path)
    meta = json.dumps({"name": key})
    body = (f"--==0==\nContent-Type: application/json; charset=UTF-8\n\n{meta}\n--==0==\n"
            f"Content-Type: application/json\n\n").encode() + data + b"\n--==0==--"
    kw = {"ifGenerationMatch": str(generation)} if generation is not None else {}
    out = fs.call("POST", f"{fs._location}/upload/storage/v1/b/{bucket}/o", uploadType="multipart",
                  headers={"Content-Type": 'multipart/related; boundary="==0=="'}, data=body, json_out=True, **kw)
    fs.invalidate_cache(path)
    return str(out.get("generation")) if out.get("generation") is not None else None


# What --resume reads to decide which shards are done (run.json, the shard list, the recipe, the
# markers, the per-shard failure ledgers their markers vouch for and the end merges) and the marks
# of an earlier dedup (the report reads them): the rest of a bucket's run folder stays there.
STATE_FILES = ("run.json", "shards.json", "run.yaml")
STATE_FOLDERS = ("done", "failures", "dedup")


def _not_state(rel: str) -> bool:
    return rel not in STATE_FILES and rel.split("/", 1)[0] not in STATE_FOLDERS


def _not_sidecar(rel: str) -> bool:
    """A --write-shards folder's filtered shards stay in the bucket; its JSON sidecars (sizes.json,
    which a rescored shard's entry is merged into, per-shard stats) come down."""
    return not rel.endswith(".json")


def _stale(holder: Optional[dict], stale_seconds: float) -> Optional[str]:
    """Why a lock's owner is gone, or None while it lives."""
    if holder is None:
        return "unreadable lock"
    try:
        age = time.time() - float(holder.get("heartbeat", 0))
    except (TypeError, ValueError):
        return "unreadable lock"
    if age > stale_seconds:
        return f"no heartbeat for {age:.0f}s"
    # its pid means something here only on this host and in this pid namespace (two containers may
    # share a host name, never a pid namespace)
    if holder.get("host") == socket.gethostname() and holder.get("pidns") == _pid_namespace() \
            and isinstance(holder.get("pid"), int):
        try:
            os.kill(holder["pid"], 0)
        except ProcessLookupError:
            return "its process is dead"
        except PermissionError:
            pass
    return None


def _pid_namespace() -> Optional[str]:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def _short(e: BaseException) -> str:
    return " ".join(str(e).split())[:200] or type(e).__name__


def _credentials(lock: "RemoteOutputLock") -> str:
    from ..remote import credential_source
    return credential_source(lock.url, lock.storage_options)


class RemoteRunFolder:
    """`score --out s3://...`: the lock object, then the remote folder pulled into a local staging
    folder (where the run writes, as in any folder: remote_out.py says why), mirrored back to the
    bucket while the run goes (markers last) and at its end; the lock's heartbeat rides on the
    mirror's rounds. The staging folder is removed once the bucket holds all of it."""

    SHARDS = ".write-shards"  # staging of a --write-shards URL, inside the run's own (never uploaded with it)

    def __init__(self, url: str, storage_options=None, lock: bool = True, interval: Optional[float] = None,
                 write_shards: Optional[str] = None, pull_shards: bool = False, command: str = "score",
                 option: str = "--out", lazy: bool = False):
        from ..remote import refuse_hub_run_folder
        from ..remote_out import RemoteFolder
        refuse_hub_run_folder(url)
        self.url = url.rstrip("/")
        self.mirror, self.synced, self.folder, self.started, self.shards = None, False, None, False, None
        self.lock = RemoteOutputLock(self.url, storage_options, command, option).acquire() if lock else None
        try:
            self.folder = RemoteFolder(self.url, storage_options)
            self.folder.exclude = (self.SHARDS,)
            # lazy (--resume): only what decides which shards are done comes down; finished shards'
            # score files, embeddings and filtered shards stay in the bucket (their sizes known)
            self.folder.pull(keep_in_bucket=_not_state if lazy else None)
            if write_shards:  # its files are uploaded before the markers that vouch for them
                self.shards = RemoteFolder(write_shards, storage_options, os.path.join(self.folder.local, self.SHARDS))
                os.makedirs(self.shards.local, exist_ok=True)
                if pull_shards:  # --resume: a shard is done only where its filtered shard is whole
                    self.shards.pull(keep_in_bucket=_not_sidecar if lazy else None)
                self.folder.before_markers = self.shards.sync
        except BaseException:
            self.release()
            raise
        # seconds between two uploads of what changed (WDSFILTER_SYNC_SECONDS, default 5)
        self.interval = interval if interval is not None else float(os.environ.get("WDSFILTER_SYNC_SECONDS", 5))

    @property
    def local(self) -> str:
        return self.folder.local

    def sizes(self):
        """A staging path's size, or that of the bucket object it stands for (the run state checks
        markers' files through it: a finished shard's files need not come down). Picklable."""
        from ..remote_out import StagedSizes
        return StagedSizes([f for f in (self.folder, self.shards) if f is not None])

    def fetch(self, paths) -> int:
        """The held objects among staging `paths`, downloaded now (the end of a run reads every
        score file): how many."""
        return self.folder.fetch(paths)

    def start(self) -> None:
        """Mirror the staging folder from now on (after run.json and shards.json are written)."""
        from ..remote_out import Mirror
        if self.lock is not None and self.mirror is None:
            self.mirror = Mirror(self.folder, self.interval, tick=self.lock.heartbeat).start()
            self.started = True

    def public(self, path):
        """A staging path as the run shows it: its URL in the bucket."""
        from ..remote_out import staged_paths
        folders = [f for f in (self.shards, self.folder) if f is not None]  # the inner staging first
        return staged_paths(path, folders) if isinstance(path, str) else path

    def publish_text(self, path: Optional[str]) -> None:
        """A text file of the staging folder (the report) rewritten to name the bucket, not staging."""
        if path and os.path.exists(path):
            from ..atomic import atomic_path
            with open(path, encoding="utf-8", errors="surrogateescape") as f:
                text = f.read()
            with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", errors="surrogateescape") as f:
                f.write(self.public(text))

    def sync(self) -> None:
        """Everything the run wrote, uploaded now (RemoteOutputError when an upload fails;
        LockLostError, uploading nothing, when another run took the folder over)."""
        if self.lock is not None:
            if self.lock.lost:
                raise LockLostError(self.lock.lost)
            self.folder.sync()
            self.synced = True

    def release(self) -> None:
        """Stop mirroring (a last sync, whatever happened), let go of the lock; the staging folder
        is removed only when the bucket holds it all, else kept and named."""
        try:
            if self.mirror is not None:
                self.mirror.stop()
                self.synced = True
        except OSError as e:
            self.synced = False
            log.error(f"{self.url}: {e}; the run's files are kept in {self.local} (copy them, or run again with "
                      f"--resume)")
        finally:
            self.mirror = None
            if self.lock is not None:
                self.lock.release()
                self.lock = None
            # never started: staging holds only what was pulled (a refused or dry run)
            if self.folder is not None and (self.synced or not self.started):
                self.folder.remove_staging()
