"""What a Ray run needs from the driver's disk, on a cluster whose nodes may not share one.

Before the stream starts, one small task on every node (`probe_node`) says which of the run's
local inputs that node sees with the driver's bytes; `survey` (on the driver) decides from that:

    local shards   the first shard of each folder (its size and first 64 KiB). Where a node does
                   not see them all, every read task (and the planner's probe) runs on the
                   driver's node, which has them; the rows then reach the model actors on every
                   node through Ray, as the rows of any read task do. No node sees them: refused.
    model files    each scorer's `local_files()` (a checkpoint, a model folder), by content hash.
                   A node without the same bytes gets the driver's: they go into Ray's object
                   store in chunks, the first task or actor on that node writes them into a
                   node-local cache (TMPDIR/wdsfilter-ray-files/<sha256>/, checked against the
                   hash, kept for later runs) and the scorer reads them there
                   (`Scorer.relocate`). A scorer that cannot relocate them is refused, naming the
                   file and the node.
    the run folder never leaves the driver: the rows come back and the driver writes every file
                   (batches.write_finished), so `--out` and `--write-shards` may be a folder
                   only the driver has, or a bucket through the driver's staging copy.

A `pipe:` command runs on the node of its read task: what it reads is its own business.
"""
from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import os
import shutil
import socket
import tempfile
from typing import Dict, FrozenSet, List, Optional, Sequence, Tuple

from ...core.errors import ConfigError
from ...storage.shards import is_local, local_path
from .ray_workers import node_id
from ..scorers.base import Scorer

CHUNK = 16 * 2**20  # bytes per object of a shipped file: a big checkpoint never sits in memory whole
HEAD = 64 * 2**10  # bytes of a shard compared (with its size) to tell the driver's shard from another
CACHE = "wdsfilter-ray-files"
PROBE_SECONDS = 300  # a node that does not answer in this time is taken as seeing nothing


# -- what a node sees ------------------------------------------------------------------------------
def shard_print(path: str) -> Optional[Tuple[int, str]]:
    """(size, sha256 of the first HEAD bytes) of a shard as this node reads it; None if it cannot."""
    try:
        with open(path, "rb") as f:
            head = f.read(HEAD)
            f.seek(0, os.SEEK_END)
            return f.tell(), hashlib.sha256(head).hexdigest()
    except OSError:
        return None


def _files_under(path: str) -> List[str]:
    """A folder's files, relative, sorted; a file is its own one entry ("")."""
    if not os.path.isdir(path):
        return [""]
    found = []
    for root, dirs, files in os.walk(path):
        dirs.sort()
        found += [os.path.relpath(os.path.join(root, f), path) for f in sorted(files)]
    return found


def content_digest(path: str) -> Optional[str]:
    """sha256 over a file's bytes, or over a folder's files (relative name, size, bytes); None
    when this node cannot read it whole."""
    digest = hashlib.sha256()
    try:
        names = _files_under(path)
        if not names:  # an empty folder, or one this node cannot list
            return None
        for name in names:
            with open(os.path.join(path, name) if name else path, "rb") as f:
                digest.update(f"{name}\0{os.fstat(f.fileno()).st_size}\0".encode())
                for block in iter(lambda: f.read(2**20), b""):
                    digest.update(block)
    except OSError:
        return None
    return digest.hexdigest()


def probe_node(shards: Sequence[str], files: Sequence[str]) -> dict:
    """A Ray task pinned to one node: which local shards and model files it sees, and how."""
    return {"node": node_id(), "host": socket.gethostname(), "shards": [shard_print(p) for p in shards],
            "files": [content_digest(p) for p in files]}


# -- shipping a model file ---------------------------------------------------------------------------
@dataclasses.dataclass
class Shipment:
    """A local file or folder of the driver, in Ray's object store for the nodes that lack it."""
    path: str  # on the driver (what the scorers name)
    digest: str  # content_digest
    entries: List[Tuple[str, int, list]]  # (relative name, "" for a file; size; ObjectRefs of its chunks)
    same_on: FrozenSet[str]  # nodes that hold the same bytes at `path`: they read it there

    @classmethod
    def put(cls, ray, path: str, digest: str, same_on: FrozenSet[str]) -> "Shipment":
        entries = []
        for name in _files_under(path):
            with open(os.path.join(path, name) if name else path, "rb") as f:
                refs = [ray.put(block) for block in iter(lambda: f.read(CHUNK), b"")]
                entries.append((name, os.fstat(f.fileno()).st_size, refs))
        return cls(path, digest, entries, same_on)

    def local_copy(self) -> str:
        """The path this node reads: `path` itself where it holds the same bytes, else its copy in
        the node's cache, written once per node (under a lock: the node's tasks and actors start
        together) and checked against the digest."""
        if node_id() in self.same_on:
            return self.path
        import ray
        folder = os.path.join(tempfile.gettempdir(), CACHE, self.digest)
        target = os.path.join(folder, os.path.basename(self.path.rstrip(os.sep)))
        if os.path.exists(os.path.join(folder, ".complete")):
            return target
        os.makedirs(os.path.dirname(folder), exist_ok=True)
        with open(folder + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if os.path.exists(os.path.join(folder, ".complete")):
                return target
            shutil.rmtree(folder, ignore_errors=True)  # a copy cut short by a killed worker
            for name, _size, refs in self.entries:
                dest = os.path.join(target, name) if name else target
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                with open(dest, "wb") as f:
                    for ref in refs:
                        f.write(ray.get(ref))
            if content_digest(target) != self.digest:
                shutil.rmtree(folder, ignore_errors=True)
                raise RuntimeError(f"the copy of {self.path} on this node does not match the driver's bytes")
            open(os.path.join(folder, ".complete"), "w").close()
        return target


@dataclasses.dataclass
class NodeInputs:
    """What survey found, handed to every read task, the probe task and every model actor."""
    driver_node: str
    pin_reads: bool = False  # read tasks (and the probe) run on the driver's node
    driver_store: float = 0.0  # the driver's node's object store, bytes (where pinned reads put their blocks)
    driver_cpus: float = 0.0  # the driver's node's CPUs: how many pinned reads run at once
    shipments: List[Shipment] = dataclasses.field(default_factory=list)

    def apply(self, scorers: Sequence) -> None:
        """On a worker: each scorer reads its local files where this node has them (a copy
        where it has not). Called again on the same objects, it moves nothing."""
        by_path = {s.path: s for s in self.shipments}
        for scorer in scorers:
            moved = {p: by_path[p].local_copy() for p in scorer.local_files() if p in by_path}
            moved = {p: q for p, q in moved.items() if p != q}
            if moved:
                scorer.relocate(moved)

    def read_options(self) -> dict:
        """Ray Data options of the read tasks: pinned to the driver's node when the other nodes
        do not see the local shards, and no more of them at once than its CPUs run (Ray Data
        starts as many as the cluster has free CPUs, each filling its share of the object store
        when it starts; pinned ones would all fill the driver's node)."""
        if not self.pin_reads:
            return {}
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        return {"scheduling_strategy": NodeAffinitySchedulingStrategy(self.driver_node, soft=False),
                "concurrency": max(1, int(self.driver_cpus))}


# -- on the driver -------------------------------------------------------------------------------------
def local_files(scorers: Sequence) -> List[str]:
    """Every scorer's local files, absolute, each once."""
    paths: List[str] = []
    for scorer in scorers:
        paths += [os.path.abspath(p) for p in scorer.local_files() if os.path.abspath(p) not in paths]
    return paths


def folder_samples(urls: Sequence[str], most: int = 16) -> List[str]:
    """The first local shard of each folder (at most `most` folders): what a node must see."""
    seen: Dict[str, str] = {}
    for url in urls:
        if is_local(url):
            path = os.path.abspath(local_path(url))
            seen.setdefault(os.path.dirname(path), path)
            if len(seen) >= most:
                break
    return list(seen.values())


def survey(ray, scorers: Sequence, urls: Sequence[str], echo=lambda text: None) -> NodeInputs:
    """Probe every alive node (one task each, no CPU) and decide: read tasks pinned to the
    driver's node or not, which model files to ship. ConfigError: local shards that no node of
    the cluster reads, or a model file a scorer cannot be given elsewhere."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    driver = ray.get_runtime_context().get_node_id()
    shards, files = folder_samples(urls), local_files(scorers)
    inputs = NodeInputs(driver)
    if not shards and not files:
        return inputs
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    task = ray.remote(num_cpus=0, max_retries=0)(probe_node)
    refs = {n["NodeID"]: task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
            .remote(shards, files) for n in nodes}
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=PROBE_SECONDS)
    seen = {r["node"]: r for r in ray.get(ready)}
    mine = [shard_print(p) for p in shards]
    readers = {node for node, r in seen.items() if r["shards"] == mine}
    if shards and not readers:
        raise ConfigError(f"no node of the Ray cluster reads the local shard {shards[0]} as this machine does "
                          f"(the driver is not on a node that has it): put the shards in object storage "
                          f"(s3://, gs://) or on a filesystem every node mounts")
    inputs.pin_reads = bool(shards) and readers != set(refs)
    if inputs.pin_reads:
        if driver not in readers:
            raise ConfigError(f"the local shard {shards[0]} is on this machine but not on the Ray node this driver "
                              f"runs on: run the driver on a node of the cluster, or put the shards in object storage")
        mine = next((n["Resources"] for n in nodes if n["NodeID"] == driver), {})
        cpus, inputs.driver_store = mine.get("CPU", 0), float(mine.get("object_store_memory", 0))
        inputs.driver_cpus = cpus
        if cpus < 1:  # the read tasks could never start there: the run would wait for ever
            raise ConfigError(f"the local shards (e.g. {shards[0]}) are read only on this node, where Ray has no CPU "
                              f"(`ray start --num-cpus 0`?), and {len(refs) - len(readers)} other node(s) do not "
                              f"see them: give this node a CPU, run the driver on a node with CPUs that sees the "
                              f"shards, or put them in object storage (s3://, gs://)")
        echo(f"ray: {len(refs) - len(readers)} of {len(refs)} node(s) do not see the local shards "
             f"(no shared filesystem): they are read on this node and scored on every node")
    for i, path in enumerate(files):
        digest = content_digest(path)
        if digest is None:
            raise ConfigError(f"cannot read the model file {path} on this machine")
        same = frozenset(node for node, r in seen.items() if r["files"][i] == digest)
        if same == set(refs):
            continue
        _check_relocatable(scorers, path, sorted(set(refs) - same))
        inputs.shipments.append(Shipment.put(ray, path, digest, same))
        echo(f"ray: {path} is sent to the {len(refs) - len(same)} node(s) that do not hold it")
    return inputs


def _check_relocatable(scorers: Sequence, path: str, lacking: Sequence[str]) -> None:
    for scorer in scorers:
        relocates = type(scorer).relocate is not Scorer.relocate
        if path in [os.path.abspath(p) for p in scorer.local_files()] and not relocates:
            raise ConfigError(f"scorer {scorer.name!r} reads {path}, which Ray node {lacking[0]} does not hold "
                              f"(no shared filesystem), and it cannot read a copy elsewhere: put the file at the "
                              f"same path on every node, or on a filesystem every node mounts")
