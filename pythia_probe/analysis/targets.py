"""The target matrices the analyses compare model matrices against, read from a CorpusStats by
name. ("target": the statistic side of a cosine; "theory" is kept for Theorem 4.1,
:mod:`pythia_probe.theory`.)"""

from __future__ import annotations

from torch import Tensor

from pythia_probe.errors import BadInputError

NAMES = ("PhiBT", "Qbar", "Bbar", "BbarT", "QbarT", "QbarHeadT")
"""``QbarT`` = Qbar^T (rows = key tokens: the authors' pythia.py target), ``QbarHeadT`` =
QbarHead^T (the authors' per-head target, pythia-per-head.py); see analysis/attention.py."""


def statistic_of(name: str) -> str:
    """The statistic a target is made of (``QbarHeadT`` -> ``QbarHead``, ``BbarT`` -> ``Bbar``)."""
    return name[:-1] if name in ("BbarT", "QbarT", "QbarHeadT") else name


def target_matrix(stats, name: str) -> Tensor:
    """The [V, V] target matrix ``name`` (rows = the token a row describes) from a CorpusStats."""
    if name not in NAMES:
        raise BadInputError(f"unknown target matrix {name!r}; valid: {', '.join(NAMES)}")
    T = getattr(stats, statistic_of(name))
    return T.T if statistic_of(name) != name else T
