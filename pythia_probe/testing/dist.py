"""Several processes on one machine for the tests: a free loopback port, and a statistics
build split over ranks (``torch.multiprocessing.spawn``, the gloo backend, one thread each)."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path

import torch

from pythia_probe import ranks
from pythia_probe.stats import driver


def free_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stats_rank(rank: int, world: int, port: int, job: Callable, out: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    shards, spec = job()
    stats = driver.compute_stats(shards, spec, {}, ranks.from_env("cpu"))
    if stats is not None:
        stats.save(out)
    torch.distributed.destroy_process_group()


def stats_in_processes(job: Callable, out: str | Path, world: int = 2) -> Path:
    """``driver.compute_stats(*job())`` split over ``world`` processes; rank 0 saves the result
    to ``out``. ``job`` is a picklable callable (a module-level function or a partial of one)
    returning ``(shards, spec)``: each process builds its own."""
    torch.multiprocessing.spawn(_stats_rank, args=(world, free_port(), job, str(out)),
                                nprocs=world)
    return Path(out)
