"""The one home of process facts: rank, world size, this rank's device, and the collectives the
tools use (sum, gather, broadcast, barrier).

An entry point builds :class:`Ranks` once with :func:`from_env`; under ``accelerate launch`` or
``torchrun`` (WORLD_SIZE > 1 in the environment) accelerate's ``PartialState`` joins the process
group (gloo on CPU, nccl on CUDA) and names this rank's device. Library code receives a
``Ranks`` and never reads the environment or asks torch.distributed itself; :func:`from_env`
also gives the rank to the log format (:func:`pythia_probe.logs.set_rank`) and says when a
launcher asked for several processes but started one (``accelerate launch --cpu
--num_processes N`` without ``--multi_gpu``).

A Slurm job array is a second level: every array task is a separate launch (one process, or a
process group of its own), told its place by SLURM_ARRAY_TASK_ID, _MIN, _STEP and _COUNT
(:func:`slurm_array`). :meth:`Ranks.share` combines the two (and an explicit ``--shard``) into
this process's share of a job: (index, count) over every process of every array task.
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
from pythia_probe.errors import BadInputError, DeviceError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Ranks:
    """rank / world of this process and its device (world 1: no process group)."""

    rank: int = 0
    world: int = 1
    device: str = "cpu"
    array: int = 0  # this launch's place in a Slurm job array (0 of 1: none)
    arrays: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def share(self, shard: tuple[int, int] | None = None) -> tuple[int, int]:
        """(index, count) of this process among all that split one job: ``shard`` (an explicit
        ``--shard i/N``) or this launch's Slurm array task, times the ranks of this launch."""
        outer, outers = shard or (self.array, self.arrays)
        return outer * self.world + self.rank, outers * self.world

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


def slurm_array() -> tuple[int, int]:
    """(index, count) of this Slurm array task among its array (0, 1 outside one): the task id's
    place from SLURM_ARRAY_TASK_MIN in steps of SLURM_ARRAY_TASK_STEP. Checked like ``--shard``:
    an id outside MIN..MAX, a MAX or COUNT that disagree, or ids that are not one evenly spaced
    range (``--array=1,4,5``) are refused in one line naming the variable and the range."""
    env = os.environ
    if "SLURM_ARRAY_TASK_ID" not in env:
        return 0, 1
    try:
        task, low = int(env["SLURM_ARRAY_TASK_ID"]), int(env.get("SLURM_ARRAY_TASK_MIN", "0"))
        step = int(env.get("SLURM_ARRAY_TASK_STEP", "1"))
        count = int(env["SLURM_ARRAY_TASK_COUNT"])
        high = int(env.get("SLURM_ARRAY_TASK_MAX", str(low + (count - 1) * step)))
    except (KeyError, ValueError) as err:
        raise BadInputError(f"a Slurm array task without a readable SLURM_ARRAY_TASK_* ({err}); "
                            "give --shard INDEX/COUNT instead") from None
    seen = ", ".join(f"{v}={env[v]}" for v in (f"SLURM_ARRAY_TASK_{k}" for k in
                                                ("ID", "MIN", "MAX", "STEP", "COUNT"))
                     if v in env)
    if low < 0 or step < 1 or count < 1 or (high - low) != (count - 1) * step:
        raise BadInputError(f"Slurm array ids {low}..{high} step {step} ({count} tasks) are not "
                            f"one evenly spaced range ({seen}); give --shard INDEX/COUNT "
                            "instead")
    if not low <= task <= high or (task - low) % step:
        raise BadInputError(f"SLURM_ARRAY_TASK_ID={task} is not an id of its array "
                            f"{low}..{high} step {step} ({count} tasks; {seen}); give "
                            "--shard INDEX/COUNT instead")
    return (task - low) // step, count


def from_env(device: str = "cpu", array: bool = True) -> Ranks:
    """This process's :class:`Ranks`; several processes join one group through accelerate's
    ``PartialState``, and ``cuda`` becomes this rank's own GPU; a Slurm array task knows its
    place in the array (``array=False``: the array is not read, an explicit ``--shard``
    decides)."""
    array, arrays = slurm_array() if array else (0, 1)
    if world_size() <= 1:
        note = single_process_launch()
        if note:
            log.warning(note)
        logs.set_rank(None)
        return Ranks(device=device, array=array, arrays=arrays)
    from accelerate import PartialState  # seconds to import: only for multi-process runs

    state = PartialState(cpu=torch.device(device).type == "cpu")
    dev = str(state.device) if torch.device(device).type == "cuda" else device
    logs.set_rank(state.process_index)
    return Ranks(state.process_index, state.num_processes, dev, array, arrays)


def check_device(device: str, flag: str = "--device") -> None:
    """Refuse a device this torch build or machine does not have (one line, exit 2)."""

    kind = device.split(":")[0]
    if kind == "cpu":
        return
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(f"{flag} {device}: no CUDA device is available here (torch "
                              f"{torch.__version__}); use {flag} cpu")
        index = int(device.split(":")[1]) if ":" in device else 0
        if index >= torch.cuda.device_count():
            raise DeviceError(f"{flag} {device}: only {torch.cuda.device_count()} CUDA "
                              f"device(s) here (cuda:0..cuda:{torch.cuda.device_count() - 1})")
        return
    if kind == "mps" and torch.backends.mps.is_available():
        return
    raise DeviceError(f"{flag} {device}: not available here; valid: cpu"
                      + (", cuda" if torch.cuda.is_available() else ""))
