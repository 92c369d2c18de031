"""Fault injection for the scoring tests (no tests in this module): scorers that fail the way a
broken GPU, a host OOM kill or a cuBLAS allocation failure does, a web server that breaks off
a download half-way, and a small filesystem that fills up (with shards big enough to fill it).

A scorer's failure is switched on by a file (`trip_file`) rather than by an option, so a run can
fail and then be resumed with exactly the same settings (the resume check compares options).
"""
from __future__ import annotations

import http.server
import os
import threading
from contextlib import contextmanager

import torch

from remotekit import FaultServer, LoopbackServer
from scorekit import BrightnessScorer

# What PyTorch raises after a kernel fault; the context is unusable afterwards.
STICKY_MESSAGES = {
    "illegal": "CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be asynchronously "
               "reported at some other API call, so the stacktrace below might be incorrect.",
    "assert": "CUDA error: device-side assert triggered\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side "
              "assertions.",
    "bus": "CUDA error: GPU has fallen off the bus",
    "cublas": "CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm( handle, opa, opb, m, n, k, "
              "&alpha, a, lda, b, ldb, &beta, c, ldc)`",
    "cudnn": "cuDNN error: CUDNN_STATUS_MAPPING_ERROR",
    # the rest of what the CUDA runtime documents as leaving the context unusable, and "unknown error"
    "timeout": "CUDA error: the launch timed out and was terminated",
    "pc": "CUDA error: invalid program counter",
    "address_space": "CUDA error: operation not supported on global/shared address space",
    "nvlink": "CUDA error: uncorrectable NVLink error detected during the execution",
    "unknown": "CUDA error: unknown error\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
}
ALLOC_MESSAGES = {
    "cublas": "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
    "cudnn": "cuDNN error: CUDNN_STATUS_ALLOC_FAILED",
    "workspace": "cuDNN error: CUDNN_STATUS_NOT_ENOUGH_WORKSPACE",
}


class StickyScorer(BrightnessScorer):
    """Scores like BrightnessScorer until, while `trip_file` exists, a batch holds a sample whose
    key starts with `trip_key`; from then on every call in this process fails with the sticky
    error `kind`, as a real broken CUDA context does."""

    name = "bright"

    def __init__(self, trip_file: str = "", trip_key: str = "", kind: str = "illegal", **kw):
        super().__init__(**kw)
        self.trip_file, self.trip_key, self.kind = trip_file, trip_key, kind
        self._broken = False

    def score_batch(self, inputs):
        if not self._broken and self.trip_file and os.path.exists(self.trip_file):
            self._broken = any(i["key"].startswith(self.trip_key) for i in inputs)
        if self._broken:
            raise RuntimeError(STICKY_MESSAGES[self.kind])
        return super().score_batch(inputs)


class AllocFailScorer(BrightnessScorer):
    """A cuBLAS/cuDNN allocation failure for any batch larger than `alloc_above`."""

    name = "bright"

    def __init__(self, alloc_above: int = 2, kind: str = "cublas", **kw):
        super().__init__(**kw)
        self.alloc_above, self.kind = alloc_above, kind

    def score_batch(self, inputs):
        if len(inputs) > self.alloc_above:
            raise RuntimeError(ALLOC_MESSAGES[self.kind])
        return super().score_batch(inputs)


class ExitScorer(BrightnessScorer):
    """Kills its own process (os._exit, as the kernel's OOM killer would) on any batch holding a
    sample whose key ends with `kill_key`, while `trip_file` exists."""

    name = "bright"

    def __init__(self, kill_key: str = "", trip_file: str = "", **kw):
        super().__init__(**kw)
        self.kill_key, self.trip_file = kill_key, trip_file

    def prepare(self, sample):
        out = super().prepare(sample)
        out["kill"] = bool(self.kill_key) and sample["__key__"].endswith(self.kill_key)
        return out

    def score_batch(self, inputs):
        if any(i["kill"] for i in inputs) and os.path.exists(self.trip_file):
            os._exit(137)
        return super().score_batch(inputs)


@contextmanager
def broken_download(path: str, send_fraction: float = 0.5, announce_length: bool = True):
    """An HTTP server on 127.0.0.1 that announces `path`'s full length and sends only part of it,
    then closes the connection: curl (webdataset's http reader) ends with an error mid-read.
    announce_length=False: an HTTP/1.0 answer with no length, whose body ends where the connection
    closes: curl cannot tell it was cut and exits 0.
    Yields (URL, control): set control["fraction"] = 1.0 to serve it whole from then on."""
    data = open(path, "rb").read()
    control = {"fraction": send_fraction}

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1" if announce_length else "HTTP/1.0"

        def do_GET(self):  # noqa: N802 - the http.server API
            self.send_response(200)
            if announce_length:
                self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[:int(len(data) * control["fraction"])])
            self.wfile.flush()
            self.close_connection = True

        def log_message(self, *args):
            pass

    with LoopbackServer(Handler) as server:
        yield f"{server.url}/{os.path.basename(path)}", control


torch.set_num_threads(1)


# -- a full disk ----------------------------------------------------------------------------------
@contextmanager
def small_tmpfs(mnt, size: str = "2m"):
    """A real filesystem of `size` at `mnt` (tmpfs; needs root, as in CI containers; the test is
    skipped without). Yields (mnt, grow): grow(size) resizes it."""
    import subprocess

    import pytest
    os.makedirs(mnt, exist_ok=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
                      capture_output=True).returncode:
        pytest.skip("mounting a small tmpfs needs root")

    def grow(new_size: str) -> None:
        subprocess.run(["mount", "-o", f"remount,size={new_size}", str(mnt)], check=True)
    try:
        yield mnt, grow
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def big_shards(folder, n_shards, samples=6, blob=120_000):
    """Shards of image-text samples that carry an incompressible 120 KB .bin member each."""
    import random

    from shardkit import image_bytes, write_shard
    os.makedirs(folder, exist_ok=True)
    urls = []
    rng = random.Random(0)
    for s in range(n_shards):
        members = []
        for i in range(samples):
            key = f"s{s}_{i:05d}"
            members += [(f"{key}.jpg", image_bytes(color=(40 * i % 256, 90, 30 * s % 256))),
                        (f"{key}.txt", f"sample {i}"), (f"{key}.bin", rng.randbytes(blob))]
        urls.append(write_shard(os.path.join(folder, f"big-{s:04d}.tar"), members))
    return urls


def temporaries(*folders):
    """The atomic writes' temporaries (`.<name>.tmp-<pid>`) left under `folders`."""
    return [os.path.join(root, f) for folder in folders for root, _, files in os.walk(folder) for f in files
            if ".tmp-" in f]


@contextmanager
def counting_server(data: bytes, name: str, delay: float = 0.0):
    """`data` served on 127.0.0.1 as /NAME; yields (URL, hits): hits lists every request's path.
    `delay` holds every answer back, so racing requests overlap."""
    import time
    hits = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the http.server API
            hits.append(self.path)
            time.sleep(delay)
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    with LoopbackServer(Handler) as server:
        yield f"{server.url}/{name}", hits


@contextmanager
def weights_server(filename: str, payload: bytes, delay: float = 0.0):
    """easyocr's download source, served locally: a zip holding `filename`. Yields (URL, hits);
    hits counts the downloads. `delay` holds every answer back, so racing downloads overlap."""
    import io
    import zipfile
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr(filename, payload)
    with counting_server(buf.getvalue(), "craft_mlt_25k.zip", delay) as served:
        yield served


def fetch_easyocr_weights(model_dir: str, url: str, md5: str) -> str:
    """In a fresh process, what a model worker does: point easyocr's table at `url` and fetch."""
    from easyocr import config
    from wdsfilter.score.ocr_backends.easyocr_backend import EasyOcrBackend
    config.detection_models["craft"]["url"] = url
    config.detection_models["craft"]["md5sum"] = md5
    backend = EasyOcrBackend(model_dir=model_dir, download=True)
    return backend.fetch()


class LoadFailScorer(BrightnessScorer):
    """A scorer whose model cannot be loaded (corrupt weights, a library that fails)."""

    name = "bright"

    def load(self, device):
        raise RuntimeError("the weights file is corrupt\nmore detail on a second line")


class DecodeExitScorer(BrightnessScorer):
    """Kills the decode worker preparing a sample whose key ends with `kill_key` (os._exit, as the
    kernel's OOM killer would), while `trip_file` exists."""

    name = "bright"

    def __init__(self, kill_key: str = "", trip_file: str = "", **kw):
        super().__init__(**kw)
        self.kill_key, self.trip_file = kill_key, trip_file

    def prepare(self, sample):
        if self.kill_key and sample["__key__"].endswith(self.kill_key) and os.path.exists(self.trip_file):
            os._exit(137)
        return super().prepare(sample)


def _listed(path: str) -> set:
    try:
        with open(path) as f:
            return set(f.read().split())
    except OSError:
        return set()


class FlakyScorer(BrightnessScorer):
    """Fails on the samples whose keys a file lists, the way a transient fault does, while the
    file says so (the run's options stay the same, so --resume and --retry-failed accept them):
    keys in `raise_file` make score_batch raise a ValueError (a scorer's exception), in
    `oom_file` a CUDA out-of-memory error at any batch size (out of memory after the back-off's
    floor), in `prepare_file` make prepare() raise a RuntimeError (a scorer's exception in the
    decode worker)."""

    name = "bright"

    def __init__(self, raise_file: str = "", oom_file: str = "", prepare_file: str = "", **kw):
        super().__init__(**kw)
        self.raise_file, self.oom_file, self.prepare_file = raise_file, oom_file, prepare_file

    def prepare(self, sample):
        if self.prepare_file and sample["__key__"] in _listed(self.prepare_file):
            raise RuntimeError(f"test: prepare breaks on {sample['__key__']}")
        return super().prepare(sample)

    def score_batch(self, inputs):
        keys = {i["key"] for i in inputs}
        if self.oom_file and keys & _listed(self.oom_file):
            raise torch.cuda.OutOfMemoryError(f"test: out of memory with {sorted(keys & _listed(self.oom_file))}")
        if self.raise_file and keys & _listed(self.raise_file):
            raise ValueError(f"test: the model breaks on {sorted(keys & _listed(self.raise_file))}")
        return super().score_batch(inputs)


class FlakyClip(__import__("wdsfilter.score.scorers.clip", fromlist=["ClipScorer"]).ClipScorer):
    """The CLIP scorer, failing (a RuntimeError in prepare(): a transient scorer exception) on the
    samples whose keys `prepare_file` lists while it lists them."""

    def __init__(self, prepare_file: str = "", **kw):
        super().__init__(**kw)
        self.prepare_file = prepare_file

    def prepare(self, sample):
        if self.prepare_file and sample["__key__"] in _listed(self.prepare_file):
            raise RuntimeError(f"test: prepare breaks on {sample['__key__']}")
        return super().prepare(sample)


class ChaosScorer(FlakyScorer):
    """FlakyScorer that can also die the way processes die, while a file lists the key: a decode
    worker preparing a key of `decode_kill_file` and a model worker process scoring a key of
    `model_kill_file` end with os._exit(137), as the kernel's OOM killer ends them (the probe's
    prepare() in the main process and a model scored in the main process are spared: those
    would be the run's own death, which the tests bring about with kill -9)."""

    name = "bright"

    def __init__(self, decode_kill_file: str = "", model_kill_file: str = "", **kw):
        super().__init__(**kw)
        self.decode_kill_file, self.model_kill_file = decode_kill_file, model_kill_file

    def prepare(self, sample):
        if self.decode_kill_file and torch.utils.data.get_worker_info() is not None \
                and sample["__key__"] in _listed(self.decode_kill_file):
            os._exit(137)
        return super().prepare(sample)

    def score_batch(self, inputs):
        import multiprocessing
        if self.model_kill_file and multiprocessing.parent_process() is not None \
                and {i["key"] for i in inputs} & _listed(self.model_kill_file):
            os._exit(137)
        return super().score_batch(inputs)


class HoldScorer(BrightnessScorer):
    """Scores like BrightnessScorer, but while `hold_file` exists each batch waits for it to go,
    after writing a file named after its process into `held_dir` (the event a test waits for: a
    model worker is mid-batch). Removing `hold_file` lets every held batch go on."""

    name = "bright"

    def __init__(self, hold_file: str = "", held_dir: str = "", **kw):
        super().__init__(**kw)
        # not `hold_file`: BrightnessScorer's own (wait until it exists) would hold every batch
        # again once this one is removed
        self.release_file, self.held_dir = hold_file, held_dir

    def score_batch(self, inputs):
        if self.release_file and os.path.exists(self.release_file):
            with open(os.path.join(self.held_dir, str(os.getpid())), "w"):
                pass
            while os.path.exists(self.release_file):  # waits for the test's event, not for a time
                threading.Event().wait(0.05)
        return super().score_batch(inputs)


# -- an S3 API server whose GETs fail ---------------------------------------------------------------
class S3FaultProxy(FaultServer):
    """A proxy on 127.0.0.1 in front of an S3 API server (moto's): every request is forwarded
    unchanged, except a GET of an object (path /BUCKET/KEY) with a fault queued for it (`fail`,
    the faults of remotekit.FaultServer: a reset or a clean close at an absolute byte, a stall, a
    status with Retry-After, an object replaced): that GET is answered by FaultServer from the
    object's bytes as the S3 server holds them now (same ETag: S3's is the MD5 of a plain upload),
    with the fault. `url` is the endpoint to give the S3 client; `requests` and `body_bytes` count
    what went through."""

    def __init__(self, upstream: str):
        import collections
        import urllib.parse
        super().__init__()
        self.upstream = urllib.parse.urlsplit(upstream)
        self.body_bytes = collections.Counter()  # path -> bytes of the GET answers forwarded
        handler = self.httpd.RequestHandlerClass  # writes are forwarded as they are (counted in requests)
        handler.do_PUT = handler.do_POST = handler.do_DELETE = \
            lambda h: self._forward(h, urllib.parse.urlsplit(h.path).path.lstrip("/"))  # noqa: N815

    def _answer(self, h, head: bool) -> None:
        import urllib.parse
        path = urllib.parse.urlsplit(h.path).path.lstrip("/")
        with self.lock:
            faulty = not head and bool(self.faults.get(path))
        if not faulty:
            return self._forward(h, path)
        whole = {k: v for k, v in h.headers.items() if k.lower() not in ("connection", "range", "if-match")}
        status, _, data = self._upstream("GET", h.path, whole)
        if status != 200:
            return self._status(h, status)
        with self.lock:
            self.objects[path] = data
        h.path = "/" + path  # FaultServer knows objects by their path alone
        super()._answer(h, head)

    def _upstream(self, method: str, path: str, headers: dict, body: "bytes | None" = None):
        import http.client
        conn = http.client.HTTPConnection(self.upstream.hostname, self.upstream.port, timeout=30)
        try:
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.getheaders(), resp.read()
        finally:
            conn.close()

    def _forward(self, h, path: str) -> None:
        with self.lock:
            self.requests.append((h.command, path, h.headers.get("Range")))
        headers = {k: v for k, v in h.headers.items() if k.lower() != "connection"}
        length = int(h.headers.get("Content-Length") or 0)
        status, answer_headers, data = self._upstream(h.command, h.path, headers, h.rfile.read(length) if length else None)
        h.send_response(status)
        for k, v in answer_headers:  # a HEAD's Content-Length is the object's: kept
            if k.lower() not in ("transfer-encoding", "connection", "server", "date") and \
                    (k.lower() != "content-length" or h.command == "HEAD"):
                h.send_header(k, v)
        if h.command != "HEAD":
            h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if h.command == "GET":
            with self.lock:
                self.body_bytes[path] += len(data)
        if h.command != "HEAD":
            h.wfile.write(data)
