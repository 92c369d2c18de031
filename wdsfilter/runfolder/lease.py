"""Who may write a folder: a lease, and the fence every write passes.

A lease is one small record, `<folder>/.lock.json`, on a local or shared disk or in a bucket. It
names its holder (a random token, pid, host, start time, command), the time of its last heartbeat
and how long a silent holder keeps it (`stale_seconds`). The same mechanism, at a finer grain, is
a per-shard claim: only the record's name differs (docs/remote.md, "How writes are fenced").

* **Taken atomically.** The record is created only where none exists: S3 `If-None-Match: *`, GCS
  `ifGenerationMatch=0`, a local `link()` (which never replaces a file, on NFS too). A record
  that exists is the holder's: while it lives another run is refused (LeaseHeldError, exit 2).
* **Renewed by a heartbeat.** A thread of the holder rewrites the record every stale/4 seconds,
  conditional on the version it wrote last (S3 `If-Match: <ETag>`, GCS `ifGenerationMatch=<generation>`,
  on disk a compare and rename under a POSIX lock of `<folder>/.lock`).
* **Taken over only when stale.** A record whose heartbeat is older than its holder's
  `stale_seconds`, whose holder process is known dead (this host, this pid namespace, no such
  process, or another one since), or that says it was released, is replaced on the condition that
  it is still the version read: of two runs taking over, one wins.
* **Every write is fenced.** `Lease.check()` runs before each write (atomic.py's guards) and each
  upload (remote_out.py): the holder knows its lease is valid until its last renewal began plus
  stale_seconds less a margin, on this host's clock (CLOCK_BOOTTIME: it runs on while the process
  is stopped or the machine sleeps); past that it renews first, synchronously. A renewal whose
  condition fails means another run took the folder over, or the record was deleted: the lease is
  lost (LeaseLostError, exit 3, naming the run the record now names) and nothing more is written.
  On a local disk the record is also read at each write, by any process (a decode or Ray worker
  has no heartbeat of its own: `Fence`).
* **Released, never deleted.** At the end the record is rewritten as released (on the same
  condition), so a run that comes back after losing its folder still names who took it, and a
  deleted record always means "lost", never "free".

Takers judge a heartbeat's age by their own clock: hosts that share a folder must agree on the
time within the margin (stale_seconds / 5: 24 s at the default 120 s), as NTP keeps them.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Dict, Iterable, Iterator, List, Optional, Tuple

from ..storage import atomic
from ..core.errors import ConfigError, RunError
from .names import GUARD as GUARD_NAME, LEASE as LEASE_NAME, WORKERS  # the record, its guard, the workers' leases
from ..storage.remote import (is_fsspec_url, filesystem, redact_url, credential_source, missing_credentials,
                              no_credentials)
from ..storage.conditional import is_gcs, version_of, Conflict as Refused, put_bytes

STALE_SECONDS = 120.0  # a holder silent this long loses its lease (WDSFILTER_LEASE_SECONDS)
MARGIN = 0.2  # the holder stops writing this share of stale_seconds before others may take over
log = logging.getLogger("wdsfilter")


class LeaseHeldError(ConfigError):
    """Another live run holds the folder (a usage error: exit 2, before any work)."""


class LeaseLostError(RunError):
    """This run's lease was taken over (it was stalled past stale_seconds) or its record deleted:
    the folder is not this run's any more, and it writes nothing more into it (exit 3)."""


def stale_seconds() -> float:
    """How long a silent holder keeps its lease: $WDSFILTER_LEASE_SECONDS, else STALE_SECONDS."""
    value = os.environ.get("WDSFILTER_LEASE_SECONDS")
    try:
        seconds = float(value) if value else STALE_SECONDS
    except ValueError:
        raise ConfigError(f"WDSFILTER_LEASE_SECONDS={value!r} is not a number of seconds") from None
    if not seconds > 0:
        raise ConfigError(f"WDSFILTER_LEASE_SECONDS={value!r} must be above 0")
    return seconds


def _clock() -> float:
    """Seconds on a clock that runs on while this process is stopped and while the host sleeps."""
    return time.clock_gettime(time.CLOCK_BOOTTIME) if hasattr(time, "CLOCK_BOOTTIME") else time.monotonic()


# -- where a record lives ----------------------------------------------------------------------------
class Conflict(OSError):
    """The record is not the version a write was conditional on."""


class _DiskRecord:
    """A record in a local or shared (NFS) folder. Its version is the SHA-1 of its bytes (each
    record holds its own token and time). Created with link() (fails where a file exists);
    replaced under a POSIX lock of the folder's GUARD_NAME (fcntl locks work over NFS, are not
    inherited by forked children, and end with their process), compared there, then renamed."""

    remote = False
    _turns = threading.Lock()  # POSIX locks are per process: this process's threads take turns

    def __init__(self, folder: str, name: str):
        self.folder = folder
        self.path = os.path.join(folder, name)
        self.shown = self.path

    def read(self) -> Tuple[Optional[dict], Optional[str]]:
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None, None
        return _parse(data), hashlib.sha1(data).hexdigest()

    def read_data(self) -> Optional[dict]:
        """The record without its version (None where there is none)."""
        return self.read()[0]

    @contextlib.contextmanager
    def _guard(self, timeout: float = 10.0) -> Iterator[None]:
        import fcntl
        os.makedirs(self.folder, exist_ok=True)
        with self._turns:
            fd = os.open(os.path.join(self.folder, GUARD_NAME), os.O_RDWR | os.O_CREAT, 0o644)
            try:
                deadline = time.monotonic() + timeout
                while True:
                    try:
                        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except OSError:  # held for a moment by another process's compare-and-rename
                        if time.monotonic() > deadline:
                            raise OSError(f"{self.folder}/{GUARD_NAME} stayed locked for {timeout:g}s") from None
                        time.sleep(0.01)
                yield
            finally:
                os.close(fd)  # the lock ends with it

    def create(self, data: bytes) -> str:
        with self._guard():
            os.makedirs(os.path.dirname(self.path), exist_ok=True)  # a claim's record lies deeper (claims/<shard>.json)
            tmp = atomic.temporary_path(self.path)
            try:
                with open(tmp, "wb") as f:
                    f.write(data)
                try:
                    os.link(tmp, self.path)
                except FileExistsError:
                    raise Conflict(f"{self.path} exists") from None
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(tmp)
        return hashlib.sha1(data).hexdigest()

    def replace(self, data: bytes, expect: str) -> str:
        with self._guard():
            _, version = self.read()
            if version != expect:
                raise Conflict(f"{self.path} is not the version read ({'deleted' if version is None else 'replaced'})")
            tmp = atomic.temporary_path(self.path)
            try:
                with open(tmp, "wb") as f:
                    f.write(data)
                os.replace(tmp, self.path)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(tmp)  # a full disk: none left behind
        return hashlib.sha1(data).hexdigest()


class _BucketRecord:
    """A record in a bucket, written with the store's conditions (conditional.py)."""

    remote = True

    def __init__(self, url: str, storage_options=None):
        self.url = url
        self.shown = redact_url(url)
        self.fs, self.path = filesystem(url, storage_options)

    def read(self) -> Tuple[Optional[dict], Optional[str]]:
        """(the record, its version): the version read first, so a record replaced in between is
        one whose conditional replacement fails, never one taken over unseen."""
        try:
            self.fs.invalidate_cache(self.path)
            version = version_of(self.fs.info(self.path))
            return _parse(self._get()), version
        except FileNotFoundError:
            return None, None

    def _get(self) -> bytes:
        """The object's bytes in one GET (s3fs asks for its size first otherwise: a HEAD more)."""
        return self.fs.cat_file(self.path) if is_gcs(self.fs) else self.fs.cat_file(self.path, max_concurrency=1)

    def read_data(self) -> Optional[dict]:
        """The record without its version: one GET (a liveness check needs no version)."""
        try:
            return _parse(self._get())
        except FileNotFoundError:
            return None

    def create(self, data: bytes) -> str:
        try:
            return put_bytes(self.fs, self.path, data, None)
        except Refused as e:
            raise Conflict(str(e)) from None

    def replace(self, data: bytes, expect: str) -> str:
        try:
            return put_bytes(self.fs, self.path, data, expect)
        except Refused as e:
            raise Conflict(str(e)) from None


def record_at(folder: str, name: str, storage_options=None):
    """The record `name` (a path below `folder`: `.lock.json`, `claims/<shard>.json`) on a disk or
    in a bucket: read() -> (record, version), create(data), replace(data, version)."""
    if is_fsspec_url(folder):
        return _BucketRecord(f"{folder.rstrip('/')}/{name}", storage_options)
    return _DiskRecord(os.path.abspath(folder), name)  # absolute: a Ray worker's Fence reads it


def record_names(folder: str, sub: str, storage_options=None) -> List[str]:
    """The names (without `.json`) of the records in `folder`/`sub`/, sorted: one listing."""
    if is_fsspec_url(folder):
        fs, path = filesystem(f"{folder.rstrip('/')}/{sub}", storage_options)
        listed = _listing(fs, path)
    else:
        try:
            listed = os.listdir(os.path.join(folder, sub))
        except FileNotFoundError:
            return []
    names = (os.path.basename(str(p).rstrip("/")) for p in listed)
    return sorted(n[:-5] for n in names if n.endswith(".json") and not atomic.is_temporary(n))


def _listing(fs, path: str) -> List[str]:
    """The objects right under `path` in a bucket: one request per 1,000 (s3fs's ls lists the
    parent too when the prefix is empty, to tell a missing folder)."""
    if is_gcs(fs):
        try:
            fs.invalidate_cache(path)
            return fs.ls(path, detail=False)
        except FileNotFoundError:
            return []
    bucket, key, _ = fs.split_path(path)
    names: List[str] = []
    token = None
    while True:
        more = {"ContinuationToken": token} if token else {}
        out = fs.call_s3("list_objects_v2", Bucket=bucket, Prefix=key.rstrip("/") + "/", Delimiter="/", **more)
        names += [o["Key"] for o in out.get("Contents", [])]
        token = out.get("NextContinuationToken")
        if not out.get("IsTruncated") or not token:
            return names


def live_records(folder: str, sub: str, stale: float, storage_options=None) -> Dict[str, dict]:
    """name -> record of each record in `folder`/`sub`/ whose holder still holds it (stale_reason)."""
    live = {}
    for name in record_names(folder, sub, storage_options):
        holder = record_at(folder, f"{sub}/{name}.json", storage_options).read_data()
        if holder is not None and stale_reason(holder, stale) is None:
            live[name] = holder
    return live


def _parse(data: bytes) -> dict:
    """A record; {} when it is not one (a torn or foreign file: taken over as stale)."""
    try:
        record = json.loads(data)
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


# -- the holder ---------------------------------------------------------------------------------------
_LIVE: Dict[str, "Lease"] = {}  # token -> the leases this process holds (not a forked child's)
os.register_at_fork(after_in_child=_LIVE.clear)


class Lease:
    """This process's hold on `folder` (a path or an s3:// / gs:// URL). acquire() it, write
    under it (`guard` installs its fence on folders of files), release() it."""

    def __init__(self, folder: str, storage_options=None, command: str = "score", option: str = "--out",
                 name: str = LEASE_NAME, stale: Optional[float] = None, token: Optional[str] = None):
        self.folder = folder.rstrip("/") if is_fsspec_url(folder) else folder
        self.name = name
        self.record = record_at(self.folder, name, storage_options)
        self.storage_options = storage_options
        self.command, self.option = command, option
        self.stale = stale if stale is not None else stale_seconds()
        self.token = token or os.urandom(8).hex()
        self.info = {"token": self.token, "host": socket.gethostname(), "pidns": _pid_namespace(), "pid": os.getpid(),
                     "pid_start": _process_start(os.getpid()), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                     "command": command, "stale_seconds": self.stale}
        self.report: Dict[str, object] = {}  # written with each heartbeat (a joined run's worker: its counts)
        self.version: Optional[str] = None  # of the record this run wrote last; None: not held
        self.valid_until = 0.0  # on _clock(): no write after this without a renewal
        self.took_over: Optional[dict] = None  # the stale holder this run replaced
        self.lost: Optional[str] = None  # why the folder is not this run's any more
        self.guarded: Tuple[str, ...] = ()
        self._renewing = threading.Lock()  # the heartbeat thread and a write's check take turns
        self._stop = threading.Event()
        self._keeper: Optional[threading.Thread] = None

    @property
    def shown(self) -> str:
        return redact_url(self.folder)

    # -- taking it --------------------------------------------------------------------------------
    def acquire(self) -> "Lease":
        try:
            self._write(None)
        except Conflict:
            self._take_over()
        except Exception as e:  # noqa: BLE001 - a bucket's first write probes the folder
            raise self._unwritable(e) from None
        if self.name == LEASE_NAME:  # a folder's lease excludes the workers of a joined run, as they exclude it
            worker = next(iter(live_records(self.folder, WORKERS, self.stale, self.storage_options).values()), None)
            if worker is not None:
                self.release()
                raise LeaseHeldError(f"{self.shown} is in use by the workers of a joined run (`wdsfilter score --join`)"
                                     f", for one{describe_holder(worker)}; wait for them to finish (`wdsfilter score "
                                     f"--status {self.shown}`), or use another {self.option}")
        _LIVE[self.token] = self
        self._keeper = threading.Thread(target=self._keep, name="wdsfilter-lease", daemon=True)
        self._keeper.start()
        return self

    def _take_over(self) -> None:
        holder, version = self.record.read()
        why = stale_reason(holder, self.stale)
        if holder is not None and why is None:
            raise LeaseHeldError(f"{self.shown} is in use by another wdsfilter {holder.get('command', self.command)} "
                                 f"run{describe_holder(holder)}; wait for it to finish or stop it, or use another "
                                 f"{self.option} (a run that was killed, or silent for "
                                 f"{float(holder.get('stale_seconds') or self.stale):g}s, is taken over)")
        try:  # stale, released or gone as we looked: replace exactly what was read, or lose to who did
            self._write(version)
        except Conflict:
            raise LeaseHeldError(f"{self.shown}: another run took it over first; use another {self.option} or try "
                                 f"again") from None
        self.took_over = holder or {}
        if holder is not None and not holder.get("released"):
            log.warning(f"{self.shown}: took over the lock of a run that is gone{describe_holder(holder)}: {why}")

    def _unwritable(self, e: BaseException) -> BaseException:
        if not self.record.remote and isinstance(e, OSError):
            return ConfigError(f"{self.option} {self.shown}: the lock {LEASE_NAME} cannot be written ({_short(e)})")
        if isinstance(e, PermissionError):
            return ConfigError(f"{self.option} {self.shown}: access denied for writing ({_short(e)}); credentials: "
                               f"{credential_source(self.folder, self.storage_options)}")
        if no_credentials(e):
            return ConfigError(f"{self.option} {self.shown}: cannot be written: "
                               f"{missing_credentials(self.folder, self.storage_options)}")
        if isinstance(e, OSError):
            return ConfigError(f"{self.option} {self.shown}: the lock {LEASE_NAME} cannot be written ({_short(e)})")
        return e

    def _write(self, expect: Optional[str], released: bool = False, extra: Optional[dict] = None) -> None:
        """The record with the time now: created (expect None) or replacing version `expect`."""
        body = {**self.info, **self.report, "heartbeat": time.time(),
                **({"released": time.time()} if released else {}), **(extra or {})}
        data = json.dumps(body).encode()
        began = _clock()
        self.version = self.record.create(data) if expect is None else self.record.replace(data, expect)
        self.valid_until = began + self.stale * (1 - MARGIN)

    # -- holding it -------------------------------------------------------------------------------
    def _keep(self) -> None:
        while not self._stop.wait(self.stale / 4):
            try:
                self.renew()
            except LeaseLostError:
                return  # said at the next write, which raises it
            except Exception as e:  # noqa: BLE001 - tried again next beat; a write past the deadline renews itself
                log.warning(f"{self.shown}: the lock could not be renewed ({_short(e)}); tried again in "
                            f"{self.stale / 4:g}s")

    def renew(self) -> None:
        """Rewrite the record with the time now, conditional on the version this run wrote last;
        LeaseLostError when that fails (another run took it over, or it was deleted)."""
        with self._renewing:
            if self.lost:
                raise LeaseLostError(self.lost)
            if self.version is None:
                return
            try:
                self._write(self.version)
            except Conflict:
                holder, version = self.record.read()
                if holder is not None and holder.get("token") == self.token and not holder.get("released"):
                    self._write(version)  # this run's own renewal, whose answer was lost
                    return
                raise self._lose(holder) from None

    def check(self) -> None:
        """The fence, before a write: LeaseLostError unless this run still holds the folder. On a
        disk the record is read (any process's write, a deleted record, at once); past the
        deadline the lease is renewed first."""
        if self.lost:
            raise LeaseLostError(self.lost)
        if not self.record.remote:
            holder, _ = self.record.read()
            if holder is None or holder.get("token") != self.token or holder.get("released"):
                with self._renewing:
                    raise self._lose(holder)
        if _clock() >= self.valid_until:
            self.renew()

    def _lose(self, holder: Optional[dict]) -> LeaseLostError:
        if self.lost is None:
            if holder is None:
                why = (f"its lock {self.record.shown} was deleted (by hand, or by a run that cleared the folder) while "
                       f"this run held it")
            else:
                why = (f"another wdsfilter {holder.get('command', 'run')} run{describe_holder(holder)} took it over "
                       f"while this run was stalled (no heartbeat for over {self.stale:g}s)")
            self.lost = f"{self.shown}: {why}; this run wrote nothing more into it"
            self.version = None
        return LeaseLostError(self.lost)

    def fence(self, folders: Iterable[str] = ()) -> "Fence":
        return Fence(self.token, None if self.record.remote else self.record.path,
                     tuple(os.path.abspath(f) for f in folders))

    def guard(self, folders: Iterable[str]) -> "Fence":
        """Fence every atomic write into `folders` (atomic.py) by this lease, in this process;
        the Fence returned installs the same fence in other processes (Ray workers)."""
        fence = self.fence(f for f in folders if f)
        fence.install()
        self.guarded += fence.folders
        return fence

    # -- letting go -------------------------------------------------------------------------------
    def release(self, extra: Optional[dict] = None) -> None:
        """Rewrite the record as released (if it is still this run's; with `extra`: what the holder
        did, a worker's counts), stop the heartbeat."""
        self._stop.set()
        if self._keeper is not None and self._keeper is not threading.current_thread():
            self._keeper.join()
        for folder in self.guarded:
            atomic.unguard(folder)
        self.guarded = ()
        _LIVE.pop(self.token, None)
        with self._renewing:
            if self.lost or self.version is None:
                return
            try:
                self._write(self.version, released=True, extra=extra)
            except Conflict:
                pass  # another run's now: not this one's to release
            except Exception as e:  # noqa: BLE001 - left as it is: stale in stale_seconds
                log.warning(f"{self.shown}: the lock could not be released ({_short(e)}); another run takes it over "
                            f"{self.stale:g}s after this one's last heartbeat")
            self.version = None

    def __enter__(self) -> "Lease":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


@dataclass(frozen=True)
class Fence:
    """What a write into a held folder checks, in any process (picklable: Ray workers get it with
    the run state). Where the holder lives, its own check; elsewhere, on a disk, the record
    read: it must still name the holder's token. A bucket's lease fences the holder's uploads
    (remote_out.py), so its staging folder's writes in other processes are not checked."""
    token: str
    record: Optional[str]  # the record's path on a disk; None for a bucket's
    folders: Tuple[str, ...] = ()

    def check(self) -> None:
        lease = _LIVE.get(self.token)
        if lease is not None:
            return lease.check()
        if self.record is None:
            return
        holder, _ = _DiskRecord(os.path.dirname(self.record), os.path.basename(self.record)).read()
        if holder is None or holder.get("token") != self.token or holder.get("released"):
            who = "its lock was deleted" if holder is None else f"it is held by another run{describe_holder(holder)}"
            raise LeaseLostError(f"{os.path.dirname(self.record)}: {who}; this run writes nothing more into it")

    def install(self) -> None:
        for folder in self.folders:
            atomic.guard(folder, self.check)


# -- who holds it --------------------------------------------------------------------------------------
def describe_holder(holder: dict) -> str:
    """' (pid N on HOST, started T)' as the record names its holder."""
    if not holder:
        return " (an unreadable lock)"
    return f" (pid {holder.get('pid')} on {holder.get('host')}, started {holder.get('started')})"


def stale_reason(holder: Optional[dict], stale: float) -> Optional[str]:
    """Why a record's holder no longer holds it, or None while it does."""
    if holder is None:
        return "no lock"
    if not holder or "heartbeat" not in holder:
        return "unreadable lock"
    if holder.get("released"):
        return "released"
    try:
        limit = float(holder.get("stale_seconds") or stale)
        age = time.time() - float(holder["heartbeat"])
    except (TypeError, ValueError):
        return "unreadable lock"
    if age > limit:
        return f"no heartbeat for {age:.0f}s"
    # its pid means something here only on this host and in this pid namespace (two containers may
    # share a host name, never a pid namespace); a pid reused since shows another start time
    if holder.get("host") == socket.gethostname() and holder.get("pidns") == _pid_namespace() \
            and isinstance(holder.get("pid"), int):
        if holder["pid"] == os.getpid() and holder.get("token") not in _LIVE:
            return "this process let go of it (its release could not be written)"
        started = _process_start(holder["pid"])
        if started is None and not _exists(holder["pid"]):
            return "its process is dead"
        if started is not None and holder.get("pid_start") not in (None, started):
            return "its process is dead (its pid is another process's now)"
    return None


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _process_start(pid: int) -> Optional[str]:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22), None where
    there is no such process or no /proc."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _pid_namespace() -> Optional[str]:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def _short(e: BaseException) -> str:
    return " ".join(str(e).split())[:200] or type(e).__name__
