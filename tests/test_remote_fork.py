"""A forked worker (validate's and score's decode workers are forked) must not unregister its
parent's sockets from fsspec's event loop (wdsfilter/storage/remote_fork.py). A child that
collected the http filesystem it inherited closed its session through the parent's loop object,
whose epoll instance the fork shares: the parent kept the sockets in its selector map but the
kernel no longer watched them, and the next request on one waited out aiohttp's 300 s timeout
(CI: test_remote_secrets after test_remote, 303 s)."""
import os
import re
import select
import sys
import threading

import pytest

pytest.importorskip("fsspec")
pytest.importorskip("aiohttp")
pytestmark = pytest.mark.skipif(not (sys.platform.startswith("linux") and hasattr(select, "epoll")),
                                reason="epoll (the selector a fork shares) and /proc are Linux's")

from remotekit import FaultServer  # noqa: E402

import wdsfilter.storage.remote  # noqa: E402,F401 - installs the fork hooks, as every remote read does


def _unwatched(loop) -> set:
    """Descriptors in the loop's selector map that its epoll instance does not watch."""
    epoll_fd = loop._selector._selector.fileno()
    watched = {int(fd) for fd in re.findall(r"tfd:\s+(\d+)", open(f"/proc/self/fdinfo/{epoll_fd}").read())}
    return set(loop._selector.get_map()) - watched


def _cat(fs, url: str, seconds: float = 60.0):
    """fs.cat_file(url) on a thread, None when it did not finish in `seconds` (a hang guard)."""
    got = []
    worker = threading.Thread(target=lambda: got.append(fs.cat_file(url)), daemon=True)
    worker.start()
    worker.join(seconds)
    return got[0] if got else None


def test_a_forked_child_closing_what_it_inherited_leaves_the_parents_sockets_watched():
    from fsspec.implementations.http import HTTPFileSystem
    with FaultServer() as web:
        url = web.put("d/a.bin", b"x" * 1000)
        fs = HTTPFileSystem(skip_instance_cache=True)
        assert fs.cat_file(url) == b"x" * 1000  # a kept-alive connection, watched by the loop
        loop = fs.loop
        assert loop._selector.get_map() and not _unwatched(loop)
        pid = os.fork()
        if pid == 0:  # the child: what the finalizer of the filesystem it inherited does
            code = 0
            try:
                HTTPFileSystem.close_session(loop, fs._session)
            except BaseException:  # noqa: BLE001 - the exit code says it
                code = 1
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert not _unwatched(loop), "the child unregistered the parent's sockets"
        assert _cat(fs, url) == b"x" * 1000  # the kept-alive connection answers (it waited 300 s)
