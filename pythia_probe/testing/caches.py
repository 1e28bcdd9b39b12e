"""Hugging Face caches as users have them, for tests: populated by huggingface_hub itself
(symlinks to blobs, or plain files where symlinks are unavailable), or copied with the symlinks
resolved (``cp -rL``), which is what some cache copies look like."""

from __future__ import annotations

import shutil
from pathlib import Path

from huggingface_hub import HfApi, constants, hf_hub_download


def hf_populate(cache_dir: Path, repo_id: str, branches: list[str], endpoint: str,
                symlinks: bool = True) -> dict[str, str]:
    """Download every file of ``branches`` with ``hf_hub_download`` (branch revisions, so refs
    are written), as a user would; ``symlinks=False``: plain files, as huggingface_hub writes
    where symlinks are unavailable. Returns ``{branch: commit}``."""
    api = HfApi(endpoint=endpoint)
    old = constants.HF_HUB_DISABLE_SYMLINKS
    constants.HF_HUB_DISABLE_SYMLINKS = not symlinks
    try:
        for branch in branches:
            for entry in api.list_repo_tree(repo_id, revision=branch):
                hf_hub_download(repo_id, entry.path, revision=branch, cache_dir=cache_dir,
                                endpoint=endpoint)
    finally:
        constants.HF_HUB_DISABLE_SYMLINKS = old
    commits = {b.name: b.target_commit for b in api.list_repo_refs(repo_id).branches}
    return {b: commits[b] for b in branches}


def plain_copy(storage: Path, dest_cache: Path) -> Path:
    """Copy a ``models--ORG--NAME`` folder into ``dest_cache`` with every symlink replaced by
    the file it points to and no ``blobs/`` (``cp -rL`` of refs and snapshots)."""
    out = Path(dest_cache) / Path(storage).name
    for part in ("refs", "snapshots"):
        shutil.copytree(Path(storage) / part, out / part, symlinks=False)
    return out


def tree_snapshot(root: Path) -> dict[str, tuple[int, int, str]]:
    """``{relative path: (size, mtime_ns, symlink target)}`` of every file and symlink under
    ``root`` (symlinks not followed), to check that a run left them exactly as they were."""
    root = Path(root)
    return {str(p.relative_to(root)): (p.lstat().st_size, p.lstat().st_mtime_ns,
                                       str(p.readlink()) if p.is_symlink() else "")
            for p in sorted(root.rglob("*")) if p.is_symlink() or p.is_file()}
