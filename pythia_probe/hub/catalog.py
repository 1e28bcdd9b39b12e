"""Which checkpoint revisions a model has and what files each holds, with nothing downloaded.

:class:`CheckpointCatalog` (the resolving half of
:class:`~pythia_probe.hub.checkpoints.CheckpointSource`, which adds fetching, loading and eviction):

- hub models: every branch's commit (one ``list_repo_refs`` call per catalog) and each
  revision's files with sizes and hashes (``list_repo_tree``), every name and hash validated
  first (a hash or commit that is really a path raises
  :class:`~pythia_probe.errors.UnsafeCheckpointError`); unknown steps raise
  :class:`~pythia_probe.errors.StepError` naming the nearest valid steps. Every call goes
  through :func:`pythia_probe.hub.io.call` (timeouts, one retry policy, one-line errors; a hub
  that cannot be reached says what to do offline).
- the cache (offline, ``HF_HUB_OFFLINE=1``, a hub-style cache folder as the model, or
  :meth:`CheckpointCatalog.resolve_cached` whatever the setting): refs and snapshots as
  ``scan_cache_dir`` reads them; files described by the listing saved when they were fetched,
  else by the hash their blob is named after.
- local folders with one sub-folder per step (``step1000/``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path

from huggingface_hub import HfApi

from pythia_probe.errors import (
    CheckpointNotCachedError,
    HubDownloadError,
    HubNotFoundError,
    StepError,
    UnsafeCheckpointError,
    UnsafeFileError,
)
from pythia_probe.hub import io as hubio
from pythia_probe.hub import steps as steps_mod
from pythia_probe.hub.cache import HubCache
from pythia_probe.hub.io import RetryPolicy
from pythia_probe.hub.weights import FileInfo, Revision, hub_cache_layout

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


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


class CheckpointCatalog:
    """Which steps one model has and what files each holds (hub, cache or local folders)."""

    def __init__(self, model: str | os.PathLike, *, cache_dir: str | os.PathLike | None = None,
                 revision_for: Callable[[int], str] = steps_mod.revision,
                 endpoint: str | None = None, retry: RetryPolicy | None = None,
                 token: str | bool | None = None):
        """``model``: a hub id, a folder of step*/ sub-folders, or a hub-style cache folder
        (read offline). ``cache_dir``: where hub files are cached (default the tool's own);
        ``revision_for``: step -> branch name; ``endpoint``: the hub (default ``HF_ENDPOINT``);
        ``retry``: the retry policy of every hub call; ``token``: the access token (sent to
        the hub's host only)."""
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
        """Revisions for ``steps``: commit sha + files with sizes and hashes, nothing downloaded
        (offline: from the cache, as :meth:`resolve_cached`)."""
        steps = list(steps)
        if self.local_dir is not None:
            return [self._resolve_local(s) for s in steps]
        if self.offline:
            return self.resolve_cached(steps)
        branches = self.branches()
        revs = []
        for s in steps:
            branch = self.revision_for(s)
            if branch not in branches:
                self._missing_branch(s, branch, branches, cached=False)
            commit = self._commit(branches[branch], branch)
            revs.append(Revision(self.model, s, branch, commit, self._hub_files(commit)))
        return revs

    def cached_steps(self) -> list[int]:
        """Steps whose branch the cache holds (refs written by this tool or huggingface_hub),
        read without the network; [] when the cache has nothing of this model."""
        if self.local_dir is not None:
            return self.steps()
        try:
            cached = self._scan()
        except CheckpointNotCachedError:
            return []
        return sorted(s for b in cached if (s := steps_mod.step_of(b)) is not None)

    def resolve_cached(self, steps: Iterable[int]) -> list[Revision]:
        """Revisions for ``steps`` from the cache alone, whatever ``HF_HUB_OFFLINE`` says (no
        request is made): commits from the cached refs, files with the sizes and hashes saved
        when they were fetched (checked again when read). A step the cache lacks raises
        :class:`~pythia_probe.errors.CheckpointNotCachedError` naming the nearest cached
        steps. For a plan or a dry run when the hub cannot be reached."""
        steps = list(steps)
        if self.local_dir is not None:
            return [self._resolve_local(s) for s in steps]
        cached = self._scan()
        revs = []
        for s in steps:
            branch = self.revision_for(s)
            if branch not in cached:
                self._missing_branch(s, branch, cached, cached=True)
            commit = self._commit(cached[branch][0], branch)
            revs.append(Revision(self.model, s, branch, commit, self._cached_files(branch)))
        return revs

    def _commit(self, commit: object, branch: str) -> str:
        try:
            return hubio.check_oid(commit, f"the commit of {self.model}@{branch}")
        except UnsafeFileError as err:
            raise UnsafeCheckpointError(str(err)) from err

    def _missing_branch(self, step: int, branch: str, branches: dict, cached: bool) -> None:
        avail = sorted(x for b in branches if (x := steps_mod.step_of(b)) is not None)
        near = ", ".join(map(str, steps_mod.nearest_steps(step, avail)))
        where = f"the cache {self.storage}" if cached else f"{self.endpoint}"
        err = CheckpointNotCachedError if cached else StepError
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
        return self._local_revision(step, branch, folder)

    def _local_revision(self, step: int, branch: str, folder: Path) -> Revision:
        files = tuple(FileInfo(p.name, p.stat().st_size) for p in sorted(folder.iterdir())
                      if p.is_file())
        return Revision(self.model, step, branch, None, files, local_dir=str(folder))

    def resolve_branch(self, branch: str, step: int) -> Revision | None:
        """The revision on a branch that is no step (``main``), labelled ``step``; None when
        the source has no such branch (local sources: no sub-folder of that name)."""
        if self.local_dir is not None:
            folder = self.local_dir / branch
            return self._local_revision(step, branch, folder) if folder.is_dir() else None
        branches = self.branches()  # offline: the cached refs
        if branch not in branches:
            return None
        commit = self._commit(branches[branch], branch)
        files = self._cached_files(branch) if self.offline else self._hub_files(commit)
        return Revision(self.model, step, branch, commit, files)

    def _call(self, fn: Callable, what: str):
        return hubio.call(fn, what, self.retry, fail=HubDownloadError, missing=HubNotFoundError,
                          hint=hubio.offline_hint(self.model, "stepN"))
