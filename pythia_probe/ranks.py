"""The one home of process facts: rank, world size, this rank's device, and the collectives the
tools use (sum, gather, broadcast, barrier).

An entry point builds :class:`Ranks` once with :func:`from_env`; under ``accelerate launch`` or
``torchrun`` (WORLD_SIZE > 1 in the environment) accelerate's ``PartialState`` joins the process
group (gloo on CPU, nccl on CUDA) and names this rank's device. Library code receives a
``Ranks`` and never reads the environment or asks torch.distributed itself; :func:`from_env`
also gives the rank to the log format (:func:`pythia_probe.logs.set_rank`) and says when a
launcher asked for several processes but started one (``accelerate launch --cpu
--num_processes N`` without ``--multi_gpu``).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from pythia_probe import logs

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Ranks:
    """rank / world of this process and its device (world 1: no process group)."""

    rank: int = 0
    world: int = 1
    device: str = "cpu"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def sum_(self, t: Tensor) -> Tensor:
        """In-place sum over ranks (exact for integer tensors)."""
        if self.world > 1:
            dist.all_reduce(t)
        return t

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order."""
        if self.world == 1:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def broadcast_(self, t: Tensor) -> Tensor:
        """Rank 0's ``t`` into every rank's ``t``."""
        if self.world > 1:
            dist.broadcast(t, 0)
        return t

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()


def world_size() -> int:
    """Processes launched together (WORLD_SIZE, set by accelerate launch / torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def single_process_launch() -> str | None:
    """Why a launcher that was asked for several processes started only this one, or None.

    ``accelerate launch --cpu --num_processes N`` (without ``--multi_gpu``) runs accelerate's
    simple launcher: one process, with MASTER_ADDR/MASTER_PORT set but no WORLD_SIZE."""
    env = os.environ
    if "WORLD_SIZE" in env or "MASTER_ADDR" not in env or "ACCELERATE_USE_CPU" not in env:
        return None
    return ("accelerate launch started ONE process (on the CPU, --num_processes N without "
            "--multi_gpu runs a single process); for N processes use `accelerate launch "
            "--multi_gpu --num_processes N` (gloo on the CPU) or `torchrun --nproc_per_node N`")


def from_env(device: str = "cpu") -> Ranks:
    """This process's :class:`Ranks`; several processes join one group through accelerate's
    ``PartialState``, and ``cuda`` becomes this rank's own GPU."""
    if world_size() <= 1:
        note = single_process_launch()
        if note:
            log.warning(note)
        logs.set_rank(None)
        return Ranks(device=device)
    from accelerate import PartialState  # seconds to import: only for multi-process runs

    state = PartialState(cpu=torch.device(device).type == "cpu")
    dev = str(state.device) if torch.device(device).type == "cuda" else device
    logs.set_rank(state.process_index)
    return Ranks(state.process_index, state.num_processes, dev)
