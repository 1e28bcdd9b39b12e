"""The target matrices the analyses compare model matrices against, read from a CorpusStats by
name. ("target": the statistic side of a cosine; "theory" is kept for Theorem 4.1,
:mod:`pythia_probe.theory`.)"""

from __future__ import annotations

from torch import Tensor

from pythia_probe.errors import BadInputError

NAMES = ("PhiBT", "Qbar", "Bbar", "BbarT", "QbarT", "QbarHeadT")
"""``QbarT`` = Qbar^T (rows = key tokens: the authors' pythia.py target), ``QbarHeadT`` =
QbarHead^T (the authors' per-head target, pythia-per-head.py); see analysis/attention.py."""


def target_matrix(stats, name: str) -> Tensor:
    """The [V, V] target matrix ``name`` (rows = the token a row describes) from a CorpusStats."""
    if name in ("BbarT", "QbarT"):
        return getattr(stats, name[:-1]).T
    if name == "QbarHeadT":
        return stats.QbarHead.T
    if name in ("PhiBT", "Qbar", "Bbar"):
        return getattr(stats, name)
    raise BadInputError(f"unknown target matrix {name!r}; valid: {', '.join(NAMES)}")
