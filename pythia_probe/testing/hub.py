"""A loopback Hugging Face hub for tests: the parts of the protocol huggingface_hub 2.x uses.

Serves ``root/ORG/NAME/<branch>/<files>`` (see :mod:`pythia_probe.testing.repos`), each branch a
commit whose sha is derived from the branch name and file contents:

- ``GET /api/models/{repo}[/revision/{rev}]`` (model_info; ``?blobs=True`` adds sizes + LFS)
- ``GET /api/models/{repo}/refs`` (list_repo_refs), ``GET /api/models/{repo}/tree/{rev}``
  (list_repo_tree), ``POST /api/models/{repo}/paths-info/{rev}`` (get_paths_info)
- ``HEAD|GET /{repo}/resolve/{rev}/{file}``: small files answered directly (ETag = git blob id);
  LFS files (.bin, .safetensors) redirected with 302 to a "CDN" on another origin (``localhost``
  instead of ``127.0.0.1``) with ``X-Repo-Commit``, ``X-Linked-Etag`` (sha256), ``X-Linked-Size``.
- ``HEAD|GET /cdn/{repo}/{commit}/{file}`` with ``Range: bytes=N-`` (206) support.

Faults (:class:`Fault`), consumed in order per request: ``drop`` (close the connection after
``after_bytes``), ``500``, ``429`` (with ``Retry-After``), ``slow`` (``bandwidth`` bytes/s),
``corrupt`` (flip a byte in the body). ``HubServer.bandwidth`` throttles every data transfer.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit

LFS_SUFFIXES = (".bin", ".safetensors", ".pt")
CHUNK = 64 * 1024


@dataclass
class Fault:
    """One injected fault. ``on``: "data" (file bytes), "head" (resolve HEAD), "api", or "any"."""

    kind: str  # "drop" | "500" | "429" | "slow" | "corrupt"
    match: str = "*"  # fnmatch on the file name (data/head) or the API path
    on: str = "data"
    times: int = 1  # how many requests it hits; -1 = forever
    after_bytes: int | None = None  # drop: bytes sent first (default half the body)
    retry_after: int = 0
    bandwidth: float = 1e6

    def __post_init__(self):
        if self.kind not in ("drop", "500", "429", "slow", "corrupt"):
            raise ValueError(f"unknown fault kind {self.kind!r}")
        if self.on not in ("data", "head", "api", "any"):
            raise ValueError(f"fault 'on' must be data, head, api or any; got {self.on!r}")


@dataclass(frozen=True)
class FileEntry:
    path: str
    size: int
    sha256: str
    git_oid: str
    abspath: Path

    @property
    def lfs(self) -> bool:
        return self.path.endswith(LFS_SUFFIXES)

    def tree_json(self) -> dict:
        d = {"type": "file", "oid": self.git_oid, "size": self.size, "path": self.path}
        if self.lfs:
            d["lfs"] = {"oid": self.sha256, "size": self.size, "pointerSize": 134}
        return d


def _hashes(path: Path) -> tuple[str, str]:
    data = path.read_bytes()
    git = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    return hashlib.sha256(data).hexdigest(), git


class RepoStore:
    """Branch folders on disk -> commits and file entries (hashes cached by mtime and size)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._cache: dict[tuple, tuple[str, str]] = {}
        self._lock = threading.Lock()

    def branches(self, repo: str) -> dict[str, Path]:
        d = self.root / repo
        return {p.name: p for p in sorted(d.iterdir()) if p.is_dir()} if d.is_dir() else {}

    def files(self, folder: Path) -> list[FileEntry]:
        out = []
        for p in sorted(folder.iterdir()):
            st = p.stat()
            key = (str(p), st.st_mtime_ns, st.st_size)
            with self._lock:
                if key not in self._cache:
                    self._cache[key] = _hashes(p)
                sha, git = self._cache[key]
            out.append(FileEntry(p.name, st.st_size, sha, git, p))
        return out

    def commit(self, repo: str, branch: str) -> str:
        files = self.files(self.branches(repo)[branch])
        text = branch + "".join(f"{f.path}:{f.git_oid}" for f in files)
        return hashlib.sha1(text.encode()).hexdigest()

    def resolve(self, repo: str, rev: str) -> tuple[str, Path] | None:
        """A branch name or a commit sha -> (commit, folder)."""
        for name, folder in self.branches(repo).items():
            if rev in (name, self.commit(repo, name)):
                return self.commit(repo, name), folder
        return None


class HubServer:
    """ThreadingHTTPServer on 127.0.0.1:0 serving a :class:`RepoStore`; use as a context manager."""

    def __init__(self, root: Path, cdn_host: str = "localhost", port: int = 0):
        self.store = RepoStore(root)
        self.faults: list[Fault] = []
        self.bandwidth: float | None = None  # bytes/s for every data transfer
        self.log: list[dict] = []
        self.bytes_sent = 0
        self.cdn_host = cdn_host
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", port), _make_handler(self))
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> HubServer:
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def add_fault(self, *faults: Fault) -> None:
        with self._lock:
            self.faults.extend(faults)

    def take_fault(self, on: str, name: str) -> Fault | None:
        """The first live fault matching this request (its count is consumed)."""
        with self._lock:
            for f in self.faults:
                if f.times != 0 and f.on in (on, "any") and fnmatch.fnmatch(name, f.match):
                    f.times -= 1 if f.times > 0 else 0
                    return f
        return None

    def requests(self, method: str | None = None, contains: str = "") -> list[dict]:
        return [r for r in self.log if (method in (None, r["method"])) and contains in r["path"]]


def _make_handler(hub: HubServer):
    class Handler(_Handler):
        pass

    Handler.hub = hub
    return Handler


class _Handler(BaseHTTPRequestHandler):
    hub: HubServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_HEAD(self) -> None:
        self._route("HEAD")

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    # -- plumbing ------------------------------------------------------------------------------
    def _route(self, method: str) -> None:
        url = urlsplit(self.path)
        parts = [unquote(p) for p in url.path.strip("/").split("/")]
        self.query = parse_qs(url.query)
        rng = self.headers.get("Range")
        self.hub.log.append({"method": method, "path": url.path, "range": rng, "t": time.time()})
        try:
            if parts[0] == "api" and len(parts) >= 4 and parts[1] == "models":
                return self._api(method, "/".join(parts[2:4]), parts[4:], url.path)
            if parts[0] == "cdn" and len(parts) == 5:
                return self._cdn(method, "/".join(parts[1:3]), parts[3], parts[4])
            if len(parts) == 5 and parts[2] == "resolve":
                return self._resolve(method, "/".join(parts[:2]), parts[3], parts[4])
            self._error(404, "RepoNotFound", f"no route for {url.path}")
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _send(self, status: int, headers: dict, body: bytes = b"", method: str = "GET") -> None:
        self.send_response(status)
        for k, v in {"Content-Length": str(len(body)), **headers}.items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)

    def _json(self, obj, headers: dict | None = None) -> None:
        h = {"Content-Type": "application/json", **(headers or {})}
        self._send(200, h, json.dumps(obj).encode())

    def _error(self, status: int, code: str | None, msg: str, headers: dict | None = None) -> None:
        h = {"X-Error-Message": msg, **({"X-Error-Code": code} if code else {}), **(headers or {})}
        h["Content-Type"] = "application/json"
        self._send(status, h, json.dumps({"error": msg}).encode())

    def _fault_status(self, on: str, name: str) -> tuple[bool, Fault | None]:
        """Answer 500/429 faults here (returns answered=True); body faults go back to the caller."""
        f = self.hub.take_fault(on, name)
        if f is not None and f.kind == "500":
            self._error(500, None, "injected internal error")
        elif f is not None and f.kind == "429":
            self._error(429, None, "injected rate limit", {"Retry-After": str(f.retry_after)})
        else:
            return False, f
        return True, f

    # -- API ------------------------------------------------------------------------------------
    def _api(self, method: str, repo: str, rest: list[str], path: str) -> None:
        if self._fault_status("api", path)[0]:
            return
        branches = self.hub.store.branches(repo)
        if not branches:
            return self._error(404, "RepoNotFound", f"Repository {repo} not found")
        if rest == ["refs"]:
            return self._json(self._refs(repo, branches))
        rev = rest[1] if len(rest) >= 2 else "main"
        resolved = self.hub.store.resolve(repo, rev)
        if resolved is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        commit, folder = resolved
        files = self.hub.store.files(folder)
        if not rest or rest[0] == "revision":
            return self._json(self._info(repo, commit, files))
        if rest[0] == "tree":
            return self._json([f.tree_json() for f in files])
        if rest[0] == "paths-info" and method == "POST":
            wanted = self._posted_paths()
            return self._json([f.tree_json() for f in files if f.path in wanted])
        self._error(404, None, f"unknown api route {path}")

    def _refs(self, repo: str, branches: dict) -> dict:
        commit = self.hub.store.commit
        heads = [{"name": b, "ref": f"refs/heads/{b}", "targetCommit": commit(repo, b)}
                 for b in branches]
        return {"branches": heads, "converts": [], "tags": []}

    def _info(self, repo: str, commit: str, files: list[FileEntry]) -> dict:
        blobs = self.query.get("blobs", ["false"])[0].lower() == "true"
        sib = []
        for f in files:
            s = {"rfilename": f.path}
            if blobs:
                s.update(size=f.size, blobId=f.git_oid)
                if f.lfs:
                    s["lfs"] = {"size": f.size, "sha256": f.sha256, "pointerSize": 134}
            sib.append(s)
        return {"id": repo, "modelId": repo, "sha": commit, "private": False, "siblings": sib}

    def _posted_paths(self) -> set[str]:
        n = int(self.headers.get("Content-Length") or 0)
        return set(parse_qs(self.rfile.read(n).decode()).get("paths", []))

    # -- files ----------------------------------------------------------------------------------
    def _lookup(self, repo: str, rev: str, name: str) -> tuple[str, FileEntry] | None:
        resolved = self.hub.store.resolve(repo, rev)
        if resolved is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
            return None
        commit, folder = resolved
        entry = next((f for f in self.hub.store.files(folder) if f.path == name), None)
        if entry is None:
            self._error(404, "EntryNotFound", f"{name} not found", {"X-Repo-Commit": commit})
            return None
        return commit, entry

    def _resolve(self, method: str, repo: str, rev: str, name: str) -> None:
        if method == "HEAD":
            if self._fault_status("head", name)[0]:
                return
        found = self._lookup(repo, rev, name)
        if found is None:
            return
        commit, e = found
        h = {"X-Repo-Commit": commit, "ETag": f'"{e.git_oid}"'}
        if not e.lfs:
            return self._body(method, e, h, name)
        cdn = f"http://{self.hub.cdn_host}:{self.hub.port}/cdn/{repo}/{commit}/{quote(name)}"
        h.update({"Location": cdn, "X-Linked-Etag": f'"{e.sha256}"', "X-Linked-Size": str(e.size)})
        self._send(302, h, b"", method)

    def _cdn(self, method: str, repo: str, commit: str, name: str) -> None:
        found = self._lookup(repo, commit, name)
        if found is not None:
            self._body(method, found[1], {"ETag": f'"{found[1].sha256}"'}, name)

    def _body(self, method: str, e: FileEntry, headers: dict, name: str) -> None:
        fault = None
        if method == "GET":
            answered, fault = self._fault_status("data", name)
            if answered:
                return
        data = e.abspath.read_bytes()
        start = _range_start(self.headers.get("Range"))
        status, body = (206, data[start:]) if start else (200, data)
        headers = {**headers, "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
        if start:
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        if method == "HEAD":
            return self._send(200, {**headers, "Content-Length": str(e.size)}, b"", "HEAD")
        self.send_response(status)
        for k, v in {**headers, "Content-Length": str(len(body))}.items():
            self.send_header(k, v)
        self.end_headers()
        self._stream(body, fault)

    def _stream(self, body: bytes, fault: Fault | None) -> None:
        if fault is not None and fault.kind == "corrupt":
            i = len(body) // 2
            body = body[:i] + bytes([body[i] ^ 0xFF]) + body[i + 1 :]
        stop = len(body)
        if fault is not None and fault.kind == "drop":
            stop = fault.after_bytes if fault.after_bytes is not None else len(body) // 2
        bw = fault.bandwidth if fault is not None and fault.kind == "slow" else self.hub.bandwidth
        t0, sent = time.monotonic(), 0
        while sent < stop:
            chunk = body[sent : min(sent + CHUNK, stop)]
            self.wfile.write(chunk)
            sent += len(chunk)
            with self.hub._lock:
                self.hub.bytes_sent += len(chunk)
            if bw:
                time.sleep(max(0.0, t0 + sent / bw - time.monotonic()))
        if stop < len(body):
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)


def _range_start(header: str | None) -> int:
    if not header or not header.startswith("bytes="):
        return 0
    first = header[len("bytes=") :].split(",")[0]
    return int(first.split("-")[0] or 0)


def main(argv: list[str] | None = None) -> int:
    """Serve a folder of repos until killed: ``python -m pythia_probe.testing.hub ROOT``."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("root", type=Path, help="folder holding ORG/NAME/<branch>/ files")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--bandwidth", type=float, default=None, help="bytes/s per transfer")
    args = ap.parse_args(argv)
    hub = HubServer(args.root, port=args.port)
    hub.bandwidth = args.bandwidth
    print(hub.endpoint, flush=True)
    hub._httpd.serve_forever(0.05)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
