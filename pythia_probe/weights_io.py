"""Checkpoint files on local disk: hashes, verification, the hub cache layout, tensor loading.

The file-level half of :mod:`pythia_probe.checkpoints` (which resolves, downloads and evicts):

- ``FileInfo`` (path, size, LFS sha256, git blob id); ``Revision`` (a step's branch, commit and
  files; its ``layout``: bin / safetensors, single or sharded); ``verify_file`` (size + hash
  check that deletes a bad blob so it is fetched again), ``sha256_file``, ``git_blob_oid``.
- ``load_tensors(path, want)``: one weight file, only the names ``want`` accepts; safetensors
  tensor by tensor, ``.bin`` with ``torch.load(weights_only=True, mmap=True)`` (a pickle holding
  anything but tensors raises :class:`UnsafeCheckpointError`). ``load_weight_files`` merges
  several files (sharded checkpoints); ``shards_for(index, names)`` picks the shards to fetch.
- ``name_predicate(names)``: names given as a list, a predicate or None (all but legacy buffers).
- Hub cache layout (``models--ORG--NAME/{refs,snapshots,blobs}``): ``hub_cache_layout``,
  ``cached_branches``, ``cached_files``; ``dir_bytes`` measures a folder.
- ``download_resumable(url, blob, f, headers, lock)``: fetch one LFS blob through
  ``blobs/<sha256>.partial``, a name that survives the process, so a run killed mid-file continues
  from the bytes on disk (HTTP Range) instead of from zero; sha256-checked before the rename.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from huggingface_hub.file_download import http_get
from huggingface_hub.utils import WeakFileLock
from safetensors import safe_open

from pythia_probe.arch import is_legacy_buffer

Names = Iterable[str] | Callable[[str], bool] | None
WEIGHT_SUFFIXES = (".safetensors", ".bin")
INDEX_NAMES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
PARTIAL_SUFFIX = ".partial"


class CheckpointError(RuntimeError):
    """Base class for checkpoint loading errors."""


class CheckpointNotCachedError(CheckpointError):
    """Offline (or local cache) and the asked revision/file is not there."""


class ChecksumError(CheckpointError):
    """Downloaded bytes do not match the hash the hub announced."""


class UnsafeCheckpointError(CheckpointError):
    """A pickle that ``torch.load(weights_only=True)`` refuses (it would execute code)."""


@dataclass(frozen=True)
class FileInfo:
    """One file of a revision: size, LFS sha256 (weights) and/or git blob id (small files)."""

    path: str
    size: int
    sha256: str | None = None
    git_oid: str | None = None

    @property
    def etag(self) -> str | None:
        """The hub cache's blob name for this file."""
        return self.sha256 or self.git_oid


@dataclass(frozen=True)
class Revision:
    """A resolved checkpoint: step, branch, commit sha and its files (nothing downloaded yet)."""

    model: str
    step: int
    branch: str
    commit: str | None
    files: tuple[FileInfo, ...]
    local_dir: str | None = None  # set for "one folder per step" sources

    def file(self, path: str) -> FileInfo | None:
        return next((f for f in self.files if f.path == path), None)

    @property
    def layout(self) -> str:
        """"safetensors", "bin", "safetensors-sharded" or "bin-sharded" (safetensors preferred)."""
        names = {f.path for f in self.files}
        for fmt, single, index in (("safetensors", "model.safetensors", INDEX_NAMES[0]),
                                   ("bin", "pytorch_model.bin", INDEX_NAMES[1])):
            if single in names:
                return fmt
            if index in names:
                return fmt + "-sharded"
        raise CheckpointError(f"{self.model}@{self.branch}: no weights among {sorted(names)}")

    @property
    def weight_files(self) -> tuple[FileInfo, ...]:
        ext = ".safetensors" if self.layout.startswith("safetensors") else ".bin"
        return tuple(f for f in self.files if f.path.endswith(ext) and "/" not in f.path)

    @property
    def index_file(self) -> FileInfo | None:
        return self.file(INDEX_NAMES[0 if self.layout.startswith("safetensors") else 1])

    @property
    def nbytes(self) -> int:
        """Bytes of config, index and all weight files."""
        return sum(f.size for f in self._needed())

    def _needed(self) -> tuple[FileInfo, ...]:
        extra = tuple(f for f in (self.file("config.json"), self.index_file) if f is not None)
        return extra + self.weight_files

    def manifest(self) -> dict:
        return {"step": self.step, "branch": self.branch, "commit": self.commit,
                "files": {f.path: f.sha256 or f.git_oid for f in self._needed()}}


# ---- hashes and verification -------------------------------------------------------------------
def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 4 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def git_blob_oid(path: Path) -> str:
    """The git blob id (sha1 of ``blob <size>\\0<bytes>``) the hub reports for small files."""
    data = Path(path).read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def verify_file(p: Path, f: FileInfo) -> None:
    """Check size and hash of ``p`` against ``f``; on mismatch delete the blob and its pointer
    (so the next try downloads it again) and raise :class:`ChecksumError`."""
    got = p.stat().st_size
    ok = got == f.size
    if ok and f.sha256:
        ok = sha256_file(p) == f.sha256
    elif ok and f.git_oid:
        ok = git_blob_oid(p) == f.git_oid
    if not ok:
        blob = p.resolve()
        p.unlink(missing_ok=True)
        blob.unlink(missing_ok=True)
        raise ChecksumError(f"{f.path}: bytes do not match the hub's hash/size "
                            f"({got} bytes, expected {f.size}); deleted for re-download")


def partial_path(blob: Path) -> Path:
    """Where the bytes of ``blob`` accumulate until they are complete and verified."""
    return blob.with_name(blob.name + PARTIAL_SUFFIX)


def download_resumable(url: str, blob: Path, f: FileInfo, headers: dict[str, str], lock: Path,
                       verify: bool = True) -> Path:
    """Download ``url`` to ``blob`` via ``blob.partial``, resuming from the bytes already there.

    The partial file keeps its name across processes (huggingface_hub's own temp files are
    per process and deleted on failure), so a killed run resumes with ``Range: bytes=<have>-``.
    A partial longer than ``f.size`` is discarded; the finished file is checked against
    ``f.sha256`` (when ``verify``) and, on mismatch, deleted and :class:`ChecksumError` raised,
    so a corrupt partial costs one full re-download. ``lock`` serialises writers of one blob.
    """
    part = partial_path(blob)
    blob.parent.mkdir(parents=True, exist_ok=True)
    lock.parent.mkdir(parents=True, exist_ok=True)
    with WeakFileLock(lock):
        if blob.exists():  # another process finished it meanwhile
            return blob
        if part.exists() and part.stat().st_size > f.size:
            part.unlink()
        with open(part, "ab") as fh:
            http_get(url, fh, resume_size=fh.tell(), headers=headers, expected_size=f.size,
                     displayed_filename=f.path)
        if verify and f.sha256 and sha256_file(part) != f.sha256:
            part.unlink(missing_ok=True)
            raise ChecksumError(f"{f.path}: downloaded bytes do not match the hub's sha256 "
                                f"{f.sha256}; partial file deleted for re-download")
        os.replace(part, blob)
    return blob


def dir_bytes(root: Path) -> int:
    """Bytes of the regular files under ``root`` (symlinks not followed, vanished files skipped)."""
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            try:
                st = os.lstat(os.path.join(folder, name))
            except FileNotFoundError:
                continue
            total += st.st_size if stat.S_ISREG(st.st_mode) else 0
    return total


# ---- hub cache layout --------------------------------------------------------------------------
def hub_cache_layout(path: Path) -> tuple[Path, str] | None:
    """``(cache_dir, model_id)`` if ``path`` is a hub-style cache or a models--ORG--NAME folder."""
    if path.name.startswith("models--") and (path / "snapshots").is_dir():
        return path.parent, path.name[len("models--"):].replace("--", "/")
    repos = [p for p in path.glob("models--*") if (p / "snapshots").is_dir()]
    if len(repos) == 1:
        return path, repos[0].name[len("models--"):].replace("--", "/")
    return None


def cached_branches(storage: Path) -> dict[str, str]:
    """``{branch: commit}`` of a cached repo folder, for branches whose snapshot exists."""
    refs = storage / "refs"
    if not refs.is_dir():
        model = storage.name.removeprefix("models--").replace("--", "/")
        raise CheckpointNotCachedError(
            f"offline and {model} is not in the cache {storage.parent} (no {refs})")
    branches = {p.name: p.read_text().strip() for p in refs.iterdir() if p.is_file()}
    return {b: c for b, c in branches.items() if (storage / "snapshots" / c).is_dir()}


def cached_files(storage: Path, commit: str) -> tuple[FileInfo, ...]:
    """The files of a cached snapshot; blob names give the sha256 (LFS) or git blob id."""
    snap = storage / "snapshots" / commit
    if not snap.is_dir():
        raise CheckpointNotCachedError(f"offline and commit {commit} has no snapshot in {snap}")
    out = []
    for p in sorted(snap.iterdir()):
        blob = p.resolve()
        tag = blob.name
        sha = tag if len(tag) == 64 else None
        out.append(FileInfo(p.name, blob.stat().st_size, sha, None if sha else tag))
    return tuple(out)


# ---- loading -----------------------------------------------------------------------------------
def name_predicate(names: Names) -> Callable[[str], bool]:
    """A name filter: ``None`` -> every tensor but legacy buffers; a callable -> itself (legacy
    buffers still skipped); a list -> exactly those names."""
    if names is None:
        return lambda n: not is_legacy_buffer(n)
    if callable(names):
        return lambda n: not is_legacy_buffer(n) and names(n)
    wanted = set(names)
    return lambda n: n in wanted


def shards_for(index_path: Path, names: Names) -> set[str]:
    """Shard file names of a ``*.index.json`` holding at least one tensor ``names`` asks for."""
    weight_map = json.loads(Path(index_path).read_text())["weight_map"]
    want = name_predicate(names)
    return {v for k, v in weight_map.items() if want(k)}


def load_weight_files(paths: Iterable[Path], names: Names = None,
                      where: str = "checkpoint") -> dict[str, torch.Tensor]:
    """Merge the asked tensors of several weight files; a list of names must all be found."""
    want = name_predicate(names)
    tensors: dict[str, torch.Tensor] = {}
    for p in paths:
        tensors.update(load_tensors(p, want))
    if names is not None and not callable(names):
        missing = sorted(set(names) - set(tensors))
        if missing:
            raise KeyError(f"{where} has no tensors {missing}")
    return tensors


def load_tensors(path: Path, want: Callable[[str], bool]) -> dict[str, torch.Tensor]:
    """Tensors of one weight file whose names pass ``want`` (copied out of the file mapping)."""
    path = Path(path)
    if path.suffix == ".safetensors":
        with safe_open(str(path), framework="pt") as f:
            return {k: f.get_tensor(k) for k in f.keys() if want(k)}
    try:
        sd = _torch_load(path)
    except pickle.UnpicklingError as err:
        raise UnsafeCheckpointError(
            f"{path}: refused to unpickle with torch.load(weights_only=True); the file holds "
            f"objects other than tensors (possible code execution). Details: {err}") from err
    if not isinstance(sd, dict):
        raise UnsafeCheckpointError(f"{path}: expected a state dict, got {type(sd).__name__}")
    return {k: v.clone() for k, v in sd.items() if want(k)}


def _torch_load(path: Path):
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError as err:  # legacy (non-zip) serialization cannot be memory-mapped
        if "mmap" not in str(err):
            raise
        return torch.load(path, map_location="cpu", weights_only=True)
