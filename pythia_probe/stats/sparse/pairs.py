"""Pair codes of the sparse pass 1 (``count.SparseCountAccumulator``): ((a * V + y) << tbits)
| t for every (target y_t, context a = x_m) pair, reduced after a sort to one fixed-point sum
per key (``native.sparsecount``: pairs, reduce_sorted; pairs of two head tokens are summed in
a dense block instead, which ``drain`` turns back into sorted keys)."""

from __future__ import annotations

import numpy as np

from pythia_probe.errors import BadInputError
from pythia_probe.stats.fixedpoint import INT_MAX


def t_bits(T: int) -> int:
    """Bits that hold a position 0..T-1 in the low end of a pair code."""
    return max(1, (T - 1).bit_length())


def check_key_range(d_vocab: int, T: int) -> None:
    """Pair codes (a * V + y) << tbits must stay below 2^63."""
    if (d_vocab * d_vocab) << t_bits(T) > INT_MAX:
        raise BadInputError(f"d_vocab {d_vocab} with T = {T} is too large for the sparse "
                            "engine's int64 pair codes (V^2 * 2^ceil(log2 T) >= 2^63)")


def dense_index(keys: np.ndarray, d_vocab: int) -> np.ndarray:
    """Context-major keys a * V + y -> the dense accumulator's flat index y * V + a."""
    return (keys % d_vocab) * d_vocab + keys // d_vocab
