"""Stream checkpoint revisions from the hub (or local folders) with bounded disk and verified bytes.

API::

    src = CheckpointSource("EleutherAI/pythia-1.4b")   # the tool's own cache; or cache_dir=...,
    revs = src.resolve([0, 1, 1000, 2000])           # or a local folder / hub-style cache
    dups = src.duplicates(revs)                # {1: 0}: step1's weights are byte-identical to step0
    for rev, tensors, config in src.stream(revs, names=arch.name_filter("embed", "unembed"),
                                           prefetch=1, max_disk=8e9, skip_duplicates=True):
        ...                                    # tensors {hf_name: Tensor}; config.json dict
    src.manifest(revs)                         # commit shas + file hashes for the run manifest

- ``resolve`` (:class:`~pythia_probe.hub.catalog.CheckpointCatalog`) reads every branch's commit
  and each revision's files with sizes and hashes before anything is downloaded (the hub's
  listings, the cache offline, or local folders); ``resolve_cached`` / ``cached_steps`` read the
  cache alone, with no request, for plans when the hub cannot be reached.
- Every file is verified before use against the tree API's hash (LFS sha256, or the git blob id
  of small files): weights, config, index, tokenizer files, in the cache or freshly downloaded.
  Bad bytes are fetched once more, then reported as :class:`ChecksumError` naming the file; a
  bad copy the tool created is deleted, one it did not create is left and named.
- Ownership: by default files go to the tool's own cache (``hubio.tool_cache("checkpoints")``),
  never the Hugging Face cache. In any cache folder (``cache_dir=`` may be the user's HF cache)
  the tool deletes only what it created, recorded in a ledger, and only when no other live
  source uses it (:mod:`pythia_probe.hub.cache`). Snapshots already there are read (verified)
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
- Many models: ``plan_downloads(sources, steps)`` groups the (model, step) tasks by weights
  digest (metadata only) so that ``stream_plan(plan, sources)`` fetches each distinct
  checkpoint once, in an order that keeps each model's fetches together.
- Lower level: ``fetch(rev, names) -> {path: local Path}``, ``fetch_file(rev, name)``,
  ``read_json(rev, name)``, ``load(rev, paths, names) -> Loaded``, ``evict(rev)``, ``steps()``,
  ``live_bytes()`` (bytes reserved by fetched, not evicted revisions: what ``max_disk`` bounds),
  ``disk_usage()`` (walks the repo's cache folder).
"""

from __future__ import annotations

import itertools
import os
from collections import defaultdict, deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch

from pythia_probe.errors import (
    CheckpointNotCachedError,
    ChecksumError,
    CorruptCheckpointError,
    UnsafeCheckpointError,
)
from pythia_probe.hub import io as hubio
from pythia_probe.hub.cache import Holdings
from pythia_probe.hub.catalog import CheckpointCatalog
from pythia_probe.hub.io import RetryPolicy
from pythia_probe.hub.weights import (
    FileInfo,
    Names,
    Revision,
    dir_bytes,
    file_digest,
    file_matches,
    load_weight_files,
    read_json,
    shards_for,
    weights_digest,
)

__all__ = ["CheckpointSource", "DownloadPlan", "FileInfo", "Group", "Loaded", "Names",
           "Revision", "RetryPolicy", "Task", "confirm_shared", "dir_bytes", "plan_downloads",
           "stream_plan"]


class Loaded(NamedTuple):
    revision: Revision
    tensors: dict[str, torch.Tensor]
    config: dict


class CheckpointSource(CheckpointCatalog):
    """Resolve, download, verify, load and evict checkpoint revisions of one model (resolving:
    :class:`~pythia_probe.hub.catalog.CheckpointCatalog`)."""

    def __init__(self, model: str | os.PathLike, **kw):
        """``model``: a hub id, a folder of step*/ sub-folders or a hub-style cache folder;
        ``cache_dir``, ``revision_for``, ``endpoint``, ``retry``, ``token``: see
        :class:`~pythia_probe.hub.catalog.CheckpointCatalog`."""
        super().__init__(model, **kw)
        self.holdings = Holdings(self.cache)  # leases and the disk budget of this source
        self._confirmed: set[tuple[str, str]] = set()  # (commit, file) served as listed

    # ---- duplicates ----------------------------------------------------------------------------
    def file_identity(self, rev: Revision, f: FileInfo) -> str:
        """A weight file's identity, never downloading it: the hub's sha256 (else its git blob
        id, ``git-blob:<id>``); local folders, and cached copies whose listing gives no
        sha256, are hashed where they lie."""
        if rev.local_dir is None and f.sha256:
            return f.sha256
        if rev.local_dir is None and not self.offline:
            return f"git-blob:{f.git_oid}"
        return file_digest(self.fetch_file(rev, f.path), True)

    def weights_digest(self, rev: Revision) -> str:
        """One digest of the revision's weight files
        (:func:`~pythia_probe.hub.weights.weights_digest`): equal digests, equal bytes."""
        return weights_digest({f.path: self.file_identity(rev, f) for f in rev.weight_files})

    def confirm(self, rev: Revision, f: FileInfo) -> None:
        """Trust bytes over listings: what the hub serves for weight file ``f`` of ``rev`` (the
        ``X-Linked-Etag`` of a HEAD: its sha256; ``ETag``: the git blob id of a small file;
        offline, the cached copy hashed) must be what the tree listing says, else
        :class:`~pythia_probe.errors.UnsafeCheckpointError` naming the file. Once per file and
        source; no byte is downloaded. Local folders (and cached files listed without a sha256)
        were identified by hashing their bytes already."""
        by_bytes = rev.local_dir is not None or (self.offline and f.sha256 is None)
        if by_bytes or (rev.commit, f.path) in self._confirmed:
            return
        served, how = self._served(rev, f)
        if served != f.etag:
            kind = "sha256" if f.sha256 else "git blob id"
            raise UnsafeCheckpointError(
                f"{f.path} of {rev.where}: the hub's tree listing gives it {kind} {f.etag}, but "
                f"{how} says {served}; the listing cannot say which steps share weights, so no "
                "step is filed as a duplicate or suspect and no rows are copied (is HF_ENDPOINT "
                "a trustworthy hub?)")
        self._confirmed.add((rev.commit, f.path))

    def _served(self, rev: Revision, f: FileInfo) -> tuple[str | None, str]:
        """(the identity of what is served for ``f``, where it was read)."""
        if not self.offline:
            url = hubio.resolve_url(self.endpoint, self.model, rev.commit, f.path)
            return (self._call(lambda: hubio.served_etag(url, self.token),
                               f"HEAD of {f.path} at {rev.where} ({rev.commit})"),
                    "the X-Linked-Etag / ETag of the file it serves")
        found = self.cache.find(rev.commit, f)
        if found is None:
            raise CheckpointNotCachedError(f"offline and {f.path} of {rev.where} is not cached "
                                           f"under {self.storage}")
        return file_digest(found, f.sha256 is not None), f"the cached copy {found}"

    def duplicates(self, revisions: Iterable[Revision]) -> dict[int, int]:
        """``{step: earlier step}`` for revisions whose weights are byte-identical to an earlier
        (the listing's verdict confirmed by :func:`confirm_shared`)."""
        first: dict[str, int] = {}
        dups = {}
        revisions = sorted(revisions, key=lambda r: r.step)
        confirm_shared([(self, r, f) for r in revisions for f in r.weight_files])
        for rev in revisions:
            key = self.weights_digest(rev)
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
        self.holdings.hold(rev.commit, f)
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
                              self.token)
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
        if rev.local_dir is None and not self.offline:
            self.holdings.reserve(rev.commit, files)

    def live_bytes(self) -> int:
        """Bytes of the distinct blobs of fetched, not yet evicted revisions."""
        return self.holdings.live_bytes()

    def _wait_for_budget(self, rev: Revision, need: list[FileInfo], max_disk: float | None) -> None:
        if max_disk is not None and rev.local_dir is None and not self.offline:
            self.holdings.wait_for(need, max_disk, rev.where)

    def evict(self, rev: Revision, *, keep_partial: bool = False) -> None:
        """Delete the revision's files that this tool created and no other live revision or
        source uses (snapshot entries, blobs, ``.partial`` downloads unless ``keep_partial``).
        Files the tool did not create, local folders and read-only caches are never touched."""
        if rev.local_dir is not None or self.offline:
            return
        held = self.holdings.drop(rev.commit)
        self.cache.release(rev.commit, rev.branch, held, self.holdings.still_used, keep_partial)
        self.holdings.unreserve(rev.commit)  # the budget is freed once the files are gone

    def forget(self, rev: Revision) -> None:
        """Stop using a revision without deleting anything: its budget and leases are dropped,
        so a later run (or another source) may evict the files the tool created."""
        self._forget(rev.commit)

    def _forget(self, commit: str) -> None:
        self.holdings.drop(commit)
        self.holdings.unreserve(commit)

    def close(self) -> None:
        """Forget every revision still held (planning fetches, ``keep=True`` streams)."""
        for commit in self.holdings.commits():
            self._forget(commit)

    def __enter__(self) -> CheckpointSource:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

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


def confirm_shared(files: Iterable[tuple[CheckpointSource, Revision, FileInfo]]) -> None:
    """Confirm (:meth:`CheckpointSource.confirm`) every weight file whose listed identity
    another file of ``files`` (of another commit or name) shares: the grounds of every
    duplicate, suspect or copy verdict, checked before any is acted on."""
    same: dict[str, list] = defaultdict(list)
    for src, rev, f in files:
        same[src.file_identity(rev, f)].append((src, rev, f))
    for held in same.values():
        if len({(r.model, r.commit or r.local_dir, f.path) for _, r, f in held}) > 1:
            for src, rev, f in held:
                src.confirm(rev, f)


# ---- many models: each distinct checkpoint fetched once ----------------------------------------
class Task(NamedTuple):
    """One unit of a sweep: one step of one model."""

    model: str
    step: int


@dataclass(frozen=True)
class Group:
    """Tasks whose weights are byte-identical (one weights digest): fetched once, through the
    first task's model (``leader``); ``nbytes``: its files' bytes (config, index, weights)."""

    digest: str
    tasks: tuple[Task, ...]
    nbytes: int

    @property
    def leader(self) -> Task:
        return self.tasks[0]


@dataclass(frozen=True)
class DownloadPlan:
    """(model, step) tasks of one or more models grouped by weights digest, in the order to
    run them: every group sits at its first task, so each model's leaders stay contiguous (and
    prefetch keeps working) and no checkpoint is downloaded twice, within a model (step1 =
    step0) or across models (a -deduped twin, a branch serving another's weights)."""

    groups: tuple[Group, ...]

    def leaders(self) -> dict[str, list[int]]:
        """``{model: steps to fetch}``, in plan order."""
        out: dict[str, list[int]] = {}
        for g in self.groups:
            out.setdefault(g.leader.model, []).append(g.leader.step)
        return out

    def copies(self) -> dict[Task, Task]:
        """``{task: its group's leader}`` for every task that is not fetched itself."""
        return {t: g.leader for g in self.groups for t in g.tasks[1:]}

    @property
    def nbytes(self) -> int:
        """Bytes fetched by the plan (each group once)."""
        return sum(g.nbytes for g in self.groups)

    @property
    def naive_nbytes(self) -> int:
        """Bytes a sweep fetching every task would download."""
        return sum(g.nbytes * len(g.tasks) for g in self.groups)


def plan_downloads(sources: Sequence[CheckpointSource],
                   steps: Mapping[str, Iterable[int]] | Iterable[int]) -> DownloadPlan:
    """The plan for ``steps`` (one list for every source, or ``{model: steps}``) of ``sources``
    (in the order given), from metadata alone: hub-listed sha256 (local folders: hashed), a
    shared one confirmed against what the hub serves (:func:`confirm_shared`)."""
    if not isinstance(steps, Mapping):
        steps = {src.model: list(steps) for src in sources}
    by_digest: dict[str, list[tuple[Task, Revision]]] = {}
    listed = []
    for src in sources:
        for rev in src.resolve(sorted(set(steps[src.model]))):
            by_digest.setdefault(src.weights_digest(rev), []).append((Task(src.model, rev.step),
                                                                      rev))
            listed += [(src, rev, f) for f in rev.weight_files]
    confirm_shared(listed)
    return DownloadPlan(tuple(Group(d, tuple(t for t, _ in tr), tr[0][1].nbytes)
                              for d, tr in by_digest.items()))


def stream_plan(plan: DownloadPlan, sources: Sequence[CheckpointSource], *,
                names: Names = None, prefetch: int = 1,
                max_disk: float | None = None) -> Iterator[tuple[Group, Loaded]]:
    """Yield ``(group, loaded)`` in plan order: each group's leader fetched once through its
    model's source (``prefetch`` ahead within each run of one model's leaders, ``max_disk``
    per source), evicted when the next is asked for. Every task of the group has these
    weights: score each, or copy the leader's rows where the statistics are the same."""
    by_model = {src.model: src for src in sources}
    for model, run in itertools.groupby(plan.groups, key=lambda g: g.leader.model):
        src = by_model[model]
        of_step = {g.leader.step: g for g in run}
        for loaded in src.stream(src.resolve(list(of_step)), names=names, prefetch=prefetch,
                                 max_disk=max_disk):
            yield of_step[loaded.revision.step], loaded
