"""Compositions over the kept ids: how pythia.py composes at top-K (``--conventions authors``).

With a restricted vocabulary of K kept ids, Bbar_K and Phibar_K are the full statistics sliced
(centred with 1/V over the full vocabulary) either way. The two ways of making the rest:

- ``full_then_slice`` (this toolkit's default, ``--conventions paper``): SigmaB, PhiBT, Gbar,
  GbarHead are composed over the full vocabulary (``stats/factors.py``), then sliced, and pass 2
  runs with the full Gbar;
- ``kept`` (the authors' scripts): they are products of the K x K blocks only,
  SigmaB_K = Bbar_K^T Bbar_K, PhiBT_K = Phibar_K^T Bbar_K^T, Gbar_K = SigmaB_K Phibar_K,
  GbarHead_K = Bbar_K^T PhiBT_K, and pass 2 sees only the kept ids: with x, y the tokens of a
  window, M[t, k] = [x_k in K] ([y_t in K] G_K[y_t, x_k] - colsum(G_K)[x_k] / V) (G_K's
  columns need not sum to 0 here), Q's row centring over every k <= t, Q scattered into
  [x_t, x_j] for kept ids only. :func:`centred` is that M as a table over the kept positions
  plus one void id for every other token.

The K x K matrices are dense (K = 2,000: 32 MB each); never a V x V array.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from pythia_probe.errors import BadInputError

FULL = "full_then_slice"
KEPT = "kept"
COMPOSE = (FULL, KEPT)


def parse_top_k(value: str | int | None) -> int | None:
    """``--top-k`` of the statistics and the sweep: 'full' (or None) keeps every id, else an
    integer K >= 1 (the K most frequent tokens); 'auto', an old name of 'full', is refused."""
    if value is None or value == "full":
        return None
    text = str(value).strip()
    if text == "auto":
        raise BadInputError("--top-k auto is retired (it meant the full vocabulary): use "
                            "--top-k full")
    if isinstance(value, bool) or not text.isdigit() or int(text) < 1:
        raise BadInputError(f"--top-k {value!r}: valid: full, or an integer K >= 1")
    return int(text)
COMPOSED = ("SigmaB", "PhiBT", "Gbar", "GbarHead")
"""The statistics a ``kept`` composition makes from the K x K blocks."""


def check_compose(compose: str, restricted: bool) -> str:
    """``compose`` is one of COMPOSE; ``kept`` needs a restricted vocabulary."""
    if compose not in COMPOSE:
        raise BadInputError(f"compose {compose!r}; valid: {', '.join(COMPOSE)}")
    if compose == KEPT and not restricted:
        raise BadInputError("compose 'kept' needs kept ids (a top-K vocabulary); at the full "
                            f"vocabulary use {FULL!r}")
    return compose


def compositions(factors, ids: np.ndarray) -> dict[str, Tensor]:
    """SigmaB, PhiBT, Gbar, GbarHead as products of the K x K blocks of Bbar and Phibar at
    ``ids`` (positions in ``ids`` order), float64."""
    B = factors.bbar_block(ids, ids)
    Phi = factors.phibar_block(ids, ids)
    sigma = B.T @ B
    phibt = Phi.T @ B.T
    return {"SigmaB": sigma, "PhiBT": phibt, "Gbar": sigma @ Phi, "GbarHead": B.T @ phibt}


def centred(G: Tensor, V: int) -> Tensor:
    """Pass 2's M over the kept positions plus a void id K for every other token, [K+1, K+1]:
    rows = target y_t, columns = key x_k. Row K (a target outside K) is -colsum(G)/V, column K
    (a key outside K) is 0."""
    K = G.shape[0]
    cs = G.sum(0) / V
    out = torch.zeros(K + 1, K + 1, dtype=torch.float64)
    out[:K, :K] = G - cs[None, :]
    out[K, :K] = -cs
    return out


def tile(G: Tensor, V: int, ids: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """The sparse engine's tile of :func:`centred` for the kept positions ``cols``: [len(cols),
    V] indexed by target token id (every id outside ``ids`` gets -colsum(G)/V)."""
    g = G.numpy()
    cs = g[:, cols].sum(0) / V
    out = np.repeat(-cs[:, None], V, axis=1)
    out[:, ids] = (g[:, cols] - cs[None, :]).T
    return out


def remap(ids: Tensor, V: int) -> Tensor:
    """Token id -> its kept position, K for every other id (the void id)."""
    K = int(ids.numel())
    out = torch.full((V,), K, dtype=torch.int64)
    out[ids.to(torch.int64)] = torch.arange(K)
    return out
