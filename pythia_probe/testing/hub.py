"""A loopback Hugging Face hub for tests: the parts of the protocol huggingface_hub 2.x uses.

Serves model repos ``root/ORG/NAME/<branch>/<files>`` and dataset repos
``root/datasets/ORG/NAME/<branch>/<files, sub-folders allowed>`` (see
:mod:`pythia_probe.testing.store` and :mod:`pythia_probe.testing.repos`), each branch a commit
whose sha is derived from the branch name and file contents. ``{type}`` is ``models`` or
``datasets``:

- ``GET /api/{type}/{repo}[/revision/{rev}]`` (model_info / dataset_info / repo_info;
  ``?blobs=True`` adds sizes + LFS), ``GET /api/{type}/{repo}/refs`` (list_repo_refs)
- ``GET /api/{type}/{repo}/tree/{rev}[/{folder}][?recursive=true]`` (list_repo_tree,
  list_repo_files, HfFileSystem.ls/glob/find), ``POST /api/{type}/{repo}/paths-info/{rev}``
  (get_paths_info, HfFileSystem.info): files and folders
- ``HEAD|GET /{repo}/resolve/{rev}/{path}`` (models), ``/datasets/{repo}/resolve/{rev}/{path}``
  (datasets): small files answered directly (ETag = git blob id); LFS files (.bin, .safetensors,
  .parquet) redirected with 302 to a "CDN" on another origin (``localhost`` instead of
  ``127.0.0.1``, or ``cdn_url``: another server) with ``X-Repo-Commit``, ``X-Linked-Etag``
  (sha256), ``X-Linked-Size``.
- ``HEAD|GET /cdn/[datasets/]{repo}/{commit}/{path}``; ``Range: bytes=a-b`` / ``a-`` / ``-n``
  answered with 206 (resolve URLs of small files too), as HfFileSystem's block reads need.

Faults (:class:`~pythia_probe.testing.faults.Fault`: errors, drops, slow, corrupt and
oversized bodies, stalls, redirects to another server, redirect loops) and lying metadata
(:class:`~pythia_probe.testing.faults.Tamper`, ``hub.tamper(field, value, match)``) are
described in :mod:`pythia_probe.testing.faults`; ``HubServer.hits`` lists the faults taken, one
per request they answered (tests count tries with it). ``HubServer.bandwidth`` throttles every data
transfer; ``HubServer.log`` records each request (method, path, Range, Authorization header).
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit

from pythia_probe.testing.faults import ANSWERING_KINDS, Fault, Tamper
from pythia_probe.testing.store import (  # noqa: F401 - FileEntry, RepoStore re-exported
    LFS_SUFFIXES,
    FileEntry,
    RepoStore,
    folder_json,
    folders_of,
)

CHUNK = 64 * 1024


class HubServer:
    """ThreadingHTTPServer on 127.0.0.1:0 serving a :class:`RepoStore`; use as a context manager."""

    def __init__(self, root: Path, cdn_host: str = "localhost", port: int = 0,
                 cdn_url: str | None = None):
        self.store = RepoStore(root)
        self.cdn_url = cdn_url  # LFS redirects go here (default: this server as cdn_host)
        self.stopping = threading.Event()
        self.faults: list[Fault] = []
        self.hits: list[Fault] = []  # every fault taken, in order (a fault once per request)
        self.tampers: list[Tamper] = []
        self.bandwidth: float | None = None  # bytes/s for every data transfer
        self.log: list[dict] = []
        self.phantom_branches: list[str] = []  # listed by refs only: every other answer is 404
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
        self.stopping.set()  # stalled requests end
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def add_fault(self, *faults: Fault) -> None:
        with self._lock:
            self.faults.extend(faults)

    def tamper(self, field: str, value: object, match: str = "*", branch: str = "*") -> None:
        """From now on, report ``field`` of files matching ``match`` (on branches matching
        ``branch``) as ``value``."""
        with self._lock:
            self.tampers.append(Tamper(field, value, match, branch))

    def lie(self, field: str, path: str, truth: object, branch: str = "") -> object:
        """What the hub says for ``field`` of ``path`` on ``branch`` (the truth unless
        tampered)."""
        for t in self.tampers:
            if t.field == field and fnmatch.fnmatch(branch, t.branch) and (
                    field in ("commit", "repo-commit") or fnmatch.fnmatch(path, t.match)):
                return t.value
        return truth

    def entry_json(self, f: FileEntry, branch: str = "") -> dict:
        """A tree / paths-info entry of ``branch``, tampered as asked."""
        d = f.tree_json()
        d["oid"] = self.lie("oid", f.path, d["oid"], branch)
        d["size"] = self.lie("size", f.path, d["size"], branch)
        if "lfs" in d:
            d["lfs"] = {**d["lfs"], "oid": self.lie("sha256", f.path, d["lfs"]["oid"], branch),
                        "size": d["size"]}
        d["path"] = self.lie("path", f.path, d["path"], branch)
        return d

    def take_fault(self, on: str, name: str) -> Fault | None:
        """The first live fault matching this request (its count is consumed)."""
        with self._lock:
            for f in self.faults:
                if f.times != 0 and f.on in (on, "any") and fnmatch.fnmatch(name, f.match):
                    f.times -= 1 if f.times > 0 else 0
                    self.hits.append(f)
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
        n = int(self.headers.get("Content-Length") or 0)
        self.body = self.rfile.read(n) if method == "POST" and n else b""  # even if a fault answers
        self.hub.log.append({"method": method, "path": url.path, "range": rng, "t": time.time(),
                             "auth": self.headers.get("Authorization")})
        route = _parse_route(parts)
        try:
            if route is None:
                return self._error(404, "RepoNotFound", f"no route for {url.path}")
            kind, rtype, repo, rest = route
            if kind == "api":
                return self._api(method, rtype, repo, rest, url.path)
            if len(rest) < 2:
                return self._error(404, "EntryNotFound", f"no file named in {url.path}")
            fn = self._cdn if kind == "cdn" else self._resolve
            return fn(method, rtype, repo, rest[0], "/".join(rest[1:]))
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
        """Answer error, stall and redirect faults here (returns answered=True); body faults go
        back to the caller."""
        f = self.hub.take_fault(on, name)
        if f is None or f.kind not in ANSWERING_KINDS:
            return False, f
        if f.kind == "500":
            self._error(500, None, "injected internal error")
        elif f.kind == "429":
            self._error(429, None, "injected rate limit", {"Retry-After": str(f.retry_after)})
        elif f.kind == "stall":
            self.hub.stopping.wait(f.stall_s)
            self.close_connection = True
        else:
            where = self.path if f.kind == "loop" else f.to.rstrip("/") + self.path
            self._send(302, {"Location": where})
        return True, f

    # -- API ------------------------------------------------------------------------------------
    def _api(self, method: str, rtype: str, repo: str, rest: list[str], path: str) -> None:
        if self._fault_status("api", path)[0]:
            return
        store = self.hub.store
        branches = store.branches(repo, rtype)
        if not branches:
            return self._error(404, "RepoNotFound", f"Repository {repo} not found")
        if rest == ["refs"]:
            return self._json(self._refs(rtype, repo, branches))
        rev = rest[1] if len(rest) >= 2 else "main"
        resolved = store.resolve(repo, rev, rtype)
        if resolved is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        commit, folder = resolved
        files = store.files(folder)
        if not rest or rest[0] == "revision":
            return self._json(self._info(rtype, repo, commit, files, folder.name))
        if rest[0] == "tree":
            return self._tree(files, "/".join(rest[2:]).strip("/"), commit, folder.name)
        if rest[0] == "paths-info" and method == "POST":
            wanted = self._posted_paths()
            found = [self.hub.entry_json(f, folder.name) for f in files if f.path in wanted]
            return self._json(found + [folder_json(d, files) for d in folders_of(files)
                                       if d in wanted])
        self._error(404, None, f"unknown api route {path}")

    def _tree(self, files: list[FileEntry], folder: str, commit: str, branch: str) -> None:
        """Children of ``folder`` ("" = the root); with ``?recursive=true`` all descendants."""
        recursive = self.query.get("recursive", ["false"])[0].lower() == "true"
        dirs = folders_of(files)
        if folder and folder not in dirs:
            return self._error(404, "EntryNotFound", f"{folder} does not exist at {commit}")
        prefix = folder + "/" if folder else ""

        def keep(p: str) -> bool:
            return p.startswith(prefix) and (recursive or "/" not in p[len(prefix):])

        out = [folder_json(d, files) for d in dirs if keep(d)]
        self._json(out + [self.hub.entry_json(f, branch) for f in files if keep(f.path)])

    def _refs(self, rtype: str, repo: str, branches: dict) -> dict:
        heads = [{"name": b, "ref": f"refs/heads/{b}", "targetCommit": self.hub.lie(
                  "commit", "", self.hub.store.commit(repo, b, rtype), b)} for b in branches]
        heads += [{"name": b, "ref": f"refs/heads/{b}",
                   "targetCommit": hashlib.sha1(b.encode()).hexdigest()}
                  for b in self.hub.phantom_branches]
        return {"branches": heads, "converts": [], "tags": []}

    def _info(self, rtype: str, repo: str, commit: str, files: list[FileEntry],
              branch: str) -> dict:
        blobs = self.query.get("blobs", ["false"])[0].lower() == "true"
        sib = []
        for f in files:
            s = {"rfilename": f.path}
            if blobs:
                e = self.hub.entry_json(f, branch)
                s.update(rfilename=e["path"], size=e["size"], blobId=e["oid"])
                if f.lfs:
                    s["lfs"] = {"size": e["size"], "sha256": e["lfs"]["oid"], "pointerSize": 134}
            sib.append(s)
        info = {"id": repo, "sha": self.hub.lie("commit", "", commit, branch), "private": False,
                "siblings": sib}
        return {**info, "modelId": repo} if rtype == "model" else info

    def _posted_paths(self) -> set[str]:
        return set(parse_qs(self.body.decode()).get("paths", []))

    # -- files ----------------------------------------------------------------------------------
    def _lookup(self, rtype: str, repo: str, rev: str,
                name: str) -> tuple[str, FileEntry, str] | None:
        """``(commit, the file, the branch)`` of ``name`` at ``rev``; None once a 404 is sent."""
        resolved = self.hub.store.resolve(repo, rev, rtype)
        if resolved is None:
            code = "RevisionNotFound" if self.hub.store.branches(repo, rtype) else "RepoNotFound"
            self._error(404, code, f"Invalid rev id: {rev}")
            return None
        commit, folder = resolved
        entry = next((f for f in self.hub.store.files(folder) if f.path == name), None)
        if entry is None:
            self._error(404, "EntryNotFound", f"{name} not found", {"X-Repo-Commit": commit})
            return None
        return commit, entry, folder.name

    def _resolve(self, method: str, rtype: str, repo: str, rev: str, name: str) -> None:
        if method == "HEAD":
            if self._fault_status("head", name)[0]:
                return
        found = self._lookup(rtype, repo, rev, name)
        if found is None:
            return
        commit, e, branch = found
        lie = self.hub.lie
        h = {"X-Repo-Commit": str(lie("repo-commit", name, commit, branch)),
             "ETag": f'"{lie("etag", name, e.git_oid, branch)}"'}
        if not e.lfs:
            return self._body(method, e, h, name)
        kind = "datasets/" if rtype == "dataset" else ""
        base = self.hub.cdn_url or f"http://{self.hub.cdn_host}:{self.hub.port}"
        cdn = f"{base.rstrip('/')}/cdn/{kind}{repo}/{commit}/{quote(name)}"
        h.update({"Location": cdn, "X-Linked-Etag": f'"{lie("etag", name, e.sha256, branch)}"',
                  "X-Linked-Size": str(e.size)})
        self._send(302, h, b"", method)

    def _cdn(self, method: str, rtype: str, repo: str, commit: str, name: str) -> None:
        found = self._lookup(rtype, repo, commit, name)
        if found is not None:
            self._body(method, found[1], {"ETag": f'"{found[1].sha256}"'}, name)

    def _body(self, method: str, e: FileEntry, headers: dict, name: str) -> None:
        fault = None
        if method == "GET":
            answered, fault = self._fault_status("data", name)
            if answered:
                return
        data = e.abspath.read_bytes()
        headers = {**headers, "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
        if method == "HEAD":
            return self._send(200, {**headers, "Content-Length": str(e.size)}, b"", "HEAD")
        status, body = 200, data
        rng = _parse_range(self.headers.get("Range"), len(data))
        if rng == (-1, -1):
            msg = f"range {self.headers.get('Range')} outside 0-{len(data)}"
            return self._error(416, None, msg, {"Content-Range": f"bytes */{len(data)}"})
        if rng is not None:
            status, body = 206, data[rng[0] : rng[1] + 1]
            headers["Content-Range"] = f"bytes {rng[0]}-{rng[1]}/{len(data)}"
        extra = fault.extra_bytes if fault is not None and fault.kind == "oversize" else 0
        length = {"Content-Length": str(len(body) + extra)}
        if extra and not fault.announce:  # no length: the body ends when the connection does
            length, self.close_connection = {"Connection": "close"}, True
        self.send_response(status)
        for k, v in {**headers, **length}.items():
            self.send_header(k, v)
        self.end_headers()
        self._stream(body, fault)
        for start in range(0, extra, CHUNK):
            n = min(CHUNK, extra - start)
            self.wfile.write(bytes(n))
            with self.hub._lock:
                self.hub.bytes_sent += n

    def _stream(self, body: bytes, fault: Fault | None) -> None:
        if fault is not None and fault.kind == "corrupt":
            i = len(body) // 2 if fault.at_byte is None else min(fault.at_byte, len(body) - 1)
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


def _parse_route(parts: list[str]) -> tuple[str, str, str, list[str]] | None:
    """``(kind, repo_type, repo, rest)``: kind "api" (rest after the repo id), "resolve"
    (rest = [rev, *path]) or "cdn" (rest = [commit, *path]); None for an unknown route."""
    n = len(parts)
    if n >= 4 and parts[0] == "api" and parts[1] in ("models", "datasets"):
        return "api", parts[1][:-1], "/".join(parts[2:4]), parts[4:]
    if n >= 6 and parts[0] == "cdn" and parts[1] == "datasets":
        return "cdn", "dataset", "/".join(parts[2:4]), parts[4:]
    if n >= 5 and parts[0] == "cdn":
        return "cdn", "model", "/".join(parts[1:3]), parts[3:]
    if n >= 6 and parts[0] == "datasets" and parts[3] == "resolve":
        return "resolve", "dataset", "/".join(parts[1:3]), parts[4:]
    if n >= 5 and parts[2] == "resolve":
        return "resolve", "model", "/".join(parts[:2]), parts[3:]
    return None


def _parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """``Range: bytes=a-b | a- | -n`` -> inclusive ``(first, last)``; None = whole body;
    ``(-1, -1)`` = unsatisfiable (416). Only the first range of a list is honoured."""
    if not header or not header.startswith("bytes="):
        return None
    first, _, last = header[len("bytes=") :].split(",")[0].strip().partition("-")
    if not first:  # suffix range: the last n bytes
        n = int(last or 0)
        return (max(0, size - n), size - 1) if n > 0 and size > 0 else (-1, -1)
    start = int(first)
    end = min(int(last), size - 1) if last else size - 1
    return (start, end) if start <= end else (-1, -1)


def main(argv: list[str] | None = None) -> int:
    """Serve a folder of repos until killed: ``python -m pythia_probe.testing.hub ROOT``."""

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("root", type=Path, help="folder holding ORG/NAME/<branch>/ model repos and "
                    "datasets/ORG/NAME/<branch>/ dataset repos")
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
