"""A Hugging Face Hub on 127.0.0.1 for the hf:// tests: the few HTTP endpoints huggingface_hub's
HfFileSystem uses to list and read a dataset repo, served from files in memory (no Hub server
installs from the registries). No test helper here: test files import these.

Served (huggingface_hub 2.x, hf_api.py / hf_file_system.py):
* `GET /api/datasets/{repo}[/revision/{rev}]`: the repo's info (`repo_info`, resolving a path);
* `GET /api/datasets/{repo}/tree/{rev}[/{path}]?recursive=..`: the listing (`list_repo_tree`);
* `POST /api/datasets/{repo}/paths-info/{rev}`: the info of named paths (`get_paths_info`);
* `GET|HEAD /datasets/{repo}/resolve/{rev}/{path}`: the bytes, with Range (`HfFileSystemFile`).
And `GET /api/agent-harnesses` (the registry huggingface_hub's user-agent code asks the endpoint for
once a process), answered with an empty one. Anything else is answered 404 and recorded in
`unknown`. Every repo request's Authorization header is recorded in `auth`; with `token` set, a
request without `Bearer <token>` is answered 401."""
from __future__ import annotations

import hashlib
import http.server
import json
import re
import threading
import urllib.parse
from typing import Dict, List, Optional

from remotekit import LoopbackServer, environment

SHA = "0123456789abcdef0123456789abcdef01234567"  # the one revision's commit


class HubServer(LoopbackServer):
    def __init__(self, token: Optional[str] = None):
        self.repos: Dict[str, Dict[str, bytes]] = {}  # "org/name" -> path in repo -> bytes
        self.token = token
        self.auth: List[Optional[str]] = []
        self.unknown: List[str] = []
        self.requests: List[tuple] = []  # (method, path, Range header)
        self.lock = threading.Lock()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):  # noqa: N802 - the http.server API
                server._answer(self)

            do_HEAD = do_POST = do_GET  # noqa: N815

        super().__init__(Handler)

    def put(self, repo: str, path: str, data: bytes) -> str:
        with self.lock:
            self.repos.setdefault(repo, {})[path] = data
        return f"hf://datasets/{repo}/{path}"

    # -- answers ------------------------------------------------------------------------------
    def _answer(self, h) -> None:
        split = urllib.parse.urlsplit(h.path)
        path, query = urllib.parse.unquote(split.path), urllib.parse.parse_qs(split.query)
        body = h.rfile.read(int(h.headers.get("Content-Length") or 0)) if h.command == "POST" else b""
        if path == "/api/agent-harnesses":  # huggingface_hub's user-agent registry, asked once a process: none
            return self._json(h, {"standardEnvVars": [], "harnesses": {}})
        with self.lock:
            self.auth.append(h.headers.get("Authorization"))
            self.requests.append((h.command, path, h.headers.get("Range")))
        if self.token and h.headers.get("Authorization") != f"Bearer {self.token}":
            return self._json(h, {"error": "Invalid credentials in Authorization header"}, 401)
        m = re.fullmatch(r"/api/datasets/([^/]+/[^/]+)(?:/revision/([^/]+))?", path)
        if m:
            return self._repo_info(h, m.group(1))
        m = re.fullmatch(r"/api/datasets/([^/]+/[^/]+)/tree/([^/]+)(?:/(.*))?", path)
        if m:
            return self._tree(h, m.group(1), (m.group(3) or "").strip("/"), query.get("recursive") == ["true"])
        m = re.fullmatch(r"/api/datasets/([^/]+/[^/]+)/paths-info/([^/]+)", path)
        if m:
            return self._paths_info(h, m.group(1), body)
        m = re.fullmatch(r"/datasets/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if m:
            return self._resolve(h, m.group(1), m.group(3))
        with self.lock:
            self.unknown.append(f"{h.command} {h.path}")
        return self._json(h, {"error": "not served here"}, 404)

    def _files(self, h, repo: str) -> Optional[Dict[str, bytes]]:
        with self.lock:
            files = dict(self.repos.get(repo) or {})
        if repo not in self.repos:
            # what the Hub says for a missing (or private, unauthorized) repo
            self._json(h, {"error": "Repository not found"}, 404, {"X-Error-Code": "RepoNotFound"})
            return None
        return files

    def _repo_info(self, h, repo: str) -> None:
        files = self._files(h, repo)
        if files is not None:
            self._json(h, {"id": repo, "sha": SHA, "private": False,
                           "siblings": [{"rfilename": p} for p in sorted(files)]})

    @staticmethod
    def _entry(path: str, data: Optional[bytes]) -> dict:
        if data is None:
            return {"type": "directory", "oid": hashlib.sha1(path.encode()).hexdigest(), "path": path}
        return {"type": "file", "oid": hashlib.sha1(data).hexdigest(), "size": len(data), "path": path}

    def _tree(self, h, repo: str, under: str, recursive: bool) -> None:
        files = self._files(h, repo)
        if files is None:
            return
        prefix = under + "/" if under else ""
        entries, dirs = [], set()
        for path in sorted(files):
            if not path.startswith(prefix):
                continue
            parts = path[len(prefix):].split("/")
            for i in range(1, len(parts)):  # the folders on the way
                folder = prefix + "/".join(parts[:i])
                if (recursive or i == 1) and folder not in dirs:
                    dirs.add(folder)
                    entries.append(self._entry(folder, None))
            if recursive or len(parts) == 1:
                entries.append(self._entry(path, files[path]))
        if not entries and under and under not in files:
            return self._json(h, {"error": f"{under} does not exist"}, 404, {"X-Error-Code": "EntryNotFound"})
        self._json(h, entries)

    def _paths_info(self, h, repo: str, body: bytes) -> None:
        files = self._files(h, repo)
        if files is None:
            return
        ctype = h.headers.get("Content-Type", "")
        if "json" in ctype:
            paths = json.loads(body or b"{}").get("paths") or []
        else:
            paths = urllib.parse.parse_qs(body.decode()).get("paths") or []
        out = []
        for p in paths:
            p = p.strip("/")
            if p in files:
                out.append(self._entry(p, files[p]))
            elif any(f.startswith(p + "/") for f in files):
                out.append(self._entry(p, None))
        self._json(h, out)

    def _resolve(self, h, repo: str, path: str) -> None:
        files = self._files(h, repo)
        if files is None:
            return
        data = files.get(path)
        if data is None:
            return self._json(h, {"error": "Entry not found"}, 404, {"X-Error-Code": "EntryNotFound"})
        etag = '"%s"' % hashlib.sha1(data).hexdigest()
        m = re.match(r"bytes=(\d+)-(\d*)", h.headers.get("Range") or "")
        start, end = (int(m.group(1)), min(len(data), int(m.group(2)) + 1 if m.group(2) else len(data))) if m \
            else (0, len(data))
        h.send_response(206 if m else 200)
        h.send_header("Content-Length", str(end - start))
        h.send_header("ETag", etag)
        h.send_header("X-Repo-Commit", SHA)
        h.send_header("Accept-Ranges", "bytes")
        if m:
            h.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(data[start:end])

    @staticmethod
    def _json(h, obj, status: int = 200, headers: Optional[dict] = None) -> None:
        data = json.dumps(obj).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(data)


def hub_endpoint(url: str, **more: Optional[str]):
    """HF_ENDPOINT pointed at `url` for the block (and the variables in `more` set, None: unset),
    as a user of a mirror sets it. huggingface_hub itself reads the variable only when first
    imported (often before a test runs: open_clip imports it); wdsfilter reads it whenever it makes
    a filesystem, which is what is tested. Its constant is left alone: huggingface_hub builds
    resolve URLs from a template made at import."""
    return environment(HF_ENDPOINT=url, **more)


def clear_hf_cache() -> None:
    """HfFileSystem keeps one instance (and its listings) per options and thread."""
    from huggingface_hub import HfFileSystem
    HfFileSystem.clear_instance_cache()
