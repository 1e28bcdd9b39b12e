"""The flags of ``python -m pythia_probe.plots`` (:class:`PlotsConfig`), in a module that
imports no pandas or matplotlib so that ``--help`` stays quick."""

from __future__ import annotations

from dataclasses import dataclass

from pythia_probe.errors import BadInputError


@dataclass(frozen=True)
class PlotsConfig:
    """Draw the figures of a results folder: the paper's Figures 6 and 7, and a picture of
    every metric (heat maps and curves over all steps, per-head maps, layerless curves)."""

    results: str
    """Folder of Parquet result shards (a sweep's --out)."""
    out: str | None = None
    """Where the PNGs go (default: RESULTS/plots)."""
    head_layers: tuple[int, ...] = ()
    """Layers for the per-head maps, numbered from 1 as the paper (default: 2,13,24, clipped
    to the model's layers)."""
    paper: bool = False
    """Only the paper's Figures 6 and 7 (steps 0, 1, 2, 4, ..., 512)."""

    def __post_init__(self):
        if any(layer < 1 for layer in self.head_layers):
            raise BadInputError(f"--head-layers are numbered from 1 (the paper's layers), got "
                                f"{','.join(map(str, self.head_layers))}")
