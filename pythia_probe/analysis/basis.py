"""One model-side matrix E [V, d] (a residual stream, W_E, W_U^T) in the form every factor made
from it shares: the products with a target are computed once per (E, target), not once per
factor.

Every model matrix an analysis scores is F = E W for some E and small W (a residual stream
itself, its row-centred form E P with P = I - 11^T/d, E W_Q^h for a head, the LN-folded
E P diag(w) W_Q), so with Y = [E - r 1^T, r] [V, d+1] (r = the row means of E; E = Y [I; 1^T],
row_centre(E) = Y [I; 0], exactly: the row centring happens here, in V-space, not by cancelling
in a d x d product) every factor is F = Y W' and

    (F^T C_T)(F^T C_T)^T = W'^T M W',   M = (Y^T C_T)(Y^T C_T)^T   [(d+1) x (d+1)]
    F^T F = W'^T G W',                   G = Y^T Y,   F^T 1 = W'^T (Y^T 1).

M costs one pass of Y over the target (a dense V^2 (d+1) or a sparse nnz (d+1) product, then
V (d+1)^2); G one V (d+1)^2 Gram. Both are memoised on the basis, M per target, so the
embedding's cos_post of layer l and cos_pre of layer l + 1 (the same stream), the attention mean,
every head and the LN-folded variant of a layer share them. G is accumulated from the
token-centred Yc = Y - 1 ybar^T (Gc = Yc^T Yc, which attention's key side needs, then
G = Gc + V ybar ybar^T), so an anisotropic stream (a large common row) loses no precision to
cancellation. Products run in the compute dtype over row blocks, sums in float64.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from pythia_probe.analysis.defaults import DEFAULT_CHUNK
from pythia_probe.planner.step import block_edges

GRAM_ROWS = 8192  # rows per block product of a Gram (at least; a deep product keeps the peak)


def add_gram(M: Tensor, X: Tensor) -> Tensor:
    """M += X^T X on the upper block triangle only (column blocks of about GRAM_BLOCK,
    ``planner.step``: the lower blocks, about half the multiply-adds, are skipped), each block's
    product in X's dtype, added to float64 M; :func:`mirror` completes M once every term is in."""
    e = block_edges(X.shape[1])
    for a, b in zip(e, e[1:], strict=False):
        M[a:b, a:] += (X[:, a:b].T @ X[:, a:]).to(torch.float64)
    return M


def mirror(M: Tensor) -> Tensor:
    """The symmetric matrix whose upper block triangle (:func:`add_gram`) is M's, in place."""
    e = block_edges(M.shape[0])
    for a, b in zip(e, e[1:], strict=False):
        M[a:b, a:b] = torch.triu(M[a:b, a:b]) + torch.triu(M[a:b, a:b], 1).T
        M[b:, a:b] = M[a:b, b:].T
    return M


class Basis:
    """E [V, d] held as Y = [E - r 1^T, r] in the compute dtype, with memoised moments."""

    def __init__(self, E: Tensor, dtype: torch.dtype = torch.float64,
                 chunk: int = DEFAULT_CHUNK) -> None:
        E = E.to(dtype)
        r = E.mean(dim=1, keepdim=True)
        self.Y = torch.cat([E - r, r], dim=1)
        self.d, self.chunk = E.shape[1], chunk
        self._moments: tuple[Tensor, Tensor, Tensor] | None = None
        self._target: dict[int, tuple[object, Tensor]] = {}

    @property
    def V(self) -> int:
        return self.Y.shape[0]

    @property
    def width(self) -> int:
        return self.Y.shape[1]

    @property
    def dtype(self) -> torch.dtype:
        return self.Y.dtype

    @property
    def device(self) -> torch.device:
        return self.Y.device

    def whole(self, W: Tensor | None = None) -> Tensor:
        """Coefficients W' of E W (W None: E itself): [W; 1^T W], float64."""
        W = self._eye() if W is None else W.to(self.device, torch.float64)
        return torch.cat([W, W.sum(dim=0, keepdim=True)], dim=0)

    def centred(self, W: Tensor | None = None) -> Tensor:
        """Coefficients W' of row_centre(E) W (W None: row_centre(E)): [W; 0], float64."""
        W = self._eye() if W is None else W.to(self.device, torch.float64)
        return torch.cat([W, torch.zeros_like(W[:1])], dim=0)

    def _eye(self) -> Tensor:
        return torch.eye(self.d, dtype=torch.float64, device=self.device)

    def moments(self) -> tuple[Tensor, Tensor, Tensor]:
        """(G = Y^T Y, Gc = Yc^T Yc, e = Y^T 1) in float64, computed once."""
        if self._moments is None:
            ybar = self.Y.sum(dim=0, dtype=torch.float64) / self.V
            Gc = torch.zeros(self.width, self.width, dtype=torch.float64, device=self.device)
            shift = ybar.to(self.dtype)
            rows = max(self.chunk, GRAM_ROWS)
            for s in range(0, self.V, rows):
                add_gram(Gc, self.Y[s:s + rows] - shift)
            mirror(Gc)
            self._moments = (Gc + self.V * torch.outer(ybar, ybar), Gc, self.V * ybar)
        return self._moments

    def target_gram(self, target) -> Tensor:
        """M = (Y^T C_T)(Y^T C_T)^T against ``target`` (after :func:`fill_target_grams`)."""
        return self._target[id(target)][1]

    def has(self, target) -> bool:
        return id(target) in self._target

    def store(self, target, M: Tensor) -> None:
        self._target[id(target)] = (target, M)  # the target is kept alive with its key


def fill_target_grams(bases: Sequence[Basis], target, chunk: int = DEFAULT_CHUNK) -> None:
    """M of every basis that lacks it against ``target``, all in one pass over the target."""
    todo = list({id(b): b for b in bases if not b.has(target)}.values())
    if not todo:
        return
    V = target.d_vocab
    for b in todo:
        if b.V != V:
            raise ValueError(f"model matrix has {b.V} token rows but target {target.name!r} "
                             f"has d_vocab={V}")
    Y = torch.cat([b.Y.to(target.dtype) for b in todo], dim=1)
    edges = torch.tensor([0] + [b.width for b in todo]).cumsum(0).tolist()
    for b, M in zip(todo, target.grams(Y, edges, chunk), strict=True):
        b.store(target, M)
