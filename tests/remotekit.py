"""Real servers on 127.0.0.1 for the remote tests: moto's S3 API server, and a web server of our
own that serves objects with ETag and Range support and injects the faults a real network has
(a connection reset at a chosen byte, 503, 429 with Retry-After, a stall, a short read, an object
replaced between two reads). No test helper here: test files import these."""
from __future__ import annotations

import contextlib
import email.utils
import hashlib
import http.server
import json
import os
import re
import socket
import struct
import threading
import time
from typing import Dict, Iterator, List, Optional, Tuple

# Fake credentials for moto; the secret is distinctive so a test can look for it in every output.
SECRET = "wdsfSECRETx9Q7zK2mVb"
BUCKET = "wdsf-shards"


@contextlib.contextmanager
def environment(**values: Optional[str]):
    """The process environment with `values` set (None: unset) for the block, then put back as it
    was: how the clients are pointed at a test server, as a user points them at a mirror or an
    emulator (AWS_ENDPOINT_URL, STORAGE_EMULATOR_HOST, HF_ENDPOINT). A module-scoped fixture's
    server outlives a test, so pytest's monkeypatch (per test) does not fit."""
    def put(pairs):
        for k, v in pairs.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    saved = {k: os.environ.get(k) for k in values}
    try:
        put(values)
        yield
    finally:
        put(saved)


class LoopbackServer:
    """An HTTP server of `handler` (a BaseHTTPRequestHandler class) on a free port of 127.0.0.1,
    answering from a thread between __enter__ and __exit__. Its answering threads are daemons: an
    answer held back on purpose (a stall) does not hold up the stop. `url`: its base URL."""

    def __init__(self, handler):
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self):
        # a short poll: a test waits for the stop at its end
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def atomic_writes(app):
    """A WSGI wrapper of moto's application under which each write (PUT, POST, DELETE) is one
    step, as S3 promises for conditional writes ("the first write to finish succeeds"): moto
    checks `If-None-Match`/`If-Match` and then stores the object in two steps of one request
    thread, so two writers of one key, scheduled between them, could both succeed. The body is
    read before the lock is taken, so a writer whose process is stopped mid-upload holds no one up."""
    import io
    import threading
    lock = threading.Lock()

    def wrapped(environ, start_response):
        if environ.get("REQUEST_METHOD") not in ("PUT", "POST", "DELETE"):
            return app(environ, start_response)
        length = environ.get("CONTENT_LENGTH")
        if length:
            body = environ["wsgi.input"].read(int(length))
        elif environ.get("wsgi.input_terminated"):  # chunked: werkzeug ends the stream at its end
            body = environ["wsgi.input"].read()
        else:
            body = b""
        environ["wsgi.input"], environ["CONTENT_LENGTH"] = io.BytesIO(body), str(len(body))
        environ.pop("HTTP_TRANSFER_ENCODING", None)
        with lock:
            return list(app(environ, start_response))
    return wrapped


def _moto_server():
    """moto's ThreadedMotoServer with each write atomic (atomic_writes)."""
    from moto.server import DomainDispatcherApplication, MotoRequestHandler, ThreadedMotoServer, create_backend_app
    from werkzeug.serving import make_server

    class Server(ThreadedMotoServer):
        def _server_entry(self):
            app = atomic_writes(DomainDispatcherApplication(create_backend_app))
            self._server = make_server(self._ip_address, self._port, app, True, request_handler=MotoRequestHandler)
            self._server_ready_event.set()
            self._server.serve_forever()
    return Server(ip_address="127.0.0.1", port=0, verbose=False)


@contextlib.contextmanager
def s3_server(monkeypatch=None):
    """moto's S3 API server on a free loopback port (each write atomic, as S3's are); the AWS chain
    pointed at it through the environment (AWS_ENDPOINT_URL, as a user of MinIO or R2 sets it).
    Yields (endpoint, boto3 client)."""
    import boto3
    import logging
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = _moto_server()
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    try:
        # moto keeps its buckets per process, not per server: without a reset, an earlier test's
        # objects (another module's shards under the same prefix) would be listed by this one
        import urllib.request
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", data=b"", method="POST"))
        with environment(AWS_ACCESS_KEY_ID="wdsftestkey", AWS_SECRET_ACCESS_KEY=SECRET, AWS_ENDPOINT_URL=endpoint,
                         AWS_DEFAULT_REGION="us-east-1", AWS_SHARED_CREDENTIALS_FILE=os.devnull,
                         AWS_CONFIG_FILE=os.devnull, AWS_EC2_METADATA_DISABLED="true"):
            client = boto3.client("s3", endpoint_url=endpoint)
            client.create_bucket(Bucket=BUCKET)
            yield endpoint, client
    finally:
        server.stop()
        _clear_fsspec_cache()


def _clear_fsspec_cache():
    """fsspec keeps one filesystem per options: a later server on another port needs a new one."""
    try:
        import s3fs
        s3fs.S3FileSystem.clear_instance_cache()
    except ImportError:
        pass


def three_shards(tmp_path_factory):
    """(folder, urls): three shards on disk (12, 9 and 7 samples), one with a corrupt image and one
    with a sample without caption: what the remote tests read from a bucket and compare locally."""
    from scorekit import make_shards
    folder = str(tmp_path_factory.mktemp("local"))
    urls, _ = make_shards(folder, [12, 9, 7], bad={1: (3,)}, no_caption={2: (4,)})
    return folder, urls


def files_under(folder: str, prefix: str) -> Iterator[Tuple[str, str]]:
    """(path, key) of every file of `folder`, recursively in name order; key: the file's path
    below `prefix`, as an upload to a bucket names it."""
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(root, name)
            yield path, f"{prefix}/{os.path.relpath(path, folder)}"


def upload(client, folder: str, prefix: str) -> List[str]:
    """Every file of `folder` (recursively, name order) under s3://BUCKET/prefix/; their URLs."""
    urls = []
    for path, key in files_under(folder, prefix):
        client.upload_file(path, BUCKET, key)
        urls.append(f"s3://{BUCKET}/{key}")
    return urls


class FaultServer(LoopbackServer):
    """A web server of objects (`put`), each GET answered by the next fault queued for its path
    (`fail`), or served whole. Faults: ("reset", offset): the body breaks off with a TCP reset at
    that absolute byte; ("short", offset): the connection closes cleanly there, short of the
    announced length; ("status", code, retry_after): an error answer; ("stall", offset): the body
    stops there until the server stops; ("replace", data[, "same date"]): the object is replaced
    before this answer (its Last-Modified kept with "same date", as within one second); ("ok",):
    this GET is answered as asked (to place a later fault). `requests` records (method, path, Range header) of every request.

    How the server names a version, per object (`put`'s keywords), as real servers differ:
    etag "strong" (an MD5 of the content), "weak" (W/...) or None; modified: the Last-Modified
    date (seconds since the epoch; a replacement gets the time it happened), or None;
    preconditions: whether If-Match / If-Unmodified-Since are honoured (412) or ignored; denied:
    every request answered 403.
    How fast it sends (`pace`, every GET of the path until cleared): ("drip", seconds): one byte
    every `seconds`; ("trickle",): one byte, then (50 ms later) a reset; ("rate", bytes_per_second)."""

    def __init__(self):
        self.objects: Dict[str, bytes] = {}
        self.profiles: Dict[str, dict] = {}
        self.paces: Dict[str, tuple] = {}
        self.faults: Dict[str, List[tuple]] = {}
        self.requests: List[tuple] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_HEAD(self):  # noqa: N802 - the http.server API
                server._answer(self, head=True)

            def do_GET(self):  # noqa: N802
                server._answer(self, head=False)

        super().__init__(Handler)
        self.httpd.handle_error = lambda *args: None  # the faults break connections on purpose

    def __exit__(self, *exc):
        self.stopping.set()  # a stalled answer ends
        super().__exit__(*exc)

    def put(self, path: str, data: bytes, etag: Optional[str] = "strong", modified: Optional[float] = None,
            preconditions: bool = True, denied: bool = False) -> str:
        with self.lock:
            self.objects[path] = data
            self.profiles[path] = {"etag": etag, "modified": modified, "preconditions": preconditions,
                                   "denied": denied}
        return f"{self.url}/{path}"

    def fail(self, path: str, *faults: tuple) -> None:
        with self.lock:
            self.faults.setdefault(path, []).extend(faults)

    def pace(self, path: str, pace: Optional[tuple]) -> None:
        with self.lock:
            self.paces[path] = pace

    def gets(self, path: str) -> List[Optional[str]]:
        """The Range headers of the GETs of `path`, in order."""
        return [r for m, p, r in self.requests if m == "GET" and p == path]

    def _validators(self, path: str, data: bytes) -> Dict[str, str]:
        profile = self.profiles.get(path) or {"etag": "strong"}
        out = {}
        if profile["etag"]:
            digest = '"%s"' % hashlib.md5(data).hexdigest()
            out["ETag"] = digest if profile["etag"] == "strong" else "W/" + digest
        if profile.get("modified") is not None:
            out["Last-Modified"] = email.utils.formatdate(profile["modified"], usegmt=True)
        return out

    def _refused(self, h, path: str, validators: Dict[str, str]) -> bool:
        """An honest server's preconditions: 412 for a request tied to another version."""
        if not (self.profiles.get(path) or {"preconditions": True})["preconditions"]:
            return False
        match, since = h.headers.get("If-Match"), h.headers.get("If-Unmodified-Since")
        if match and match != validators.get("ETag"):
            return True
        modified = (self.profiles.get(path) or {}).get("modified")
        if since and modified is not None:
            return int(modified) > email.utils.parsedate_to_datetime(since).timestamp()
        return False

    def _answer(self, h, head: bool) -> None:
        path = h.path.lstrip("/")  # with its query: a presigned URL names its object with its signature
        rng = h.headers.get("Range")
        m = re.match(r"bytes=(\d+)-(\d*)", rng or "")
        with self.lock:
            self.requests.append(("HEAD" if head else "GET", path, rng))
            data = self.objects.get(path)
            fault = None if head else self._take_fault(path, m, len(data or b""))
            if fault and fault[0] == "replace":
                self.objects[path] = data = fault[1]
                keep_date = len(fault) > 2 and fault[2] == "same date"  # replaced within the same second
                if (self.profiles.get(path) or {}).get("modified") is not None and not keep_date:
                    self.profiles[path]["modified"] = time.time()
                fault = None
            if fault and fault[0] == "ok":
                fault = None
            pace = None if head else self.paces.get(path)
        if data is None:
            return self._status(h, 404)
        if (self.profiles.get(path) or {}).get("denied"):
            return self._status(h, 403)
        validators = self._validators(path, data)
        if fault and fault[0] == "status":
            return self._status(h, fault[1], fault[2] if len(fault) > 2 else None)
        if self._refused(h, path, validators):
            return self._status(h, 412)
        start, end = 0, len(data)
        if m:
            start, end = int(m.group(1)), min(len(data), int(m.group(2)) + 1 if m.group(2) else len(data))
        h.send_response(206 if m else 200)
        h.send_header("Content-Length", str(end - start))
        for name, value in validators.items():
            h.send_header(name, value)
        h.send_header("Accept-Ranges", "bytes")
        if m:
            h.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        h.end_headers()
        if head:
            return
        if pace is not None:
            return self._paced(h, data[start:end], pace)
        stop = fault[1] if fault else end
        try:
            h.wfile.write(data[start:stop])
            h.wfile.flush()
        except OSError:
            return
        if fault is None or stop == end:
            return
        if fault[0] == "stall":
            self.stopping.wait()
        self._break(h, reset=fault[0] == "reset")

    def _paced(self, h, body: bytes, pace: tuple) -> None:
        """The body sent at the pace asked for; a trickle sends one byte and resets."""
        step, wait = (max(1, int(pace[1] / 20)), 0.05) if pace[0] == "rate" else (1, pace[-1]) \
            if pace[0] == "drip" else (1, 0.0)
        try:
            for at in range(0, len(body), step):
                h.wfile.write(body[at:at + step])
                h.wfile.flush()
                if pace[0] == "trickle":  # the byte is read before the reset (which would drop it)
                    self.stopping.wait(0.05)
                    return self._break(h, reset=True)
                if self.stopping.wait(wait):
                    return self._break(h, reset=True)
        except OSError:
            return

    @staticmethod
    def _break(h, reset: bool) -> None:
        if reset:  # RST, not FIN: linger 0 then close
            h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        h.close_connection = True
        with contextlib.suppress(OSError):
            h.connection.shutdown(socket.SHUT_RDWR) if not reset else None
        with contextlib.suppress(OSError):
            h.connection.close()

    def _take_fault(self, path: str, m, size: int) -> Optional[tuple]:
        """The first fault queued for `path` that this GET meets: an answer fault (status, replace)
        meets any GET; a byte fault only a GET whose range holds its byte (reads run in parallel)."""
        queue = self.faults.get(path) or []
        start = int(m.group(1)) if m else 0
        end = min(size, int(m.group(2)) + 1) if m and m.group(2) else size
        for i, fault in enumerate(queue):
            if fault[0] in ("status", "replace", "ok") or start <= fault[1] < end:
                return queue.pop(i)
            break  # faults are met in order
        return None

    @staticmethod
    def _status(h, code: int, retry_after: Optional[str] = None) -> None:
        body = f"error {code}".encode() if h.command != "HEAD" else b""
        h.send_response(code)
        h.send_header("Content-Length", str(len(body)))
        if retry_after is not None:
            h.send_header("Retry-After", str(retry_after))
        h.end_headers()
        h.wfile.write(body)


def clear_http_cache():
    """fsspec caches one http filesystem (and its info) per options."""
    try:
        from fsspec.implementations.http import HTTPFileSystem
        HTTPFileSystem.clear_instance_cache()
    except ImportError:
        pass


class FailingProxy(LoopbackServer):
    """An HTTP proxy in front of an S3 API server that answers 500 to every request whose path and
    query contain `fail_when` (say "partNumber=2": the second part of each multipart upload), and
    forwards the rest unchanged. `url` is the endpoint to give the client."""

    def __init__(self, upstream: str, fail_when: str):
        import http.client
        import urllib.parse
        target = urllib.parse.urlsplit(upstream)
        proxy = self
        self.failed = 0

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _forward(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                if fail_when in self.path:
                    proxy.failed += 1
                    FaultServer._status(self, 500)
                    return
                conn = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length", "server", "date"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward  # noqa: N815

        super().__init__(Handler)


# -- an S3 server that enforces IAM ----------------------------------------------------------------
READ_POLICY = {"Version": "2012-10-17", "Statement": [
    {"Effect": "Allow", "Action": ["s3:ListBucket", "s3:GetBucketLocation"], "Resource": f"arn:aws:s3:::{BUCKET}"},
    {"Effect": "Allow", "Action": ["s3:GetObject"], "Resource": f"arn:aws:s3:::{BUCKET}/*"}]}


@contextlib.contextmanager
def iam_s3_server(folder: str, prefix: str = "shards"):
    """moto's S3 server in its own process (its access control is a process-wide setting) that
    enforces IAM: the files of `folder` uploaded under s3://BUCKET/prefix/ and two IAM users
    created while moto still lets every request through, then access control switched on
    (moto-api/reset-auth 0: INITIAL_NO_AUTH_ACTION_COUNT=0 from then on, so every request is
    checked against its signer's policies). Yields (endpoint, users): users["reader"] may list the
    bucket and read its objects, users["nobody"] has no policy at all; each is (key id, secret)."""
    import subprocess
    import sys
    import urllib.request
    import boto3
    code = ("import logging, sys, threading; logging.getLogger('werkzeug').setLevel(logging.ERROR)\n"
            "from moto.server import ThreadedMotoServer\n"
            "s = ThreadedMotoServer(ip_address='127.0.0.1', port=0, verbose=False); s.start()\n"
            "print(s.get_host_and_port()[1], flush=True); sys.stdin.read()\n")  # lives until its stdin closes
    env = {k: v for k, v in os.environ.items() if k != "INITIAL_NO_AUTH_ACTION_COUNT"}
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                            text=True)
    try:
        endpoint = f"http://127.0.0.1:{int(proc.stdout.readline())}"
        setup = {"endpoint_url": endpoint, "region_name": "us-east-1", "aws_access_key_id": "setup",
                 "aws_secret_access_key": "setup"}
        s3, iam = boto3.client("s3", **setup), boto3.client("iam", **setup)
        s3.create_bucket(Bucket=BUCKET)
        upload(s3, folder, prefix)
        users = {}
        for user in ("reader", "nobody"):
            iam.create_user(UserName=user)
            if user == "reader":
                iam.put_user_policy(UserName=user, PolicyName="read", PolicyDocument=json.dumps(READ_POLICY))
            key = iam.create_access_key(UserName=user)["AccessKey"]
            users[user] = (key["AccessKeyId"], key["SecretAccessKey"])
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset-auth", data=b"0", method="POST",
                                                      headers={"Content-Type": "text/plain"}))
        yield endpoint, users
    finally:
        proc.stdin.close()
        proc.terminate()
        proc.wait(timeout=30)
        _clear_fsspec_cache()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (a torch.distributed rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
