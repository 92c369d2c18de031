"""Ray for the tests: `local_ray`, the one-node Ray of this process every Ray test but the
multi-node ones starts; and a Ray cluster of several nodes on this machine (ray.cluster_utils.Cluster) whose worker nodes do
not share the driver's disk: the tests of the Ray engine without a shared filesystem.

Every node has its own resources, object store and temporary folder (TMPDIR too). In the
processes of the worker nodes a sitecustomize module (on their PYTHONPATH only) moves the working
folder to a folder of that node and makes every folder named in WDSFILTER_TEST_DRIVER_ONLY missing:
opening, listing, creating, renaming or removing a path under one raises FileNotFoundError, as on
a machine that does not have it. So a task or actor that reads or writes a path that exists only
on the driver fails there, as it would on a real cluster. (Python's audit hooks see what Python
opens; the C++ readers of pyarrow do not raise them, so a test writes JSONL score files.)

The head node is the driver's node: it sees the driver's disk."""
from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import tempfile
import time
from typing import Dict, Iterator, List, Mapping, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
STORE = 80 * 2**20  # each node's object store (Ray's least is 75 MiB): several nodes fit in a few GB

SITECUSTOMIZE = '''\
import errno, os, sys
_home = os.environ.get("WDSFILTER_TEST_NODE_HOME")
_hidden = [p for p in os.environ.get("WDSFILTER_TEST_DRIVER_ONLY", "").split(os.pathsep) if p]
if _home:
    os.makedirs(_home, exist_ok=True)
    os.chdir(_home)
_EVENTS = {"open": 1, "os.listdir": 1, "os.scandir": 1, "os.mkdir": 1, "os.remove": 1, "os.rmdir": 1,
           "os.rename": 2, "os.replace": 2, "os.link": 2, "os.symlink": 2, "os.truncate": 1,
           "shutil.copyfile": 2, "shutil.rmtree": 1, "os.chdir": 1, "os.utime": 1, "os.chmod": 1}


def _driver_only(path):
    if path is None or isinstance(path, int):
        return False
    try:
        path = os.path.abspath(os.fsdecode(path))
    except (TypeError, ValueError):
        return False
    return any(path == h or path.startswith(h.rstrip(os.sep) + os.sep) for h in _hidden)


def _hook(event, args):
    n = _EVENTS.get(event)
    if n and args:
        for path in args[:n]:
            if _driver_only(path):
                raise FileNotFoundError(errno.ENOENT, "not on this node (only the driver has it)", path)


if _hidden:
    sys.addaudithook(_hook)
'''


class MultiNodeCluster:
    """A head node (the driver's) and `workers` worker nodes, each `cpus` CPUs and its own object
    store of `store` bytes; the worker nodes do not see `driver_only` folders. The driver is
    connected (ray.init) while it runs."""

    def __init__(self, driver_only: Sequence[str], workers: int = 2, head_cpus: int = 1, cpus: int = 2,
                 store: int = STORE, env: Dict[str, str] = None):
        import ray
        from ray.cluster_utils import Cluster
        self.root = tempfile.mkdtemp(prefix="rc", dir="/tmp")  # Ray's socket paths must stay short
        # ray.cluster_utils writes the cluster's address into RAY_TMPDIR/ray (default /tmp/ray),
        # where `ray.init(address="auto")` of any other process on this machine would find it.
        self._saved = {k: os.environ.get(k) for k in ("RAY_TMPDIR", "RAY_USAGE_STATS_ENABLED")}
        os.environ["RAY_TMPDIR"] = self.root
        os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # the driver's too: no usage poller
        os.makedirs(os.path.join(self.root, "ray"))
        hook = os.path.join(self.root, "hook")
        os.makedirs(hook)
        with open(os.path.join(hook, "sitecustomize.py"), "w") as f:
            f.write(SITECUSTOMIZE)
        path = os.pathsep.join([HERE, REPO])
        base = dict(env or {}, RAY_USAGE_STATS_ENABLED="0")
        self.node_homes: List[str] = []
        self.cluster = Cluster(initialize_head=True, head_node_args=dict(
            num_cpus=head_cpus, object_store_memory=store, include_dashboard=False,
            temp_dir=self._folder("head", "ray"), env_vars=dict(base, PYTHONPATH=path),
            _system_config={"debug_dump_period_milliseconds": 500}))  # for waiting_for_plasma()
        try:
            for i in range(workers):
                home = self._folder(f"w{i}", "home")
                self.node_homes.append(home)
                self.cluster.add_node(num_cpus=cpus, object_store_memory=store, temp_dir=self._folder(f"w{i}", "ray"),
                                      env_vars=dict(base, PYTHONPATH=os.pathsep.join([hook, path]),
                                                    WDSFILTER_TEST_NODE_HOME=home, TMPDIR=self._folder(f"w{i}", "tmp"),
                                                    WDSFILTER_TEST_DRIVER_ONLY=os.pathsep.join(driver_only)))
            self.cluster.wait_for_nodes()
            ray.init(address=self.cluster.address, include_dashboard=False, log_to_driver=False,
                     configure_logging=False)
            self.head = ray.get_runtime_context().get_node_id()
            assert self.head == self.cluster.head_node.node_id, "the driver is not on the head node"
        except BaseException:
            self.close()
            raise

    def _folder(self, node: str, what: str) -> str:
        path = os.path.join(self.root, node, what)
        os.makedirs(path, exist_ok=True)
        return path

    def spilled(self) -> int:
        """Bytes the cluster's raylets have spilled to disk so far (Ray's own total)."""
        from ray._private.internal_api import get_memory_info_reply, get_state_from_address
        return int(get_memory_info_reply(get_state_from_address(self.cluster.address)).store_stats.spilled_bytes_total)

    def waiting_for_plasma(self) -> int:
        """The most tasks one raylet holds back for object store memory now (its debug state)."""
        most = 0
        for path in glob.glob(os.path.join(self.root, "*", "ray", "session_*", "logs", "debug_state.txt")):
            try:
                with open(path) as f:
                    most = max([most, *map(int, re.findall(r"num_waiting_for_plasma_memory: (\d+)", f.read()))])
            except OSError:
                pass
        return most

    @property
    def worker_ids(self) -> List[str]:
        return [n.node_id for n in self.cluster.worker_nodes]

    def close(self) -> None:
        import ray
        ray.shutdown()
        self.cluster.shutdown()
        for k, v in self._saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def local_ray(env: Optional[Mapping[str, str]] = None, num_cpus: int = 2) -> Iterator[None]:
    """A one-node Ray of this process (address="local": never a cluster found on the machine), quiet,
    whose workers import the test kits (tests/ and the checkout on their PYTHONPATH) and get `env`
    (an S3 endpoint, an emulator's host); shut down after the block."""
    import ray
    env_vars = {"PYTHONPATH": os.pathsep.join([HERE, REPO]), **(env or {})}
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
             configure_logging=False, runtime_env={"env_vars": env_vars})
    try:
        yield
    finally:
        ray.shutdown()


@contextlib.contextmanager
def multi_node_cluster(driver_only: Sequence[str], **options) -> Iterator[MultiNodeCluster]:
    cluster = MultiNodeCluster(driver_only, **options)
    try:
        yield cluster
    finally:
        cluster.close()


def wait_until(ready, what: str, timeout: float = 120.0) -> None:
    """Until ready() is true: a hang guard, not a pause."""
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"no {what} within {timeout:g} s"
        time.sleep(0.05)
