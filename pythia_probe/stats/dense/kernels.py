"""Per-batch kernels of the dense engine (device-agnostic torch): scatter/index_add, never dense
one-hots.

A batch is ``tokens [n, T+1]`` (int64) plus ``lengths [n]`` (valid tokens per row, >= 2; the
rest is padding and never counted). Row i has ``lengths[i] - 1`` predicted positions.
Positions t are 0-based here; the paper's 1-based position is t + 1, so the uniform causal
weight of position t is 1 / (t + 1).

Pairs (t, m) with m <= t are laid out sequence-major, ``[n, P]`` with P = T(T+1)/2 in the
row-major order of ``torch.tril_indices``: the pairs of one sequence and one position t are
contiguous, so consecutive scatters hit one row of the accumulator (about twice as fast on CPU
as a pair-major order). Every kernel works on flat keys ``row * d_vocab + col`` into a
flattened accumulator; keys are int32 when d_vocab^2 < 2^31, int64 otherwise. On CPU,
per-position blocks are filled by T slice operations (no gathers, no large temporaries).

``add_context`` (pass 1) runs the compiled C kernel on the CPU when it is built
(``stats/native/fastcount.py``, same integers), these torch kernels elsewhere; pass 2 (Eq. 16)
is ``stats/dense/second.py``.
"""

from __future__ import annotations

from functools import lru_cache

import torch
from torch import Tensor

from pythia_probe.stats.fixedpoint import context_weights
from pythia_probe.stats.native import fastcount


@lru_cache(maxsize=32)
def pair_index(T: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """(t, m) for every 0 <= m <= t < T, row major: the lower triangle of A0."""
    t, m = torch.tril_indices(T, T, device=device)
    return t, m


@lru_cache(maxsize=8)
def _pair_weights(T: int, n: int, device: torch.device) -> Tensor:
    """Fixed-point weight of every pair, sequence-major and flat (cached per batch shape)."""
    t, _ = pair_index(T, device)
    return context_weights(T, device)[t][None, :].expand(n, -1).reshape(-1).contiguous()


@lru_cache(maxsize=8)
def pair_inv_t(T: int, device: torch.device) -> Tensor:
    t, _ = pair_index(T, device)
    return 1.0 / (t + 1).to(torch.float64)


class Workspace:
    """Reusable scratch buffers: fresh [P, n] tensors each batch cost more in page faults
    than the arithmetic done in them."""

    def __init__(self) -> None:
        self._bufs: dict[str, Tensor] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: torch.dtype,
            device: torch.device) -> Tensor:
        numel = 1
        for d in shape:
            numel *= d
        b = self._bufs.get(name)
        if b is None or b.numel() < numel or b.dtype != dtype or b.device != device:
            b = self._bufs[name] = torch.empty(numel, dtype=dtype, device=device)
        return b[:numel].view(shape)


def use_slices(device: torch.device) -> bool:
    """CPU: fill per-position blocks with T slice ops; other devices: one gather each."""
    return device.type == "cpu"


def key_dtype(d_vocab: int) -> torch.dtype:
    return torch.int32 if d_vocab * d_vocab < 2**31 else torch.int64


def pair_keys(rows: Tensor, cols: Tensor, d_vocab: int, ws: Workspace | None = None
              ) -> Tensor:
    """[n, P] keys rows[:, t] * V + cols[:, m] for every pair m <= t (sequence-major)."""
    n, T = rows.shape
    dt = key_dtype(d_vocab)
    r = rows.to(dt) * d_vocab
    c = cols.to(dt).contiguous()
    if not use_slices(rows.device):
        t, m = pair_index(T, rows.device)
        return r.index_select(1, t) + c.index_select(1, m)
    shape = (n, T * (T + 1) // 2)
    out = torch.empty(shape, dtype=dt) if ws is None else ws.get("keys", shape, dt, rows.device)
    off = 0
    for i in range(T):  # one block per position: far faster than a gather on CPU
        torch.add(c[:, : i + 1], r[:, i:i + 1], out=out[:, off:off + i + 1])
        off += i + 1
    return out


def per_pair(values: Tensor, out: Tensor | None = None) -> Tensor:
    """[n, P]: pair (t, m) gets values[:, t] (per-position values spread over their pairs)."""
    n, T = values.shape
    if not use_slices(values.device):
        t, _ = pair_index(T, values.device)
        return values.index_select(1, t)
    out = torch.empty(n, T * (T + 1) // 2, dtype=values.dtype) if out is None else out
    off = 0
    for i in range(T):
        out[:, off:off + i + 1] = values[:, i:i + 1]
        off += i + 1
    return out


def position_sums(M: Tensor, T: int) -> Tensor:
    """[n, T]: sum over m <= t of M[:, (t, m)] (the row sums of each sequence's T x T block)."""
    n = M.shape[0]
    out = torch.zeros(n, T, dtype=M.dtype, device=M.device)
    if not use_slices(M.device):
        t, _ = pair_index(T, M.device)
        return out.index_add_(1, t, M)
    off = 0
    for i in range(T):
        torch.sum(M[:, off:off + i + 1], 1, out=out[:, i])
        off += i + 1
    return out


def sub_per_position(M: Tensor, c: Tensor) -> Tensor:
    """In place M[:, (t, m)] -= c[:, t]."""
    T = c.shape[1]
    if not use_slices(M.device):
        t, _ = pair_index(T, M.device)
        return M.sub_(c.index_select(1, t))
    off = 0
    for i in range(T):
        M[:, off:off + i + 1] -= c[:, i:i + 1]
        off += i + 1
    return M


def position_mask(lengths: Tensor, T: int) -> Tensor | None:
    """[n, T] bool mask of predicted positions, or None when every row is full."""
    if bool((lengths == T + 1).all()):
        return None
    return torch.arange(T, device=lengths.device)[None, :] < (lengths[:, None] - 1)


def clean(tokens: Tensor, lengths: Tensor) -> Tensor:
    """Padding replaced by id 0 so every key is in range (padding gets weight 0 anyway)."""
    L = tokens.shape[1]
    if bool((lengths == L).all()):
        return tokens
    return tokens.masked_fill(torch.arange(L, device=tokens.device)[None, :] >= lengths[:, None],
                              0)


def bigram_keys(tokens: Tensor, lengths: Tensor, d_vocab: int) -> Tensor:
    """Flat keys x_t * V + y_t of every predicted position."""
    x, y = tokens[:, :-1], tokens[:, 1:]
    keys = x * d_vocab + y
    mask = position_mask(lengths, x.shape[1])
    return keys.reshape(-1) if mask is None else keys[mask]


def counted_tokens(tokens: Tensor, lengths: Tensor) -> Tensor:
    """Every non-padding token of the batch, flat (for token frequencies)."""
    L = tokens.shape[1]
    if bool((lengths == L).all()):
        return tokens.reshape(-1)
    return tokens[torch.arange(L, device=tokens.device)[None, :] < lengths[:, None]]


def add_context(acc_lo: Tensor, tokens: Tensor, lengths: Tensor, d_vocab: int,
                ws: Workspace | None = None) -> None:
    """Scatter the fixed-point weight of 1/t into acc_lo[y_t * V + x_m] for every m <= t."""
    fastcount.count_context(acc_lo, tokens, lengths, d_vocab,
                            lambda: _add_context(acc_lo, tokens, lengths, d_vocab, ws))


def _add_context(acc_lo: Tensor, tokens: Tensor, lengths: Tensor, d_vocab: int,
                 ws: Workspace | None) -> None:
    """The torch kernel of :func:`add_context` (any device)."""
    n, T = tokens.shape[0], tokens.shape[1] - 1
    tokens = clean(tokens, lengths)
    keys = pair_keys(tokens[:, 1:], tokens[:, :-1], d_vocab, ws).reshape(-1)
    w = _pair_weights(T, n, tokens.device)
    mask = position_mask(lengths, T)
    if mask is not None:
        w = w * per_pair(mask.to(torch.int64)).reshape(-1)
    acc_lo.index_add_(0, keys, w)

