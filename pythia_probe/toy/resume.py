"""What a toy run leaves to resume from: checkpoints (safetensors, through the one atomic writer)
and the run manifest, each read back with a one-line error naming the file when it is not what a
run wrote."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from pythia_probe.errors import CorruptFileError, MismatchError, MissingFileError
from pythia_probe.fileio import atomic_write, check_folders, remove
from pythia_probe.results import MANIFEST, read_manifest
from pythia_probe.toy.config import TrainConfig, saved_config

#: config fields that may change between a run and its resumption
RESUMABLE = ("epochs", "out", "resume", "device", "preset")


def save_checkpoint(out: Path, state: dict[str, Tensor], step: int) -> Path:
    """Weights at ``step`` to out/checkpoints/step{step}.safetensors; older ones removed. A full
    disk while safetensors serialises is a DiskFullError naming the file."""
    ckdir = out / "checkpoints"
    check_folders(out, [ckdir])  # never a link: older checkpoints are deleted in it
    path = ckdir / f"step{step:08d}.safetensors"
    tensors = {k: v.detach().cpu().contiguous() for k, v in state.items()}
    atomic_write(path, lambda tmp: save_file(tensors, str(tmp), metadata={"step": str(step)}),
                 sum(t.numel() * t.element_size() for t in tensors.values()))
    for old in ckdir.glob("step*.safetensors"):
        if old != path:
            remove(old, [ckdir])
    return path


def save_tensors(path: Path, tensors: dict[str, Tensor]) -> Path:
    """Tensors to one safetensors file through the atomic writer."""
    data = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    return atomic_write(path, lambda tmp: save_file(data, str(tmp)),
                        sum(t.numel() * t.element_size() for t in data.values()))


def load_tensors(path: Path) -> dict[str, Tensor]:
    """A safetensors file written by :func:`save_tensors` (one line naming it if unreadable)."""
    try:
        return load_file(str(path))
    except FileNotFoundError as err:
        raise MissingFileError(f"{path} is missing; train the run again") from err
    except (SafetensorError, OSError, ValueError) as err:
        raise CorruptFileError(f"{path} is unreadable ({err}); train the run again") from err


def latest_checkpoint(out: Path) -> tuple[int, dict[str, Tensor]] | None:
    """(step, state dict) of the newest checkpoint under out/checkpoints, or None."""
    paths = sorted((out / "checkpoints").glob("step*.safetensors"))
    if not paths:
        return None
    try:
        return int(paths[-1].stem[4:]), load_file(str(paths[-1]))
    except (SafetensorError, OSError, ValueError) as err:
        raise CorruptFileError(f"toy checkpoint {paths[-1]} is unreadable ({err}); delete it "
                               "(and train again) or pass --no-resume") from err


def run_manifest(out: Path) -> dict[str, Any]:
    """The manifest of the run in ``out``, checked to have the shape a run writes (an object
    with a 'config' object, 'earlier_run_ids' a list when present)."""
    m = read_manifest(out)
    ok = isinstance(m, dict) and isinstance(m.get("config"), dict) and isinstance(
        m.get("earlier_run_ids", []), list)
    if not ok:
        raise CorruptFileError(f"{out / MANIFEST} is not a toy run manifest (valid JSON, but it "
                               "needs an object with a 'config' object); delete the folder, "
                               "choose another --out, or pass --no-resume")
    return m


def saved_train_config(out: Path) -> TrainConfig:
    """The TrainConfig a run in ``out`` was made with (one line naming the manifest if its
    config does not make one)."""
    try:
        return TrainConfig(**saved_config(run_manifest(out)["config"]))
    except (TypeError, ValueError) as err:
        raise CorruptFileError(f"{out / MANIFEST} holds no valid toy run config ({err}); "
                               "delete the folder or choose another --out") from err


def earlier_run_ids(out: Path) -> list[str]:
    old = run_manifest(out)
    return [*old.get("earlier_run_ids", []), old.get("run_id")]


def check_resumable(out: Path, cfg: TrainConfig) -> None:
    """Refuse to resume a run made with other settings (RESUMABLE fields may differ)."""
    old = saved_config(run_manifest(out)["config"])
    diff = [k for k, v in asdict(cfg).items() if k not in RESUMABLE and old.get(k) != v]
    if diff:
        raise MismatchError(f"{out} holds a run with different settings {diff}; pass the same "
                            "settings, another --out, or --no-resume")
