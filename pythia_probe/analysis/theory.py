"""The theory matrices the analyses compare against, read from a CorpusStats by name."""

from __future__ import annotations

from torch import Tensor

from pythia_probe.errors import BadInputError

NAMES = ("PhiBT", "Qbar", "Bbar", "BbarT")


def theory_matrix(stats, name: str) -> Tensor:
    """The [V, V] theory matrix ``name`` (rows = the token a row describes) from a CorpusStats."""
    if name == "BbarT":
        return stats.Bbar.T
    if name in ("PhiBT", "Qbar", "Bbar"):
        return getattr(stats, name)
    raise BadInputError(f"unknown theory matrix {name!r}; valid: {', '.join(NAMES)}")
