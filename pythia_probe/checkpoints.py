"""Stream checkpoint revisions from the hub (or local folders) with bounded disk and verified bytes.

API::

    src = CheckpointSource("EleutherAI/pythia-1.4b", cache_dir="ckpt-cache")   # or a local dir
    revs = src.resolve([0, 1, 1000, 2000])     # -> list[Revision]: step, branch, commit, files
    dups = src.duplicates(revs)                # {1: 0}: step1's weights are byte-identical to step0
    for rev, tensors, config in src.stream(revs, names=arch.name_filter("embed", "unembed"),
                                           prefetch=1, max_disk=8e9, skip_duplicates=True):
        ...                                    # tensors {hf_name: Tensor}; config.json dict
    src.manifest(revs)                         # commit shas + file hashes for the run manifest

- ``resolve`` reads every branch's commit (one ``list_repo_refs`` call) and each revision's files
  with sizes and LFS sha256 (``list_repo_tree``) before anything is downloaded. Unknown steps raise
  :class:`~pythia_probe.steps.StepError` naming the nearest valid steps.
- ``stream`` downloads into ``cache_dir`` (pinned to the commit sha), in a background thread
  ``prefetch`` revisions ahead, verifies sha256 (LFS) or the git blob id (small files),
  re-downloads on mismatch, resumes weight files across processes (a run killed mid-file continues
  from ``blobs/<sha256>.partial`` with a Range request; small files and snapshot pointers go
  through ``hf_hub_download``), retries transient errors with exponential backoff
  (:class:`RetryPolicy`), loads only the asked tensors (safetensors per tensor; ``.bin`` with
  ``torch.load(weights_only=True, mmap=True)``; sharded checkpoints download only the shards
  holding asked tensors), skips legacy buffers, and evicts each revision (snapshot + blobs no
  other live revision shares) once the caller asks for the next one, keeping the cache under
  ``max_disk`` bytes. ``keep=True`` keeps the files (e.g. to populate a cache for offline use).
- Offline (``HF_HUB_OFFLINE=1``): resolution and loading read the hub-style cache only
  (``refs/<branch>``, ``snapshots/<commit>``, blob names = sha256); a missing revision or file
  raises :class:`CheckpointNotCachedError` naming what is cached.
- Local sources: a folder with one sub-folder per step (``step1000/``), or a hub-style cache
  (a folder holding ``models--ORG--NAME`` or that folder itself). Local files are never deleted.
- Lower level: ``fetch(rev, names) -> {path: local Path}``, ``load(rev, paths, names) -> Loaded``,
  ``evict(rev)``, ``live_bytes()`` (bytes reserved by fetched, not evicted revisions: what
  ``max_disk`` bounds; files already in the cache before the run are not counted),
  ``disk_usage()`` (walks the cache). File-level pieces (``FileInfo``, ``Revision``, hashing,
  ``load_tensors``, the cache layout) live in :mod:`pythia_probe.weights_io`, re-exported here.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
from huggingface_hub import HfApi, constants, get_hf_file_metadata, hf_hub_download, hf_hub_url
from huggingface_hub.errors import (
    EntryNotFoundError,
    HfHubHTTPError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import build_hf_headers

from pythia_probe import steps as steps_mod
from pythia_probe.weights_io import (
    INDEX_NAMES,
    WEIGHT_SUFFIXES,
    CheckpointError,
    CheckpointNotCachedError,
    ChecksumError,
    FileInfo,
    Names,
    Revision,
    UnsafeCheckpointError,
    cached_branches,
    cached_files,
    dir_bytes,
    download_resumable,
    hub_cache_layout,
    load_tensors,
    load_weight_files,
    partial_path,
    sha256_file,
    shards_for,
    verify_file,
)

__all__ = [
    "INDEX_NAMES", "RETRY_STATUS", "WEIGHT_SUFFIXES", "CheckpointDownloadError", "CheckpointError",
    "CheckpointNotCachedError", "CheckpointSource", "ChecksumError", "FileInfo", "Loaded", "Names",
    "Revision", "RetryPolicy", "UnsafeCheckpointError", "dir_bytes", "load_tensors",
]

RETRY_STATUS = (408, 429, 500, 502, 503, 504)


class CheckpointDownloadError(CheckpointError):
    """The hub kept failing after all retries."""


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff: ``base_delay * 2**k`` capped at ``max_delay``, ``attempts`` tries."""

    attempts: int = 5
    base_delay: float = 1.0
    max_delay: float = 30.0

    def delay(self, attempt: int) -> float:
        return min(self.max_delay, self.base_delay * 2**attempt)


class Loaded(NamedTuple):
    revision: Revision
    tensors: dict[str, torch.Tensor]
    config: dict


def _retryable(err: BaseException) -> bool:
    if isinstance(err, (RepositoryNotFoundError, RevisionNotFoundError, EntryNotFoundError,
                        OfflineModeIsEnabled, UnsafeCheckpointError, CheckpointNotCachedError)):
        return isinstance(err, EntryNotFoundError) and err.__cause__ is not None and _retryable(
            err.__cause__)
    if isinstance(err, HfHubHTTPError):
        return err.response is not None and err.response.status_code in RETRY_STATUS
    import httpx2

    return isinstance(err, (httpx2.TransportError, ChecksumError, OSError))


def _is_offline() -> bool:
    env = os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")
    return constants.is_offline_mode() or env


class CheckpointSource:
    """Resolve, download, verify, load and evict checkpoint revisions of one model."""

    def __init__(self, model: str | os.PathLike, *, cache_dir: str | os.PathLike | None = None,
                 revision_for: Callable[[int], str] = steps_mod.revision,
                 endpoint: str | None = None, retry: RetryPolicy = RetryPolicy(),
                 token: str | bool | None = None, verify: bool = True):
        self.revision_for, self.retry, self.token, self.verify = revision_for, retry, token, verify
        endpoint = endpoint or os.environ.get("HF_ENDPOINT") or constants.ENDPOINT
        self.endpoint = endpoint.rstrip("/")
        self.local_dir: Path | None = None
        self.from_cache = False
        path = Path(model)
        cache = hub_cache_layout(path) if path.is_dir() else None
        if cache is not None:
            cache_dir, model, self.from_cache = cache[0], cache[1], True
        elif path.is_dir():
            self.local_dir = path
        self.model = str(model)
        self.cache_dir = Path(cache_dir or constants.HF_HUB_CACHE)
        self.api = HfApi(endpoint=self.endpoint, token=token)
        self._lock = threading.Condition()
        self._live: dict[str, dict[str, int]] = {}  # commit -> {blob etag: size}

    @property
    def offline(self) -> bool:
        return self.from_cache or _is_offline()

    @property
    def storage(self) -> Path:
        return self.cache_dir / f"models--{self.model.replace('/', '--')}"

    # ---- resolution ----------------------------------------------------------------------------
    def resolve(self, steps: Iterable[int]) -> list[Revision]:
        """Revisions for ``steps``: commit sha + files with sizes and hashes, nothing downloaded."""
        steps = list(steps)
        if self.local_dir is not None:
            return [self._resolve_local(s) for s in steps]
        branches = cached_branches(self.storage) if self.offline else self._hub_branches()
        revs = []
        for s in steps:
            branch = self.revision_for(s)
            if branch not in branches:
                self._missing_branch(s, branch, branches)
            commit = branches[branch]
            files = cached_files(self.storage, commit) if self.offline else self._hub_files(commit)
            revs.append(Revision(self.model, s, branch, commit, files))
        return revs

    def _missing_branch(self, step: int, branch: str, branches: dict) -> None:
        avail = sorted(x for b in branches if (x := steps_mod.step_of(b)) is not None)
        near = ", ".join(map(str, steps_mod.nearest_steps(step, avail)))
        where = f"the cache {self.storage}" if self.offline else f"{self.endpoint}"
        err = CheckpointNotCachedError if self.offline else steps_mod.StepError
        raise err(f"{self.model} has no branch {branch!r} in {where}; nearest available steps: "
                  f"{near or 'none'}")

    def _hub_branches(self) -> dict[str, str]:
        refs = self._with_retry(lambda: self.api.list_repo_refs(self.model), "list refs")
        return {b.name: b.target_commit for b in refs.branches}

    def _hub_files(self, commit: str) -> tuple[FileInfo, ...]:
        entries = self._with_retry(
            lambda: list(self.api.list_repo_tree(self.model, revision=commit)), "list files")
        return tuple(FileInfo(e.path, e.size, e.lfs.sha256 if e.lfs else None, e.blob_id)
                     for e in entries if hasattr(e, "size"))

    def _resolve_local(self, step: int) -> Revision:
        branch = self.revision_for(step)
        folder = self.local_dir / branch
        if not folder.is_dir():
            avail = sorted(x for p in self.local_dir.iterdir() if (x := steps_mod.step_of(p.name))
                           is not None)
            near = ", ".join(map(str, steps_mod.nearest_steps(step, avail))) or "none"
            raise CheckpointNotCachedError(f"no folder {folder}; nearest local steps: {near}")
        files = tuple(FileInfo(p.name, p.stat().st_size) for p in sorted(folder.iterdir())
                      if p.is_file())
        return Revision(self.model, step, branch, None, files, local_dir=str(folder))

    # ---- duplicates ----------------------------------------------------------------------------
    def weights_key(self, rev: Revision) -> tuple:
        """Identity of a revision's weight bytes (LFS sha256s; hashed locally when unknown)."""
        if rev.local_dir is not None:
            folder = Path(rev.local_dir)
            return tuple((f.path, sha256_file(folder / f.path)) for f in rev.weight_files)
        return tuple((f.path, f.etag, f.size) for f in rev.weight_files)

    def duplicates(self, revisions: Iterable[Revision]) -> dict[int, int]:
        """``{step: earlier step}`` for revisions whose weights are byte-identical to an earlier."""
        first: dict[tuple, int] = {}
        dups = {}
        for rev in sorted(revisions, key=lambda r: r.step):
            key = self.weights_key(rev)
            if key in first:
                dups[rev.step] = first[key]
            else:
                first[key] = rev.step
        return dups

    def manifest(self, revisions: Iterable[Revision]) -> dict:
        """Model, endpoint and each revision's commit and file hashes, for the run manifest."""
        revs = list(revisions)
        return {"model": self.model, "endpoint": None if self.local_dir else self.endpoint,
                "revisions": [r.manifest() for r in revs],
                "duplicates": {str(k): v for k, v in self.duplicates(revs).items()}}

    # ---- download + verification ---------------------------------------------------------------
    def _with_retry(self, fn: Callable, what: str):
        last: BaseException | None = None
        for attempt in range(self.retry.attempts):
            try:
                return fn()
            except Exception as err:  # noqa: BLE001 - classified below
                if not _retryable(err):
                    raise
                last = err
                if attempt + 1 < self.retry.attempts:
                    time.sleep(self.retry.delay(attempt))
        raise CheckpointDownloadError(
            f"{what} of {self.model} from {self.endpoint} failed after {self.retry.attempts} "
            f"attempts; last error: {type(last).__name__}: {last}") from last

    def files_to_fetch(self, rev: Revision, names: Names = None) -> list[FileInfo]:
        """config.json, the index and the weight files holding the asked tensors."""
        index = rev.index_file
        out = [f for f in (rev.file("config.json"), index) if f is not None]
        if index is None or names is None:
            return out + list(rev.weight_files)
        shards = shards_for(self._fetch_file(rev, index), names)
        return out + [f for f in rev.weight_files if f.path in shards]

    def _fetch_file(self, rev: Revision, f: FileInfo) -> Path:
        if rev.local_dir is not None:
            return Path(rev.local_dir) / f.path
        if self.offline:
            p = self.storage / "snapshots" / rev.commit / f.path
            if not p.exists():
                raise CheckpointNotCachedError(
                    f"offline and {f.path} of {self.model}@{rev.branch} ({rev.commit}) is not "
                    f"cached under {p.parent}")
            self._check(p, f)
            return p
        return self._with_retry(lambda: self._download(rev, f),
                                f"download of {f.path} at {rev.branch} ({rev.commit})")

    def _download(self, rev: Revision, f: FileInfo) -> Path:
        fresh = f.sha256 is not None and not (self.storage / "blobs" / f.sha256).exists()
        if fresh:  # LFS blob: resumable across processes, sha256-checked before it is placed
            self._download_blob(rev, f)
        p = Path(hf_hub_download(self.model, f.path, revision=rev.commit, cache_dir=self.cache_dir,
                                 endpoint=self.endpoint, token=self.token))
        if not fresh:
            self._check(p, f)
        return p

    def _download_blob(self, rev: Revision, f: FileInfo) -> Path:
        url = hf_hub_url(self.model, f.path, revision=rev.commit, endpoint=self.endpoint)
        meta = get_hf_file_metadata(url, token=self.token, endpoint=self.endpoint)
        headers = build_hf_headers(token=self.token)
        lock = self.cache_dir / ".locks" / self.storage.name / f"{f.sha256}.partial.lock"
        return download_resumable(meta.location, self.storage / "blobs" / f.sha256, f, headers,
                                  lock, verify=self.verify)

    def _check(self, p: Path, f: FileInfo) -> None:
        """Verify size and hash (unless ``verify=False``); a bad blob is deleted and re-fetched."""
        if self.verify:
            verify_file(p, f)

    def fetch(self, rev: Revision, names: Names = None) -> dict[str, Path]:
        """Download (or find) and verify the files needed for ``names``: ``{path: local path}``."""
        files = self.files_to_fetch(rev, names)
        self._reserve(rev, files)
        paths = {f.path: self._fetch_file(rev, f) for f in files}
        if rev.local_dir is None and not self.offline:  # branch -> commit, for offline use later
            (self.storage / "refs").mkdir(parents=True, exist_ok=True)
            (self.storage / "refs" / rev.branch).write_text(rev.commit)
        return paths

    # ---- loading -------------------------------------------------------------------------------
    def load(self, rev: Revision, paths: dict[str, Path], names: Names = None) -> Loaded:
        """Load config.json and the asked tensors (legacy buffers skipped) from fetched files."""
        files = [paths[f.path] for f in rev.weight_files if f.path in paths]
        tensors = load_weight_files(files, names, f"{rev.model}@{rev.branch}")
        config = json.loads(paths["config.json"].read_text()) if "config.json" in paths else {}
        return Loaded(rev, tensors, config)

    # ---- disk budget + eviction ----------------------------------------------------------------
    def _reserve(self, rev: Revision, files: list[FileInfo]) -> None:
        if rev.local_dir is not None or self.offline:
            return
        with self._lock:
            blobs = self._live.setdefault(rev.commit, {})
            blobs.update({f.etag: f.size for f in files})
            self._lock.notify_all()

    def live_bytes(self) -> int:
        """Bytes of the distinct blobs of fetched, not yet evicted revisions."""
        with self._lock:
            return sum({k: v for b in self._live.values() for k, v in b.items()}.values())

    def _wait_for_budget(self, rev: Revision, need: list[FileInfo], max_disk: float | None) -> None:
        if max_disk is None or rev.local_dir is not None or self.offline:
            return
        with self._lock:
            while True:
                live = {k: v for b in self._live.values() for k, v in b.items()}
                extra = sum(f.size for f in need if f.etag not in live)
                if sum(live.values()) + extra <= max_disk:
                    return
                if not live:
                    raise CheckpointError(
                        f"{rev.branch} needs {extra} bytes, more than max_disk={int(max_disk)}")
                self._lock.wait(timeout=1.0)

    def evict(self, rev: Revision, *, keep_partial: bool = False) -> None:
        """Delete a revision's snapshot and the blobs (and ``.partial`` downloads) no other live
        revision uses (hub cache). ``keep_partial`` keeps unfinished downloads for a later run."""
        if rev.local_dir is not None or self.offline:
            return
        with self._lock:
            mine = self._live.pop(rev.commit, {})
            others = {k for b in self._live.values() for k in b}
            shutil.rmtree(self.storage / "snapshots" / rev.commit, ignore_errors=True)
            for etag in set(mine) - others:
                (self.storage / "blobs" / etag).unlink(missing_ok=True)
                if not keep_partial:
                    partial_path(self.storage / "blobs" / etag).unlink(missing_ok=True)
            self._lock.notify_all()

    def disk_usage(self) -> int:
        """Bytes of regular files under this model's cache folder."""
        return dir_bytes(self.storage)

    # ---- streaming -----------------------------------------------------------------------------
    def _prepare(self, rev: Revision, names: Names, max_disk: float | None) -> dict[str, Path]:
        self._wait_for_budget(rev, self.files_to_fetch(rev, names), max_disk)
        return self.fetch(rev, names)

    def stream(self, revisions: Iterable[Revision], *, names: Names = None, prefetch: int = 1,
               max_disk: float | None = None, skip_duplicates: bool = False,
               keep: bool = False) -> Iterator[Loaded]:
        """Yield ``(revision, tensors, config)`` in order, fetching ``prefetch`` revisions ahead.

        Each revision is evicted when the caller asks for the next one (unless ``keep``);
        the cache holds at most ``prefetch + 1`` revisions and never more than ``max_disk`` bytes.
        """
        if prefetch < 0:
            raise ValueError(f"prefetch must be >= 0, got {prefetch}")
        names = tuple(names) if names is not None and not callable(names) else names
        revs = list(revisions)
        if skip_duplicates:
            dups = self.duplicates(revs)
            revs = [r for r in revs if r.step not in dups]
        pending: deque[tuple[Revision, Future]] = deque()
        todo = iter(revs)
        current = None
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-prefetch") as pool:
            def submit() -> None:
                rev = next(todo, None)
                if rev is not None:
                    pending.append((rev, pool.submit(self._prepare, rev, names, max_disk)))

            try:
                for _ in range(prefetch + 1):
                    submit()
                while pending:
                    current, fut = pending.popleft()
                    yield self.load(current, fut.result(), names)
                    if not keep:
                        self.evict(current)
                    current = None
                    submit()
            finally:
                self._abandon(pending, current, keep)

    def _abandon(self, pending: deque, current: Revision | None, keep: bool) -> None:
        """On early exit or error: cancel prefetches, wait for the running one, evict all
        (unfinished ``.partial`` downloads stay, so a rerun resumes them)."""
        for _, fut in pending:
            fut.cancel()
        for _, fut in pending:
            if not fut.cancelled():
                fut.exception()
        if not keep:
            for rev in [r for r, _ in pending] + ([current] if current is not None else []):
                self.evict(rev, keep_partial=True)

