"""Repos on disk for the loopback hub: one folder per branch, each a commit.

Layout (``repo_type`` "model" or "dataset")::

    root/ORG/NAME/<branch>/<files>               model repos
    root/datasets/ORG/NAME/<branch>/<files>      dataset repos (files may sit in sub-folders)

A branch's commit sha is derived from the branch name and its files' git blob ids, so it changes
when the files do. Hashes are cached by (path, mtime, size).
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


class RepoStore:
    """Branch folders on disk -> commits and file entries, for model and dataset repos."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._cache: dict[tuple, tuple[str, str]] = {}
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
            key = (str(p), st.st_mtime_ns, st.st_size)
            with self._lock:
                if key not in self._cache:
                    self._cache[key] = _hashes(p)
                sha, git = self._cache[key]
            out.append(FileEntry(p.relative_to(folder).as_posix(), st.st_size, sha, git, p))
        return sorted(out, key=lambda f: f.path)

    def commit(self, repo: str, branch: str, repo_type: str = "model") -> str:
        files = self.files(self.branches(repo, repo_type)[branch])
        text = branch + "".join(f"{f.path}:{f.git_oid}" for f in files)
        return hashlib.sha1(text.encode()).hexdigest()

    def resolve(self, repo: str, rev: str, repo_type: str = "model") -> tuple[str, Path] | None:
        """A branch name or a commit sha -> (commit, folder)."""
        for name, folder in self.branches(repo, repo_type).items():
            commit = self.commit(repo, name, repo_type)
            if rev in (name, commit):
                return commit, folder
        return None
