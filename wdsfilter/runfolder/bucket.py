"""A run folder in a bucket (`score --out s3://...`, `filter --write-shards s3://...`, `dedup
s3://...`): its lease, the local staging copy the command writes, and the mirror that uploads it.

The lease (lease.py) is taken first: it probes the folder (a refused write is exit 2 before any
work). Then the folder comes down into a staging copy (remote_out.py says why), which is
mirrored back while the command runs (markers last) and at its end. The lease fences both sides:
every write into the staging copy (atomic.py's guard, in this process) and every upload or
delete (`RemoteFolder.fence`, and each one conditional on the object's version). The staging copy
is a working folder of scratch.py's: removed once the bucket holds all of it, kept and named when
the last upload failed, removed when the lease was lost (the folder is another run's), and swept
by a later run when this one was killed.
"""
from __future__ import annotations

import logging
import os
from typing import Optional

from .lease import Lease, LeaseLostError
from .names import STATE_FILES, STATE_FOLDERS
from .remote_out import Mirror, RemoteFolder, StagedSizes, staged_paths
from ..storage.remote import refuse_hub_run_folder
from .layout import DONE
from ..storage.atomic import atomic_path

log = logging.getLogger("wdsfilter")

# What --resume reads to decide which shards are done (run.json, the shard list, the recipe, the
# markers, the per-shard failure ledgers their markers vouch for and the end merges) and the marks
# of an earlier dedup (the report reads them): the rest of a bucket's run folder stays there.


def _not_state(rel: str) -> bool:
    return rel not in STATE_FILES and rel.split("/", 1)[0] not in STATE_FOLDERS


def _not_sidecar(rel: str) -> bool:
    """A --write-shards folder's filtered shards stay in the bucket; its JSON sidecars (sizes.json,
    which a rescored shard's entry is merged into, per-shard stats) come down."""
    return not rel.endswith(".json")


class RemoteRunFolder:
    """The lease, the staging copy and its mirror of one folder in a bucket (see the module
    docstring)."""

    SHARDS = ".write-shards"  # staging of a --write-shards URL, inside the run's own (never uploaded with it)

    def __init__(self, url: str, storage_options=None, lock: bool = True, interval: Optional[float] = None,
                 write_shards: Optional[str] = None, pull_shards: bool = False, command: str = "score",
                 option: str = "--out", lazy: bool = False, lease: Optional[Lease] = None):
        """lease: a joined run's worker's own lease (`workers/<token>.json`, claims.py), taken
        here in place of the folder's: only run.json, shards.json and run.yaml come down (the
        markers are listed, not read), and an object of the folder that another worker wrote is
        replaced where this worker holds the shard's claim (RemoteFolder.replace_strays)."""
        refuse_hub_run_folder(url)
        self.url = url.rstrip("/")
        self.mirror, self.synced, self.folder, self.started, self.shards = None, False, None, False, None
        self.fence = None  # the lease's Fence (lease.py): every write into staging checks it
        self.joined = lease is not None
        self.lock = (lease or Lease(self.url, storage_options, command, option)).acquire() if lock else None
        try:
            self.folder = RemoteFolder(self.url, storage_options)
            self.folder.exclude = (self.SHARDS,)
            self.folder.replace_strays = self.joined
            # lazy (--resume): only what decides which shards are done comes down; finished shards'
            # score files, embeddings and filtered shards stay in the bucket (their sizes known)
            if not self.joined:  # a joined run's worker reads run.json, shards.json and run.yaml once the run is known
                self.folder.pull(keep_in_bucket=_not_state if lazy else None)
            if write_shards:  # its files are uploaded before the markers that vouch for them
                self.shards = RemoteFolder(write_shards, storage_options, os.path.join(self.folder.local, self.SHARDS))
                self.shards.replace_strays = self.joined
                os.makedirs(self.shards.local, exist_ok=True)
                if pull_shards and not self.joined:  # --resume: a shard is done only where its filtered shard is whole
                    self.shards.pull(keep_in_bucket=_not_sidecar if lazy else None)
                self.folder.before_markers = self.shards.sync
            if self.lock is not None:  # every write into staging and every upload, fenced by the lease
                self.fence = self.lock.guard([self.folder.local])
                for f in (self.folder, self.shards):
                    if f is not None:
                        f.fence = self.lock.check
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
        return StagedSizes([f for f in (self.folder, self.shards) if f is not None])

    def fetch(self, paths) -> int:
        """The held objects among staging `paths`, downloaded now (the end of a run reads every
        score file): how many."""
        return self.folder.fetch(paths)

    def refresh(self) -> int:
        """The bucket's folder as it stands now, other workers' objects included (a joined run's
        end): the markers and failure ledgers brought into staging, the rest held where it is."""
        n = self.folder.refresh(fetch=(DONE, "failures", *STATE_FILES))
        if self.shards is not None:
            self.shards.refresh()
        return n

    def start(self) -> None:
        """Mirror the staging folder from now on (after run.json and shards.json are written)."""
        if self.lock is not None and self.mirror is None:
            self.mirror = Mirror(self.folder, self.interval).start()
            self.started = True

    def public(self, path):
        """A staging path as the run shows it: its URL in the bucket."""
        folders = [f for f in (self.shards, self.folder) if f is not None]  # the inner staging first
        return staged_paths(path, folders) if isinstance(path, str) else path

    def publish_text(self, path: Optional[str]) -> None:
        """A text file of the staging folder (the report) rewritten to name the bucket, not staging."""
        if path and os.path.exists(path):
            with open(path, encoding="utf-8", errors="surrogateescape") as f:
                text = f.read()
            with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", errors="surrogateescape") as f:
                f.write(self.public(text))

    def sync(self) -> None:
        """Everything the run wrote, uploaded now (RemoteOutputError when an upload fails;
        LeaseLostError, uploading nothing, when another run took the folder over)."""
        if self.lock is not None:
            self.lock.check()
            self.folder.sync()
            self.synced = True

    def release(self) -> None:
        """Stop mirroring (a last sync, whatever happened), let go of the lease; the staging folder
        is removed when the bucket holds it all or the folder is another run's, else kept and
        named. A lost lease is not raised here: the run's next write or sync raised it."""
        lost = False
        try:
            if self.mirror is not None:
                self.mirror.stop()
                self.synced = True
        except LeaseLostError:
            lost = True
        except OSError as e:
            self.synced = False
            log.error(f"{self.url}: {e}; the run's files are kept in {self.local} (copy them, or run again with "
                      f"--resume)")
            self.folder.keep_staging()
        finally:
            self.mirror = None
            if self.lock is not None:
                lost = lost or bool(self.lock.lost)
                self.lock.release()
                self.lock = None
            # never started: staging holds only what was pulled (a refused or dry run); lost: the
            # folder is another run's, and what this one staged is nobody's
            if self.folder is not None and (self.synced or not self.started or lost):
                self.folder.remove_staging()
