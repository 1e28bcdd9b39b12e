"""The tool's view of a Hugging Face hub cache folder: where a file's bytes are, which files this
tool created (a ledger), who is still using a blob (leases), and deletes confined to what the
tool created.

Layout: huggingface_hub's own, so its tools (``scan_cache_dir``, ``HF_HUB_OFFLINE``) read it::

    cache_dir/models--ORG--NAME/refs/<branch>              commit id
    cache_dir/models--ORG--NAME/snapshots/<commit>/<file>  symlink to ../../blobs/<hash>, or
                                                           the file itself (no symlinks)
    cache_dir/models--ORG--NAME/blobs/<hash>[.partial]     bytes; sha256 (LFS) or git blob id
    cache_dir/.locks/pythia_probe/models--ORG--NAME/       this tool's bookkeeping:
        owned/<path in the repo folder>.owned   ledger: what the tool created
        leases/<hash>/<host>-<pid>-<nonce>      sources (any process) now using a blob
        locks/<hash>.lock                       one fetcher or evicter of a blob at a time
        locks/snapshot-<commit>.lock            one creator or remover of a snapshot folder
        trees/<commit>.json                     the hub's sizes and hashes of fetched commits,
                                                so offline reads are verified too

Rules: a file is deleted only if the ledger says the tool created it, no other live source
holds a lease on its blob, and :func:`~pythia_probe.fileio.remove` finds it inside the repo
folder; a ref the tool did not write is never changed. ``.locks`` is the folder huggingface_hub
and ``scan_cache_dir`` keep for bookkeeping; deleting it only makes the tool keep files it would
otherwise have evicted. Every name used here was validated (:mod:`pythia_probe.hub.io`) first.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

from filelock import FileLock
from huggingface_hub import constants, scan_cache_dir, try_to_load_from_cache

from pythia_probe.errors import (
    CheckpointDiskError,
    CheckpointNotCachedError,
    CorruptCheckpointError,
    CorruptFileError,
    UnsafeFileError,
)
from pythia_probe.fileio import atomic_write, pid_alive, remove, write_json, write_text
from pythia_probe.hub.io import check_name, check_oid, partial_path
from pythia_probe.hub.weights import FileInfo

HOST = socket.gethostname()


class HubCache:
    """One repo's folder in a hub-layout cache, as this tool reads and writes it."""

    def __init__(self, cache_dir: str | os.PathLike, repo_id: str, repo_type: str = "model"):
        self.cache_dir, self.repo_id, self.repo_type = Path(cache_dir), repo_id, repo_type
        self.storage = self.cache_dir / f"{repo_type}s--{repo_id.replace('/', '--')}"
        self.state = self.cache_dir / ".locks" / "pythia_probe" / self.storage.name
        self.token = f"{HOST}-{os.getpid()}-{uuid.uuid4().hex[:8]}"

    # ---- paths ---------------------------------------------------------------------------------
    @property
    def roots(self) -> list[Path]:
        """The folders deletes are confined to."""
        return [self.storage, self.state]

    def blob(self, etag: str) -> Path:
        return self.storage / "blobs" / etag

    def pointer(self, commit: str, name: str) -> Path:
        return self.storage / "snapshots" / commit / name

    def ref(self, branch: str) -> Path:
        return self.storage / "refs" / check_name(branch, "a branch name")

    # ---- ledger --------------------------------------------------------------------------------
    def _marker(self, path: Path) -> Path:
        return self.state / "owned" / f"{path.relative_to(self.storage).as_posix()}.owned"

    def own(self, path: Path) -> None:
        """Record that the tool creates ``path`` (before it does: a kill in between leaves only
        a marker, never an unrecorded file of the tool's)."""
        marker = self._marker(path)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()

    def owns(self, path: Path) -> bool:
        return self._marker(path).exists()

    def delete(self, path: Path) -> bool:
        """Delete ``path`` if the tool created it; True if it is gone now."""
        if not os.path.lexists(path):
            if self.owns(path):
                remove(self._marker(path), self.roots)
            return True
        if not self.owns(path):
            return False
        remove(path, self.roots)
        remove(self._marker(path), self.roots)
        return True

    # ---- leases and locks ----------------------------------------------------------------------
    def lock(self, etag: str) -> FileLock:
        path = self.state / "locks" / f"{etag}.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        return FileLock(str(path))

    def snapshot_lock(self, commit: str) -> FileLock:
        """One creator or remover of ``commit``'s snapshot folder (and its ref) at a time."""
        return self.lock(f"snapshot-{check_oid(commit, 'a commit id')}")

    def lease(self, etag: str) -> None:
        """Mark ``etag`` as in use by this source (so no other process evicts it meanwhile)."""
        path = self.state / "leases" / etag / self.token
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()

    def unlease(self, etag: str) -> None:
        remove(self.state / "leases" / etag / self.token, self.roots)

    def others_hold(self, etag: str) -> bool:
        """Whether another live source (this process or another) holds a lease on ``etag``;
        leases of processes that died on this host are cleared."""
        folder = self.state / "leases" / etag
        for p in sorted(folder.iterdir()) if folder.is_dir() else []:
            if p.name == self.token:
                continue
            host, pid, _ = (p.name.rsplit("-", 2) + ["", ""])[:3]
            if host == HOST and pid.isdigit() and not pid_alive(int(pid)):
                remove(p, self.roots)
                continue
            return True
        return False

    # ---- finding and placing files -------------------------------------------------------------
    def find(self, commit: str, f: FileInfo) -> Path | None:
        """A cached copy of ``f`` at ``commit``: its snapshot entry (symlink or plain file, as
        ``try_to_load_from_cache`` finds it), else its blob; None when neither is there."""
        got = try_to_load_from_cache(self.repo_id, f.path, cache_dir=self.cache_dir,
                                     revision=commit, repo_type=self.repo_type)
        if isinstance(got, str):
            return Path(got)
        blob = self.blob(f.etag) if f.etag else None
        return blob if blob is not None and blob.is_file() else None

    def discard(self, found: Path, commit: str, f: FileInfo) -> bool:
        """Delete a copy whose bytes are wrong (and its snapshot entry), if the tool created
        it; False (nothing deleted) when it did not."""
        blob = self.blob(f.etag)
        holder = blob if os.path.realpath(found) == os.path.realpath(blob) else found
        if not self.owns(holder):
            return False
        self.delete(self.pointer(commit, f.path))
        self.delete(holder)
        return True

    def put_blob(self, etag: str, part: Path) -> Path:
        """Move a verified download into place as the tool's blob (a file there that the
        tool did not create is never overwritten)."""
        blob = self.blob(etag)
        if os.path.lexists(blob) and not self.delete(blob):
            raise CorruptFileError(f"{blob} is in the way of a verified download and was not "
                                   "created by pythia_probe; delete it or use another cache")
        self.own(blob)
        os.replace(part, blob)
        return blob

    def place(self, commit: str, f: FileInfo, part: Path) -> Path:
        """Move a verified download into place as the tool's blob and snapshot entry."""
        return self.link(commit, f, self.put_blob(f.etag, part))

    def link(self, commit: str, f: FileInfo, found: Path) -> Path:
        """The snapshot entry of ``f`` at ``commit`` for the copy at ``found``: a relative
        symlink to the blob, or (no symlinks here) the file itself, created if missing."""
        pointer = self.pointer(commit, f.path)
        if found == pointer:
            return pointer
        with self.snapshot_lock(commit):  # release() may remove an empty folder
            if os.path.lexists(pointer) and not self.delete(pointer):
                raise CorruptFileError(f"{pointer} is a broken or stale entry that pythia_probe "
                                       "did not create; delete it (or use another cache folder)")
            self._snapshot_dir(commit)
            self.own(pointer)
            if not constants.HF_HUB_DISABLE_SYMLINKS:
                try:
                    os.symlink(os.path.relpath(found, pointer.parent), pointer)
                    return pointer
                except OSError:
                    pass
            return self._plain(f, found, pointer)

    def _plain(self, f: FileInfo, found: Path, pointer: Path) -> Path:
        """The snapshot entry as the file itself (no symlinks here)."""
        if found == self.blob(f.etag) and self.owns(found) and not self.others_hold(f.etag):
            os.replace(found, pointer)  # plain layout: the snapshot entry is the file
            self.delete(found)
        else:
            atomic_write(pointer, lambda tmp: shutil.copyfile(found, tmp), f.size)
        return pointer

    def _snapshot_dir(self, commit: str) -> None:
        folder = self.storage / "snapshots" / commit
        if not folder.is_dir():
            self.own(folder)
            folder.mkdir(parents=True, exist_ok=True)

    def write_ref(self, branch: str, commit: str) -> None:
        """``refs/<branch>`` -> ``commit`` for later offline runs; a ref the tool did not write
        is left as it is."""
        ref = self.ref(branch)
        with self.snapshot_lock(commit):
            now = _read(ref)
            if now is not None and (not self.owns(ref) or now == commit):
                return
            self.own(ref)
            write_text(ref, commit)

    # ---- eviction ------------------------------------------------------------------------------
    def release(self, commit: str, branch: str, files: list[FileInfo],
                still_used: Callable[[str], bool], keep_partial: bool = False) -> None:
        """Delete what the tool created for ``files`` at ``commit`` and nobody else uses (the
        caller has dropped its leases). ``still_used(hash)``: whether the caller still needs a
        blob for another commit, asked under the blob's lock so a fetch cannot slip in."""
        ref = self.ref(branch)
        with self.snapshot_lock(commit):
            if self.owns(ref) and _read(ref) == commit:
                self.delete(ref)  # first: a ref to a half-deleted snapshot upsets scan_cache_dir
        for f in files:
            if self.others_hold(f.etag):
                continue  # no waiting on another process's download of it
            with self.lock(f.etag):
                if not self.others_hold(f.etag):
                    self._drop(commit, f, not still_used(f.etag), keep_partial)
        folder = self.storage / "snapshots" / commit
        with self.snapshot_lock(commit):  # not while another source links a file in it
            if folder.is_dir() and not any(folder.iterdir()):
                self.delete(folder)

    def _drop(self, commit: str, f: FileInfo, blob_too: bool, keep_partial: bool) -> None:
        self.delete(self.pointer(commit, f.path))
        if blob_too:
            self.delete(self.blob(f.etag))
            if not keep_partial:  # ".partial" files are the tool's by their name
                remove(partial_path(self.blob(f.etag)), self.roots)

    # ---- the hub's tree listings, kept for offline verification --------------------------------
    def _tree_path(self, commit: str) -> Path:
        return self.state / "trees" / f"{check_oid(commit, 'a commit id')}.json"

    def save_tree(self, commit: str, files: tuple[FileInfo, ...]) -> None:
        path = self._tree_path(commit)
        if not path.exists():
            write_json(path, [vars(f) for f in files])

    def load_tree(self, commit: str) -> dict[str, FileInfo]:
        """The saved listing of ``commit`` (empty when none, or when it is unreadable: names
        in it are validated again, it lies on disk)."""
        try:
            rows = json.loads(self._tree_path(commit).read_text())
            files = [FileInfo.from_hub(r["path"], r["size"], r["sha256"], r["git_oid"],
                                       f"the saved listing of {commit}") for r in rows]
        except (OSError, ValueError, KeyError, TypeError, UnsafeFileError):
            return {}
        return {f.path: f for f in files}

    # ---- what is cached (offline) --------------------------------------------------------------
    def cached(self) -> dict[str, tuple[str, dict[str, Path]]]:
        """``{branch: (commit, {file name: path})}`` of the snapshots refs point to, as
        ``scan_cache_dir`` reads them (symlinked or plain files alike)."""
        if not self.storage.is_dir():
            raise CheckpointNotCachedError(
                f"offline and {self.repo_id} is not in the cache {self.cache_dir} (no "
                f"{self.storage})")
        info = scan_cache_dir(self.cache_dir)
        repo = next((r for r in info.repos if r.repo_id == self.repo_id
                     and r.repo_type == self.repo_type), None)
        if repo is None:
            why = [str(w) for w in info.warnings if self.storage.name in str(w)] or ["empty"]
            raise CorruptCheckpointError(f"the cache folder {self.storage} cannot be read: "
                                         f"{'; '.join(why)}")
        out = {}
        for rev in repo.revisions:
            files = {c.file_name: c.file_path for c in rev.files
                     if c.file_path.parent == rev.snapshot_path}
            out.update({ref: (rev.commit_hash, files) for ref in rev.refs})
        return out

    def cached_file(self, commit: str, name: str, path: Path,
                    tree: dict[str, FileInfo]) -> FileInfo:
        """What is known of a cached file: the saved hub listing, else the hash its blob is
        named after (symlinked layout), else its size only (plain files, nothing to check)."""
        size = path.stat().st_size
        if name in tree:
            return tree[name]
        tag = Path(os.readlink(path)).name if path.is_symlink() else ""
        sha = tag if len(tag) == 64 and _hex(tag) else None
        oid = tag if len(tag) == 40 and _hex(tag) else None
        return FileInfo(name, size, sha, oid)


class Holdings:
    """What one source holds in its cache, per commit: the files it leased (so no other source
    evicts them meanwhile) and the blob bytes it reserved (what ``max_disk`` bounds; a blob
    shared by several commits counts once). Thread-safe: the prefetch thread fetches while the
    caller's thread evicts."""

    def __init__(self, cache: HubCache):
        self.cache = cache
        self._lock = threading.Condition()
        self._live: dict[str, dict[str, int]] = {}  # commit -> {blob hash: size}: the budget
        self._held: dict[str, dict[str, FileInfo]] = {}  # commit -> files leased

    def hold(self, commit: str, f: FileInfo) -> None:
        """Lease ``f``'s blob for ``commit`` (before taking the blob's lock, so other processes
        see the lease at once)."""
        with self._lock:
            self._held.setdefault(commit, {})[f.path] = f
            self.cache.lease(f.etag)

    def reserve(self, commit: str, files: Iterable[FileInfo]) -> None:
        with self._lock:
            self._live.setdefault(commit, {}).update({f.etag: f.size for f in files})
            self._lock.notify_all()

    def _blobs(self) -> dict[str, int]:
        return {k: v for b in self._live.values() for k, v in b.items()}

    def live_bytes(self) -> int:
        """Bytes of the distinct blobs reserved by commits not yet released."""
        with self._lock:
            return sum(self._blobs().values())

    def wait_for(self, need: Iterable[FileInfo], max_disk: float, where: str) -> None:
        """Block until ``need`` fits under ``max_disk`` beside what is reserved; a revision
        larger than the whole budget raises :class:`~pythia_probe.errors.CheckpointDiskError`."""
        need = list(need)
        with self._lock:
            while True:
                live = self._blobs()
                extra = sum(f.size for f in need if f.etag not in live)
                if sum(live.values()) + extra <= max_disk:
                    return
                if not live:
                    raise CheckpointDiskError(
                        f"{where} needs {extra} bytes, more than max_disk={int(max_disk)}; "
                        "raise the disk budget or ask for fewer tensors")
                self._lock.wait(timeout=1.0)

    def drop(self, commit: str) -> list[FileInfo]:
        """Stop holding ``commit``'s files: leases no other held commit needs are dropped;
        returns the files it held."""
        with self._lock:  # leases change only under this lock, with what they record
            held = self._held.pop(commit, {})
            for etag in {f.etag for f in held.values()} - self._used():
                self.cache.unlease(etag)
        return list(held.values())

    def unreserve(self, commit: str) -> None:
        """Free ``commit``'s share of the budget (once its files are gone, or forgotten)."""
        with self._lock:
            self._live.pop(commit, None)
            self._lock.notify_all()

    def commits(self) -> list[str]:
        with self._lock:
            return list(self._held)

    def _used(self) -> set[str]:
        return {f.etag for files in self._held.values() for f in files.values()}

    def still_used(self, etag: str) -> bool:
        """Whether a commit still held needs the blob ``etag``."""
        with self._lock:
            return etag in self._used()


def _read(ref: Path) -> str | None:
    """A ref's commit id; None when there is none (another source may delete it meanwhile)."""
    try:
        return ref.read_text().strip() if ref.is_file() else None
    except FileNotFoundError:
        return None


def _hex(s: str) -> bool:
    return all(c in "0123456789abcdef" for c in s)
