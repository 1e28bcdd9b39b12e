"""Checkpoint files on local disk: file records, hashes, checked loading, error kinds.

The file-level half of :mod:`pythia_probe.hub.checkpoints` (which resolves, downloads and evicts;
:mod:`pythia_probe.hub.cache` owns the cache layout, :mod:`pythia_probe.hub.io` the transfers):

- ``FileInfo`` (path, size, LFS sha256, git blob id; :meth:`FileInfo.from_hub` validates every
  name and hash the tree API gives before it can become a path); ``Revision`` (a step's branch,
  commit and files; its ``layout``: bin / safetensors, single or sharded).
- Hashes: ``sha256_file``, ``git_blob_oid``; :func:`file_matches` checks size and hash (each
  file hashed once per process while it stays unchanged); :func:`weights_digest`: one digest
  of a revision's weight files (what the duplicate check, the revision ledger and the
  download plan compare).
- ``load_tensors(path, want)``: one weight file, only the names ``want`` accepts; safetensors
  tensor by tensor, ``.bin`` with ``torch.load(weights_only=True, mmap=True)`` (a pickle holding
  anything but tensors raises :class:`UnsafeCheckpointError`; a truncated or garbled file
  :class:`CorruptCheckpointError` naming it). ``load_weight_files`` merges several files
  (sharded checkpoints); ``shards_for(index, names)`` picks the shards to fetch; ``read_json``
  reads config/index files (an unparseable one is a :class:`CorruptCheckpointError`).
- ``name_predicate(names)``: names given as a list, a predicate or None (all but legacy buffers).
- Errors: :class:`~pythia_probe.errors.CheckpointError` and its kinds, in
  :mod:`pythia_probe.errors` (one line, exit 2 on the command line).
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import stat
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from pythia_probe.arch import is_legacy_buffer
from pythia_probe.errors import (
    CheckpointNotCachedError,
    CorruptCheckpointError,
    MissingTensorError,
    UnsafeCheckpointError,
    UnsafeFileError,
)
from pythia_probe.fileio import sha256_file
from pythia_probe.hub.io import (
    check_name,
    check_oid,
    check_repo_path,
    check_sha256,
    partial_path,
)

__all__ = ["INDEX_NAMES", "WEIGHT_SUFFIXES", "FileInfo", "Names", "Revision", "dir_bytes",
           "file_matches", "git_blob_oid", "hub_cache_layout", "load_tensors",
           "load_weight_files", "name_predicate", "partial_path", "read_json", "sha256_file",
           "shards_for", "weights_digest"]

Names = Iterable[str] | Callable[[str], bool] | None
WEIGHT_SUFFIXES = (".safetensors", ".bin")
INDEX_NAMES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


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

    @classmethod
    def from_hub(cls, path: object, size: object, sha256: object, git_oid: object,
                 where: str) -> FileInfo:
        """A file as the tree API lists it, every name and hash validated (a path where a hash
        should be raises :class:`UnsafeCheckpointError`)."""
        try:
            check_repo_path(path, f"a file name in the hub's listing of {where}")
            what = f"the hub's {{}} of {path} in {where}"
            sha = None if sha256 is None else check_sha256(sha256, what.format("LFS sha256"))
            oid = None if git_oid is None else check_oid(git_oid, what.format("git blob id"))
        except UnsafeFileError as err:
            raise UnsafeCheckpointError(str(err)) from err
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise UnsafeCheckpointError(f"the hub lists {path} in {where} with size {size!r}")
        if sha is None and oid is None:
            raise UnsafeCheckpointError(f"the hub lists {path} in {where} without any hash, so "
                                        "its bytes cannot be verified")
        return cls(path, size, sha, oid)

    def checked_name(self, where: str) -> str:
        """The path, if it is a plain file name (model files sit at the top of a revision)."""
        try:
            return check_name(self.path, f"file {self.path!r} of {where}")
        except UnsafeFileError as err:
            raise UnsafeCheckpointError(str(err)) from err


@dataclass(frozen=True)
class Revision:
    """A resolved checkpoint: step, branch, commit sha and its files (nothing downloaded yet)."""

    model: str
    step: int
    branch: str
    commit: str | None
    files: tuple[FileInfo, ...]
    local_dir: str | None = None  # set for "one folder per step" sources

    @property
    def where(self) -> str:
        """``model@branch`` for messages."""
        return f"{self.model}@{self.branch}"

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
        raise CheckpointNotCachedError(
            f"{self.where}: no weight files (model.safetensors, pytorch_model.bin or a sharded "
            f"index) among {sorted(names)}")

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
def git_blob_oid(path: Path) -> str:
    """The git blob id (sha1 of ``blob <size>\\0<bytes>``) the hub reports for small files."""
    h = hashlib.sha1(b"blob %d\0" % Path(path).stat().st_size)
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


_CHECKED: dict[tuple, str] = {}  # (dev, inode, size, mtime, ctime) -> hash already computed
_CHECKED_LOCK = threading.Lock()


def _stamp(p: Path) -> tuple:
    st = os.stat(p)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def file_digest(p: Path, sha256: bool) -> str:
    """sha256 (or git blob id) of ``p``, computed once per process while the file is unchanged."""
    key = (*_stamp(p), sha256)
    with _CHECKED_LOCK:
        if key in _CHECKED:
            return _CHECKED[key]
    digest = sha256_file(p) if sha256 else git_blob_oid(p)
    with _CHECKED_LOCK:
        _CHECKED[key] = digest
    return digest


def file_matches(p: Path, f: FileInfo) -> bool:
    """Size and hash of ``p`` against ``f`` (size only when ``f`` has no hash)."""
    if os.stat(p).st_size != f.size:
        return False
    if f.sha256:
        return file_digest(p, True) == f.sha256
    if f.git_oid:
        return file_digest(p, False) == f.git_oid
    return True


def weights_digest(identities: Mapping[str, str]) -> str:
    """One digest of a revision's weight files: the sha256 of the lines ``"<file> <identity>"``
    sorted by file name, where a file's identity is its hub-listed sha256 (``git-blob:<id>`` for
    a file the hub lists without one), or the sha256 of a local file."""
    lines = "".join(f"{name} {identities[name]}\n" for name in sorted(identities))
    return hashlib.sha256(lines.encode()).hexdigest()


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


def hub_cache_layout(path: Path) -> tuple[Path, str] | None:
    """``(cache_dir, model_id)`` if ``path`` is a hub-style cache or a models--ORG--NAME folder."""
    if path.name.startswith("models--") and (path / "snapshots").is_dir():
        return path.parent, path.name[len("models--"):].replace("--", "/")
    repos = [p for p in path.glob("models--*") if (p / "snapshots").is_dir()]
    if len(repos) == 1:
        return path, repos[0].name[len("models--"):].replace("--", "/")
    return None


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


def read_json(path: Path, what: str) -> dict:
    """A JSON object from ``path``; a file that is not one raises
    :class:`CorruptCheckpointError` naming ``what`` (e.g. "config.json of org/model@step2")."""
    try:
        data = json.loads(Path(path).read_bytes().decode("utf-8"))
    except FileNotFoundError as err:
        raise CheckpointNotCachedError(f"{what}: no file {path}") from err
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CorruptCheckpointError(f"{what} ({path}) is not valid JSON: {err}") from err
    if not isinstance(data, dict):
        raise CorruptCheckpointError(f"{what} ({path}) holds a {type(data).__name__}, "
                                     "not a JSON object")
    return data


def shards_for(index_path: Path, names: Names, what: str = "the index") -> set[str]:
    """Shard file names of a ``*.index.json`` holding at least one tensor ``names`` asks for."""
    weight_map = read_json(index_path, what).get("weight_map")
    if not isinstance(weight_map, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
        raise CorruptCheckpointError(f"{what} ({index_path}) has no weight_map of tensor name "
                                     "-> shard file name")
    want = name_predicate(names)
    return {v for k, v in weight_map.items() if want(k)}


def load_weight_files(paths: Iterable[Path], names: Names = None,
                      where: str = "checkpoint") -> dict[str, torch.Tensor]:
    """Merge the asked tensors of several weight files; a list of names must all be found."""
    want = name_predicate(names)
    tensors: dict[str, torch.Tensor] = {}
    for p in paths:
        tensors.update(load_tensors(p, want, where))
    if names is not None and not callable(names):
        missing = sorted(set(names) - set(tensors))
        if missing:
            raise MissingTensorError(f"{where} has no tensors {missing}")
    return tensors


def load_tensors(path: Path, want: Callable[[str], bool],
                 where: str = "checkpoint") -> dict[str, torch.Tensor]:
    """Tensors of one weight file whose names pass ``want`` (copied out of the file mapping)."""
    path = Path(path)
    what = f"{path.name} of {where} ({path})"
    try:
        if path.suffix == ".safetensors":
            with safe_open(str(path), framework="pt") as f:
                return {k: f.get_tensor(k) for k in f.keys() if want(k)}
        sd = _torch_load(path)
    except FileNotFoundError as err:
        raise CheckpointNotCachedError(f"{what}: the file is gone") from err
    except pickle.UnpicklingError as err:
        if "GLOBAL" not in str(err):  # garbage, not a forbidden object
            raise CorruptCheckpointError(f"{what} is truncated or not a torch file: "
                                         f"{_torch_detail(err)}") from err
        raise UnsafeCheckpointError(
            f"{what}: refused to unpickle with torch.load(weights_only=True); the file holds "
            f"objects other than tensors (possible code execution). Details: "
            f"{_torch_detail(err)}") from err
    except (SafetensorError, RuntimeError, OSError, EOFError, ValueError) as err:
        raise CorruptCheckpointError(f"{what} is truncated or not a valid {path.suffix} weight "
                                     f"file: {type(err).__name__}: {_first_line(err)}") from err
    if not isinstance(sd, dict):
        raise UnsafeCheckpointError(f"{what}: expected a state dict, got {type(sd).__name__}")
    return {k: v.clone() for k, v in sd.items() if want(k)}


def _torch_detail(err: BaseException) -> str:
    """The line of torch's weights-only message that says what was wrong."""
    lines = [x.strip() for x in str(err).splitlines() if x.strip()]
    keep = [x for x in lines if "GLOBAL" in x or x.startswith("Unsupported")
            or "truncated" in x or "EOF" in x]
    return (keep or lines or [""])[0][:300]


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [""])[0][:300]


def _torch_load(path: Path):
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError as err:  # legacy (non-zip) serialization cannot be memory-mapped
        if "mmap" not in str(err):
            raise
        return torch.load(path, map_location="cpu", weights_only=True)
