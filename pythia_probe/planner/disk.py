"""The disk a sweep's downloads may hold and what each model still fetches: the loader's limit
(``--max-disk-gb``, else a share of the cache's free disk), the checkpoints to download (one per
group of identical weights), their bytes not cached yet, and the refusal of a checkpoint larger
than the limit."""

from __future__ import annotations

from dataclasses import dataclass

from pythia_probe.errors import ResourceError
from pythia_probe.fileio import free_bytes
from pythia_probe.planner.budget import human_bytes

DISK_SHARE = 0.9  # of the cache's free disk the downloads may hold (no --max-disk-gb)


def disk_limit(max_disk_gb: float | None, source) -> tuple[float | None, str]:
    """(bytes the downloads may hold at once, why): --max-disk-gb, else a share of the free
    disk of the cache's filesystem; None for local folders (nothing is downloaded)."""
    if source.local_dir is not None or source.offline:
        return None, "nothing is downloaded"
    if max_disk_gb is not None:
        return max_disk_gb * 1e9, f"--max-disk-gb {max_disk_gb:g}"
    free = free_bytes(source.cache_dir)
    return DISK_SHARE * free, (f"{DISK_SHARE:.0%} of the {human_bytes(free)} free on the disk "
                               f"of {source.cache_dir}; --max-disk-gb sets it")


@dataclass(frozen=True)
class Downloads:
    """What one model's tasks still to do will fetch, and the disk they may hold at once."""

    todo: list[int]
    copied: int  # tasks given the rows of identical weights (step1 = step0, another model's)
    fetch: list
    bytes: int
    biggest: int
    limit: float | None
    limit_why: str

    def check(self) -> None:
        """Refuse up front a checkpoint larger than the disk the loader may use."""
        big = max(self.fetch, key=lambda r: r.nbytes, default=None)
        if big is not None and self.limit is not None and big.nbytes > self.limit:
            raise ResourceError(f"step {big.step} needs {human_bytes(big.nbytes)} of disk, more "
                                f"than the downloads may hold ({human_bytes(self.limit)}: "
                                f"{self.limit_why}); free space or raise --max-disk-gb")

    def held(self, prefetch: int) -> int:
        """Disk the downloads hold at any time: the checkpoint scored and those prefetched."""
        return (prefetch + 1) * self.biggest


def model_downloads(run, groups, todo: list[int], names,
                    limit: tuple[float | None, str]) -> Downloads:
    """What one model's tasks still need (``groups``: every model's tasks grouped by weights;
    ``todo``: its steps not done yet): the groups it leads with a task to do, at the bytes not
    in the cache yet, and its tasks that get the rows of identical weights instead (step1 =
    step0, another model's checkpoint)."""
    left, fetch_steps, copied = set(todo), [], 0
    for g in groups:
        mine = sum(1 for t in g.tasks if t.model == run.source.model and t.step in left)
        leads = g.leader.model == run.source.model and g.leader.step in left
        fetch_steps += [g.leader.step] if leads else []
        copied += mine - leads
    fetch = run.source.resolve(fetch_steps)
    need = sum(run.source.bytes_to_download(r, names) for r in fetch)
    return Downloads(todo, copied, fetch, need, max([r.nbytes for r in fetch] or [0]), *limit)
