"""Repos on disk for the loopback hub: one folder per branch, each a commit.

Layout (``repo_type`` "model" or "dataset")::

    root/ORG/NAME/<branch>/<files>               model repos
    root/datasets/ORG/NAME/<branch>/<files>      dataset repos (files may sit in sub-folders)

A branch's commit sha is derived from the branch name and its files' git blob ids, so it changes
when the files do. A file is hashed once per session: the hashes are shared by every server
(keyed by the file's path, inode, mtime and size, so a rewritten file is hashed again), and a
branch named in a request is resolved without hashing the other branches.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass
from pathlib import Path

LFS_SUFFIXES = (".bin", ".safetensors", ".pt", ".parquet")
REPO_TYPES = ("model", "dataset")


@dataclass(frozen=True)
class FileEntry:
    """One file of a branch; ``path`` is relative to the branch folder, with "/" separators."""

    path: str
    size: int
    sha256: str
    git_oid: str
    abspath: Path

    @property
    def lfs(self) -> bool:
        return self.path.endswith(LFS_SUFFIXES)

    def tree_json(self) -> dict:
        """The entry as the hub's ``tree`` / ``paths-info`` endpoints list it."""
        d = {"type": "file", "oid": self.git_oid, "size": self.size, "path": self.path}
        if self.lfs:
            d["lfs"] = {"oid": self.sha256, "size": self.size, "pointerSize": 134}
        return d


def folder_json(path: str, files: list[FileEntry]) -> dict:
    """A folder entry; its oid hashes the paths and blob ids below it."""
    below = "".join(f"{f.path}:{f.git_oid}" for f in files if f.path.startswith(path + "/"))
    return {"type": "directory", "oid": hashlib.sha1(below.encode()).hexdigest(), "path": path}


def folders_of(files: list[FileEntry]) -> list[str]:
    """Every folder path that holds a file (directly or below), sorted."""
    out = set()
    for f in files:
        parts = f.path.split("/")[:-1]
        out.update("/".join(parts[: i + 1]) for i in range(len(parts)))
    return sorted(out)


def _hashes(path: Path) -> tuple[str, str]:
    data = path.read_bytes()
    git = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    return hashlib.sha256(data).hexdigest(), git


#: (path, device, inode, mtime, size) -> (sha256, git blob id), for every server of the session
_HASHES: dict[tuple, tuple[str, str]] = {}
_HASHES_LOCK = threading.Lock()


def file_hashes(path: Path, st) -> tuple[str, str]:
    """``(sha256, git blob id)`` of ``path`` (``st`` its stat), each file read once."""
    key = (str(path), st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
    with _HASHES_LOCK:
        known = _HASHES.get(key)
    if known is None:
        known = _hashes(path)
        with _HASHES_LOCK:
            _HASHES[key] = known
    return known


class RepoStore:
    """Branch folders on disk -> commits and file entries, for model and dataset repos."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._branch_of: dict[tuple[str, str, str], str] = {}  # (repo, type, commit) -> branch
        self._lock = threading.Lock()

    def repo_dir(self, repo: str, repo_type: str = "model") -> Path:
        if repo_type not in REPO_TYPES:
            raise ValueError(f"repo_type must be one of {REPO_TYPES}, got {repo_type!r}")
        return self.root / repo if repo_type == "model" else self.root / "datasets" / repo

    def branches(self, repo: str, repo_type: str = "model") -> dict[str, Path]:
        d = self.repo_dir(repo, repo_type)
        return {p.name: p for p in sorted(d.iterdir()) if p.is_dir()} if d.is_dir() else {}

    def files(self, folder: Path) -> list[FileEntry]:
        """Every file below a branch folder (recursively), sorted by path."""
        out = []
        for p in sorted(q for q in folder.rglob("*") if q.is_file()):
            st = p.stat()
            sha, git = file_hashes(p, st)
            out.append(FileEntry(p.relative_to(folder).as_posix(), st.st_size, sha, git, p))
        return sorted(out, key=lambda f: f.path)

    def commit(self, repo: str, branch: str, repo_type: str = "model") -> str:
        files = self.files(self.branches(repo, repo_type)[branch])
        text = branch + "".join(f"{f.path}:{f.git_oid}" for f in files)
        return hashlib.sha1(text.encode()).hexdigest()

    def resolve(self, repo: str, rev: str, repo_type: str = "model") -> tuple[str, Path] | None:
        """A branch name or a commit sha -> (commit, folder). A branch name is looked up
        directly; a commit is found through the branch it last named, else by hashing every
        branch."""
        branches = self.branches(repo, repo_type)
        if rev in branches:
            return self._commit_of(repo, rev, repo_type), branches[rev]
        with self._lock:
            known = self._branch_of.get((repo, repo_type, rev))
        if known in branches and self._commit_of(repo, known, repo_type) == rev:
            return rev, branches[known]
        for name, folder in branches.items():
            if self._commit_of(repo, name, repo_type) == rev:
                return rev, folder
        return None

    def _commit_of(self, repo: str, branch: str, repo_type: str) -> str:
        """:meth:`commit`, remembering which branch the commit belongs to."""
        commit = self.commit(repo, branch, repo_type)
        with self._lock:
            self._branch_of[(repo, repo_type, commit)] = branch
        return commit
