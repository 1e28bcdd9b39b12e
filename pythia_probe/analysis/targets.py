"""The target matrices the analyses compare model matrices against, read from a CorpusStats by
name. ("target": the statistic side of a cosine; "theory" is kept for Theorem 4.1,
:mod:`pythia_probe.theory`.)"""

from __future__ import annotations

from torch import Tensor

from pythia_probe.errors import BadInputError

NAMES = ("PhiBT", "Qbar", "Bbar", "BbarT")


def target_matrix(stats, name: str) -> Tensor:
    """The [V, V] target matrix ``name`` (rows = the token a row describes) from a CorpusStats."""
    if name == "BbarT":
        return stats.Bbar.T
    if name in ("PhiBT", "Qbar", "Bbar"):
        return getattr(stats, name)
    raise BadInputError(f"unknown target matrix {name!r}; valid: {', '.join(NAMES)}")
