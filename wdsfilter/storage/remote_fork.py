"""A forked worker must not touch its parent's event loop. fsspec runs every s3/gs/http request on
one event-loop thread per process; on Linux its selector is an epoll object, and a fork hands the
child the same kernel epoll instance. A child that collects the filesystems it inherited (fsspec
drops them in a child) runs their finalizers, which close the sessions' sockets through the
parent's loop object and so remove the parent's registrations from the shared epoll set
(fsspec's HTTPFileSystem.close_session gives the loop 0.1 s, which has no thread in the child,
then closes the connector from the calling thread). The parent's loop keeps those descriptors in
its selector map; a new connection that reuses one of the numbers is never watched and its
request waits out aiohttp's 300 s timeout. Found when a test's validate workers stalled the next
remote command in the same process for 300 s.

install() gives the parent loop's selector, in each child, an epoll object of its own, so what the
child does with the inherited loop stays in the child. Poll and select keep no kernel state, and
kqueue is not inherited across fork: epoll is the one selector that needs this."""
from __future__ import annotations

import os
import select
import sys
from typing import Optional

_parent_loop: list = [None]  # fsspec's loop at the fork, kept by the `before` hook for the child
_installed = False


def install() -> None:
    """Registers the fork hooks, once per process (the module is imported before any fork)."""
    global _installed
    if not _installed and hasattr(os, "register_at_fork"):
        os.register_at_fork(before=_remember_loop, after_in_child=_own_epoll_in_child,
                            after_in_parent=_forget_loop)
        _installed = True


def _fsspec_loop():
    asyn = sys.modules.get("fsspec.asyn")  # never imported here: a process without fsspec has no loop
    return asyn.loop[0] if asyn is not None else None


def _remember_loop() -> None:
    _parent_loop[0] = _fsspec_loop()


def _forget_loop() -> None:
    _parent_loop[0] = None


def _own_epoll_in_child() -> None:
    loop, _parent_loop[0] = _parent_loop[0], None
    detach_epoll(loop)


def detach_epoll(loop) -> Optional[object]:
    """Replace `loop`'s epoll object by a new, empty one (the old descriptor closed: the parent's
    epoll instance lives on through its own descriptor). Returns the new epoll, or None when the
    loop has none (another selector, or no loop)."""
    selector = getattr(loop, "_selector", None)
    epoll = getattr(selector, "_selector", None)
    if not hasattr(select, "epoll") or not isinstance(epoll, select.epoll):
        return None
    epoll.close()
    selector._selector = select.epoll()
    return selector._selector
