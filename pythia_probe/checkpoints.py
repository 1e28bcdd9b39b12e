"""Stream checkpoint revisions from the hub (or local folders) with bounded disk and verified bytes.

API::

    src = CheckpointSource("EleutherAI/pythia-1.4b")   # the tool's own cache; or cache_dir=...,
    revs = src.resolve([0, 1, 1000, 2000])           # or a local folder / hub-style cache
    dups = src.duplicates(revs)                # {1: 0}: step1's weights are byte-identical to step0
    for rev, tensors, config in src.stream(revs, names=arch.name_filter("embed", "unembed"),
                                           prefetch=1, max_disk=8e9, skip_duplicates=True):
        ...                                    # tensors {hf_name: Tensor}; config.json dict
    src.manifest(revs)                         # commit shas + file hashes for the run manifest

- ``resolve`` reads every branch's commit (one ``list_repo_refs`` call per source) and each
  revision's files with sizes and hashes (``list_repo_tree``) before anything is downloaded;
  every name and hash is validated first (a hash or commit that is really a path raises
  :class:`UnsafeCheckpointError`). Unknown steps raise :class:`~pythia_probe.steps.StepError`
  naming the nearest valid steps.
- Every file is verified before use against the tree API's hash (LFS sha256, or the git blob id
  of small files): weights, config, index, tokenizer files, in the cache or freshly downloaded.
  Bad bytes are fetched once more, then reported as :class:`ChecksumError` naming the file; a
  bad copy the tool created is deleted, one it did not create is left and named.
- Ownership: by default files go to the tool's own cache (``hubio.tool_cache("checkpoints")``),
  never the Hugging Face cache. In any cache folder (``cache_dir=`` may be the user's HF cache)
  the tool deletes only what it created, recorded in a ledger, and only when no other live
  source uses it (:mod:`pythia_probe.hubcache`). Snapshots already there are read (verified)
  and kept.
- ``stream`` fetches ``prefetch`` revisions ahead in a background thread, resumes weight files
  across processes (``blobs/<sha256>.partial`` + HTTP Range), retries every hub call with
  :class:`RetryPolicy`, loads only the asked tensors (safetensors per tensor; ``.bin`` with
  ``torch.load(weights_only=True, mmap=True)``; sharded checkpoints download only the shards
  holding asked tensors), skips legacy buffers, and evicts each revision once the caller asks
  for the next one, keeping the tool's files under ``max_disk`` bytes. ``keep=True`` keeps them
  (e.g. to populate a cache for offline use).
- Offline (``HF_HUB_OFFLINE=1``) and hub-style cache folders: refs and snapshots as
  ``scan_cache_dir`` reads them (symlinks to blobs or plain files); files are checked against
  the listing saved when they were fetched, else against the hash their blob is named after.
- Local sources: a folder with one sub-folder per step (``step1000/``). Never deleted.
- Lower level: ``fetch(rev, names) -> {path: local Path}``, ``fetch_file(rev, name)``,
  ``read_json(rev, name)``, ``load(rev, paths, names) -> Loaded``, ``evict(rev)``, ``steps()``,
  ``live_bytes()`` (bytes reserved by fetched, not evicted revisions: what ``max_disk`` bounds),
  ``disk_usage()`` (walks the repo's cache folder).
"""

from __future__ import annotations

import os
import re
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import torch
from huggingface_hub import HfApi

from pythia_probe import hubio
from pythia_probe import steps as steps_mod
from pythia_probe.errors import UnsafeFileError
from pythia_probe.hubcache import HubCache
from pythia_probe.hubio import RETRY_STATUS, RetryPolicy
from pythia_probe.weights_io import (
    INDEX_NAMES,
    WEIGHT_SUFFIXES,
    CheckpointDiskError,
    CheckpointDownloadError,
    CheckpointError,
    CheckpointNotCachedError,
    ChecksumError,
    CorruptCheckpointError,
    FileInfo,
    MissingTensorError,
    Names,
    Revision,
    UnsafeCheckpointError,
    dir_bytes,
    file_digest,
    file_matches,
    hub_cache_layout,
    load_tensors,
    load_weight_files,
    read_json,
    shards_for,
)

__all__ = [
    "INDEX_NAMES", "RETRY_STATUS", "WEIGHT_SUFFIXES", "CheckpointDiskError",
    "CheckpointDownloadError", "CheckpointError", "CheckpointNotCachedError", "CheckpointSource",
    "ChecksumError", "CorruptCheckpointError", "FileInfo", "Loaded", "MissingTensorError",
    "Names", "Revision", "RetryPolicy", "UnsafeCheckpointError", "dir_bytes", "load_tensors",
]

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


class Loaded(NamedTuple):
    revision: Revision
    tensors: dict[str, torch.Tensor]
    config: dict


def _local_or_hub(model: str | os.PathLike) -> tuple[Path | None, Path | None]:
    """``(step-folder dir, hub-style cache dir)`` for a local path; a string that is neither
    a folder nor a hub id (or whose first part is a local folder) is a mistyped path."""
    path = Path(model).expanduser()
    if path.is_dir():
        return (None, path) if hub_cache_layout(path) else (path, None)
    text = str(model)
    if not _HUB_ID.fullmatch(text) or Path(text.split("/")[0]).is_dir():
        raise CheckpointNotCachedError(
            f"model {text!r}: no such folder, and not a hub id (ORG/NAME); give a hub id or a "
            "folder holding step*/ sub-folders or a hub cache (models--ORG--NAME)")
    return None, None


class CheckpointSource:
    """Resolve, download, verify, load and evict checkpoint revisions of one model."""

    def __init__(self, model: str | os.PathLike, *, cache_dir: str | os.PathLike | None = None,
                 revision_for: Callable[[int], str] = steps_mod.revision,
                 endpoint: str | None = None, retry: RetryPolicy | None = None,
                 token: str | bool | None = None):
        self.revision_for, self.retry, self.token = revision_for, retry, token
        self.endpoint = (endpoint or hubio.endpoint()).rstrip("/")
        self.local_dir, as_cache = _local_or_hub(model)
        self.from_cache = as_cache is not None
        if as_cache is not None:
            cache_dir, model = hub_cache_layout(as_cache)
        self.model = str(model)
        self.cache_dir = Path(cache_dir) if cache_dir else hubio.tool_cache("checkpoints")
        self.cache = HubCache(self.cache_dir, self.model)
        self.api = HfApi(endpoint=self.endpoint, token=token)
        self._lock = threading.Condition()
        self._live: dict[str, dict[str, int]] = {}  # commit -> {blob hash: size}: the budget
        self._held: dict[str, dict[str, FileInfo]] = {}  # commit -> files this source leased
        self._branches: dict[str, str] | None = None
        self._trees: dict[str, tuple[FileInfo, ...]] = {}
        self._cached: dict[str, tuple[str, dict[str, Path]]] | None = None

    @property
    def offline(self) -> bool:
        return self.from_cache or hubio.offline()

    @property
    def storage(self) -> Path:
        return self.cache.storage

    # ---- resolution ----------------------------------------------------------------------------
    def steps(self) -> list[int]:
        """Steps this source has: step folders, cached refs (offline), else the hub's branches."""
        if self.local_dir is not None:
            names = [p.name for p in self.local_dir.iterdir() if p.is_dir()]
        else:
            names = list(self.branches())
        return sorted(s for n in names if (s := steps_mod.step_of(n)) is not None)

    def branches(self) -> dict[str, str]:
        """``{branch: commit}``: the hub's (listed once per source, retried) or the cache's."""
        if self.offline:
            return {b: c for b, (c, _) in self._scan().items()}
        if self._branches is None:
            refs = self._call(lambda: self.api.list_repo_refs(self.model),
                              f"listing the branches of {self.model}")
            self._branches = {b.name: b.target_commit for b in refs.branches}
        return self._branches

    def resolve(self, steps: Iterable[int]) -> list[Revision]:
        """Revisions for ``steps``: commit sha + files with sizes and hashes, nothing downloaded."""
        steps = list(steps)
        if self.local_dir is not None:
            return [self._resolve_local(s) for s in steps]
        branches = self.branches()
        revs = []
        for s in steps:
            branch = self.revision_for(s)
            if branch not in branches:
                self._missing_branch(s, branch, branches)
            commit = self._commit(branches[branch], branch)
            files = self._cached_files(branch) if self.offline else self._hub_files(commit)
            revs.append(Revision(self.model, s, branch, commit, files))
        return revs

    def _commit(self, commit: object, branch: str) -> str:
        try:
            return hubio.check_oid(commit, f"the commit of {self.model}@{branch}")
        except UnsafeFileError as err:
            raise UnsafeCheckpointError(str(err)) from err

    def _missing_branch(self, step: int, branch: str, branches: dict) -> None:
        avail = sorted(x for b in branches if (x := steps_mod.step_of(b)) is not None)
        near = ", ".join(map(str, steps_mod.nearest_steps(step, avail)))
        where = f"the cache {self.storage}" if self.offline else f"{self.endpoint}"
        err = CheckpointNotCachedError if self.offline else steps_mod.StepError
        raise err(f"{self.model} has no branch {branch!r} in {where}; nearest available steps: "
                  f"{near or 'none'}")

    def _hub_files(self, commit: str) -> tuple[FileInfo, ...]:
        if commit not in self._trees:
            where = f"{self.model}@{commit}"
            entries = self._call(lambda: list(self.api.list_repo_tree(self.model, revision=commit)),
                                 f"listing the files of {where}")
            self._trees[commit] = tuple(
                FileInfo.from_hub(e.path, e.size, e.lfs.sha256 if e.lfs else None, e.blob_id,
                                  where) for e in entries if hasattr(e, "size"))
        return self._trees[commit]

    def _scan(self) -> dict[str, tuple[str, dict[str, Path]]]:
        """The cache's refs and snapshots, read once per source."""
        if self._cached is None:
            self._cached = self.cache.cached()
        return self._cached

    def _cached_files(self, branch: str) -> tuple[FileInfo, ...]:
        commit, files = self._scan()[branch]
        tree = self.cache.load_tree(commit)
        return tuple(self.cache.cached_file(commit, n, p, tree) for n, p in sorted(files.items()))

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
        """Identity of a revision's weight bytes (hub hashes; hashed locally when unknown)."""
        if rev.local_dir is not None or any(f.sha256 is None for f in rev.weight_files):
            return tuple((f.path, file_digest(self.fetch_file(rev, f.path), True))
                         for f in rev.weight_files)
        return tuple((f.path, f.sha256, f.size) for f in rev.weight_files)

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

    # ---- fetching + verification ---------------------------------------------------------------
    def _call(self, fn: Callable, what: str):
        return hubio.call(fn, what, self.retry, fail=CheckpointDownloadError,
                          missing=CheckpointNotCachedError)

    def files_to_fetch(self, rev: Revision, names: Names = None) -> list[FileInfo]:
        """config.json, the index and the weight files holding the asked tensors."""
        index = rev.index_file
        out = [f for f in (rev.file("config.json"), index) if f is not None]
        if index is None or names is None:
            return out + list(rev.weight_files)
        what = f"{index.path} of {rev.where}"
        shards = shards_for(self.fetch_file(rev, index.path), names, what)
        unknown = sorted(shards - {f.path for f in rev.weight_files})
        if unknown:
            raise CorruptCheckpointError(f"{what} names shard files {unknown} that the revision "
                                         "does not have")
        return out + [f for f in rev.weight_files if f.path in shards]

    def bytes_to_download(self, rev: Revision, names: Names = None) -> int:
        """Bytes of the files ``names`` needs that are not in the cache yet (size-checked; the
        hash is checked when they are used). Local folders: 0."""
        if rev.local_dir is not None:
            return 0
        return sum(f.size for f in self.files_to_fetch(rev, names)
                   if (found := self.cache.find(rev.commit, f)) is None
                   or found.stat().st_size != f.size)

    def fetch_file(self, rev: Revision, name: str) -> Path:
        """One file of a revision on local disk, verified (downloaded if needed)."""
        f = rev.file(name)
        if f is None:
            raise CheckpointNotCachedError(f"{rev.where} has no file {name}; it has "
                                           f"{sorted(x.path for x in rev.files)}")
        if rev.local_dir is not None:
            return Path(rev.local_dir) / f.path
        f.checked_name(rev.where)
        if self.offline:
            return self._cached_copy(rev, f)
        return self._call(lambda: self._fetch_online(rev, f),
                          f"download of {f.path} at {rev.branch} ({rev.commit})")

    def read_json(self, rev: Revision, name: str) -> dict:
        """A verified JSON file of a revision (config.json, an index), parsed."""
        return read_json(self.fetch_file(rev, name), f"{name} of {rev.where}")

    def config(self, rev: Revision) -> dict:
        """The revision's config.json."""
        return self.read_json(rev, "config.json")

    def _cached_copy(self, rev: Revision, f: FileInfo) -> Path:
        found = self.cache.find(rev.commit, f)
        if found is None:
            raise CheckpointNotCachedError(
                f"offline and {f.path} of {rev.where} ({rev.commit}) is not cached under "
                f"{self.storage / 'snapshots' / rev.commit}")
        if not file_matches(found, f):
            gone = not self.from_cache and self.cache.discard(found, rev.commit, f)
            raise ChecksumError(f"{f.path} of {rev.where}: the cached copy {found} does not match "
                                f"the hub's size/hash ({f.size} bytes, {f.etag}); "
                                + ("deleted it, run online to fetch it again" if gone else
                                   "pythia_probe did not create it, so it is left in place"))
        return found

    def _fetch_online(self, rev: Revision, f: FileInfo) -> Path:
        with self._lock:  # leased before the blob's lock: other processes see it at once
            self._held.setdefault(rev.commit, {})[f.path] = f
            self.cache.lease(f.etag)
        with self.cache.lock(f.etag):
            found = self.cache.find(rev.commit, f)
            if found is not None and file_matches(found, f):
                path = self.cache.link(rev.commit, f, found)
            else:
                if found is not None and not self.cache.discard(found, rev.commit, f):
                    raise ChecksumError(
                        f"{f.path} of {rev.where}: the cached copy {found} does not match the "
                        f"hub's size/hash ({f.size} bytes, {f.etag}); pythia_probe did not "
                        "create it, so it is left in place: delete it or use another cache_dir")
                path = self._download(rev, f)
            self.cache.save_tree(rev.commit, self._trees.get(rev.commit, rev.files))
            self.cache.write_ref(rev.branch, rev.commit)
        return path

    def _download(self, rev: Revision, f: FileInfo) -> Path:
        url = hubio.resolve_url(self.endpoint, self.model, rev.commit, f.path)
        remote = hubio.Remote(url, f"{f.path} of {rev.where}", f.size, f.sha256, f.git_oid)
        part = hubio.download(remote, self.cache.blob(f.etag), [self.storage / "blobs"],
                              self.token, mismatch=ChecksumError)
        return self.cache.place(rev.commit, f, part)

    def fetch(self, rev: Revision, names: Names = None) -> dict[str, Path]:
        """Download (or find) and verify the files needed for ``names``: ``{path: local path}``."""
        files = self.files_to_fetch(rev, names)
        self._reserve(rev, files)
        return {f.path: self.fetch_file(rev, f.path) for f in files}

    # ---- loading -------------------------------------------------------------------------------
    def load(self, rev: Revision, paths: dict[str, Path], names: Names = None) -> Loaded:
        """Load config.json and the asked tensors (legacy buffers skipped) from fetched files."""
        files = [paths[f.path] for f in rev.weight_files if f.path in paths]
        tensors = load_weight_files(files, names, rev.where)
        config = (read_json(paths["config.json"], f"config.json of {rev.where}")
                  if "config.json" in paths else {})
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
                    raise CheckpointDiskError(
                        f"{rev.where} needs {extra} bytes, more than max_disk={int(max_disk)}; "
                        "raise the disk budget or ask for fewer tensors")
                self._lock.wait(timeout=1.0)

    def evict(self, rev: Revision, *, keep_partial: bool = False) -> None:
        """Delete the revision's files that this tool created and no other live revision or
        source uses (snapshot entries, blobs, ``.partial`` downloads unless ``keep_partial``).
        Files the tool did not create, local folders and read-only caches are never touched."""
        if rev.local_dir is not None or self.offline:
            return
        with self._lock:  # leases change only under this lock, with what they record
            held = self._held.pop(rev.commit, {})
            for etag in {f.etag for f in held.values()} - self._used_etags():
                self.cache.unlease(etag)
        self.cache.release(rev.commit, rev.branch, list(held.values()), self._still_used,
                           keep_partial)
        with self._lock:  # the budget is freed once the files are gone
            self._live.pop(rev.commit, None)
            self._lock.notify_all()

    def forget(self, rev: Revision) -> None:
        """Stop using a revision without deleting anything: its budget and leases are dropped,
        so a later run (or another source) may evict the files the tool created."""
        self._forget(rev.commit)

    def _forget(self, commit: str) -> None:
        with self._lock:
            held = self._held.pop(commit, {})
            for etag in {f.etag for f in held.values()} - self._used_etags():
                self.cache.unlease(etag)
            self._live.pop(commit, None)
            self._lock.notify_all()

    def close(self) -> None:
        """Forget every revision still held (planning fetches, ``keep=True`` streams)."""
        with self._lock:
            commits = list(self._held)
        for commit in commits:
            self._forget(commit)

    def __enter__(self) -> CheckpointSource:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _used_etags(self) -> set[str]:
        return {f.etag for files in self._held.values() for f in files.values()}

    def _still_used(self, etag: str) -> bool:
        with self._lock:
            return etag in self._used_etags()

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
                    (self.forget if keep else self.evict)(current)
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
        for rev in [r for r, _ in pending] + ([current] if current is not None else []):
            if keep:
                self.forget(rev)
            else:
                self.evict(rev, keep_partial=True)
