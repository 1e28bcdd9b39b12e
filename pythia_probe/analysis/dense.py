"""A dense target matrix T [V, V] (resident) prepared for the factored cosines.

C_T = rownorm(T) row-centred is never stored: a column block is rebuilt from T and two
V-vectors (row scales and row means), so the only V x V matrix held is the statistic itself.
``norm`` = ||C_T C_T^T||_F (a V^3 computation, once per statistics), ``trace`` = ||C_T||_F^2
and ``total`` = ||C_T^T 1||^2 (the chance level's terms) and ``null_terms`` (the chance level's
spread: :func:`~pythia_probe.analysis.chance.vector_terms` of B = C_T C_T^T from its diagonal
and B 1 = C_T (C_T^T 1), summed over the same column blocks). Column blocks are handed out in the
layout the prepared-target cache streams them in (rows of C_T^T), so a resident and a streamed
target give bit-identical products.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from pythia_probe.analysis.chance import Primitives, vector_terms

DEFAULT_CHUNK = 4096
GRAM_BLOCK = 1100  # column block of a Gram's upper triangle (d + 1 = 2,049: two blocks)
GRAM_ROWS = 8192  # rows per block product of a Gram (at least; a deep product keeps the peak)


def row_centre(X: Tensor) -> Tensor:
    """Subtract each row's own mean."""
    return X - X.mean(dim=1, keepdim=True)


def row_normalise(X: Tensor) -> Tensor:
    """Divide each row by its L2 norm; all-zero rows stay zero."""
    norms = torch.linalg.vector_norm(X, dim=1, keepdim=True)
    return X / torch.where(norms > 0, norms, torch.ones_like(norms))


@dataclass(frozen=True, eq=False)
class Target:
    """A target matrix T prepared for scoring without a second V x V copy.

    C_T's column block s:e is ``scale[:, None] * T[:, s:e] - mean[:, None]`` (scale = 1 / row
    norm, 0 for zero rows; mean = row means of rownorm(T)).
    """

    name: str
    T: Tensor
    scale: Tensor
    mean: Tensor
    norm: float
    trace: float = 0.0
    total: float = 0.0
    null_terms: Primitives | None = None

    @property
    def d_vocab(self) -> int:
        return self.T.shape[0]

    @property
    def dtype(self) -> torch.dtype:
        return self.T.dtype

    def columns(self, s: int, e: int) -> Tensor:
        """C_T[:, s:e], shape [V, e - s]."""
        out = self.T[:, s:e] * self.scale[:, None]
        return out.sub_(self.mean[:, None])

    def column_blocks(self, chunk: int = DEFAULT_CHUNK) -> Iterator[tuple[int, Tensor]]:
        """(s, C_T[:, s:s+chunk]) for every column block, as a transposed view of rows of
        C_T^T (the streamed cache's layout)."""
        for s in range(0, self.d_vocab, chunk):
            yield s, self.columns(s, s + chunk).T.contiguous().T

    def grams(self, F: Tensor, edges: Sequence[int], chunk: int = DEFAULT_CHUNK) -> list[Tensor]:
        """Diagonal blocks of (F^T C_T)(F^T C_T)^T, see :func:`blocked_grams`."""
        return blocked_grams(F, edges, self.column_blocks(chunk))


def add_gram(M: Tensor, X: Tensor) -> Tensor:
    """M += X^T X on the upper block triangle only (column blocks of about GRAM_BLOCK: the
    lower blocks, about half the multiply-adds, are skipped), each block's product in X's
    dtype, added to float64 M; :func:`mirror` completes M once every term is in."""
    k = X.shape[1]
    nb = max(1, -(-k // GRAM_BLOCK))
    e = [k * i // nb for i in range(nb + 1)]
    for a, b in zip(e, e[1:], strict=False):
        M[a:b, a:] += (X[:, a:b].T @ X[:, a:]).to(torch.float64)
    return M


def gram_macs(rows: int, k: int) -> int:
    """Multiply-adds of :func:`add_gram` over ``rows`` rows of width k (about half of k^2)."""
    nb = max(1, -(-k // GRAM_BLOCK))
    e = [k * i // nb for i in range(nb + 1)]
    return rows * sum((b - a) * (k - a) for a, b in zip(e, e[1:], strict=False))


def mirror(M: Tensor) -> Tensor:
    """The symmetric matrix whose upper block triangle (:func:`add_gram`) is M's, in place."""
    k = M.shape[0]
    nb = max(1, -(-k // GRAM_BLOCK))
    e = [k * i // nb for i in range(nb + 1)]
    for a, b in zip(e, e[1:], strict=False):
        M[a:b, a:b] = torch.triu(M[a:b, a:b]) + torch.triu(M[a:b, a:b], 1).T
        M[b:, a:b] = M[a:b, b:].T
    return M


def blocked_grams(F: Tensor, edges: Sequence[int],
                  blocks: Iterable[tuple[int, Tensor]]) -> list[Tensor]:
    """For each column group F_i = F[:, edges[i]:edges[i+1]]: (F_i^T C_T)(F_i^T C_T)^T,
    accumulated in float64 over the column blocks (s, C_T[:, s:e]) of the target (each
    block's product in F's dtype)."""
    PPt = [torch.zeros(e - s, e - s, dtype=torch.float64, device=F.device)
           for s, e in zip(edges, edges[1:], strict=False)]
    for _, Cb in blocks:
        P = F.T @ Cb
        for i in range(len(PPt)):
            add_gram(PPt[i], P[edges[i]:edges[i + 1]].T)
    return [mirror(M) for M in PPt]


def target_terms(th: Target, chunk: int = DEFAULT_CHUNK
                 ) -> tuple[float, float, float, Primitives]:
    """(||C C^T||_F, ||C||_F^2, ||C^T 1||^2, the null terms of B = C C^T) over column chunks;
    ||C C^T||_F = ||C^T C||_F with C^T C_b = T^T (scale * C_b) - 1 (mean^T C_b); diag(B) and
    the centred row sums B 1 - (1^T B 1 / V) 1 = sum_b (C_b - 1 cbar_b^T)(C_b^T 1) (cbar the
    column means: token-centred blocks, so a profile every row shares costs no precision) from
    the same chunks (products in T's dtype, sums in float64).

    Peak extra memory O(V * chunk); cost O(V^3), once per statistics.
    """
    f64, dev = torch.float64, th.T.device
    total = torch.zeros((), dtype=f64, device=dev)
    trace, grand = total.clone(), total.clone()
    diag = torch.zeros(th.d_vocab, dtype=f64, device=dev)
    rowsum = torch.zeros(th.d_vocab, dtype=f64, device=dev)
    for s in range(0, th.d_vocab, chunk):
        Cb = th.columns(s, s + chunk)
        trace += torch.linalg.vector_norm(Cb, dtype=f64) ** 2
        colsum = Cb.sum(dim=0, dtype=f64)
        grand += (colsum ** 2).sum()
        diag += (Cb * Cb).sum(dim=1, dtype=f64)
        centred = Cb - (colsum / th.d_vocab).to(Cb.dtype)[None, :]  # small where rows agree
        rowsum += (centred @ colsum.to(Cb.dtype)).to(f64)  # B 1 - (1^T B 1 / V) 1 in the end
        del centred
        m = th.mean @ Cb
        G = th.T.T @ Cb.mul_(th.scale[:, None])
        total += torch.linalg.vector_norm(G.sub_(m[None, :]), dtype=f64) ** 2
    null = vector_terms(diag.cpu(), rowsum.cpu(), float(total), float(grand))
    return float(total.sqrt()), float(trace), float(grand), null


def row_scales(norms: Tensor, sums: Tensor, V: int) -> tuple[Tensor, Tensor]:
    """(scale, mean) of C_T from T's row norms and sums (float64): 1 / norm (0 for a zero
    row) and the row means of rownorm(T)."""
    scale = torch.where(norms > 0, 1.0 / norms.clamp_min(1e-300), torch.zeros_like(norms))
    return scale, scale * sums / V


def _row_norms_sums(T: Tensor, chunk: int) -> tuple[Tensor, Tensor]:
    """Row L2 norms and row sums in float64, over row chunks (no V x V float64 copy)."""
    norms, sums = [], []
    for s in range(0, T.shape[0], chunk):
        block = T[s:s + chunk].to(torch.float64)
        norms.append(torch.linalg.vector_norm(block, dim=1))
        sums.append(block.sum(dim=1))
    return torch.cat(norms), torch.cat(sums)


def prepare_target(name: str, T: Tensor, *, dtype: torch.dtype = torch.float64,
                   device: str | torch.device = "cpu", chunk: int = DEFAULT_CHUNK) -> Target:
    """Prepare target matrix T (rows = tokens): row scales, row means, ||cov|| and the chance
    terms. T itself is kept (moved/cast only if ``dtype``/``device`` differ)."""
    if T.ndim != 2 or T.shape[0] != T.shape[1]:
        raise ValueError(f"target matrix {name!r} must be square [V, V], got {tuple(T.shape)}")
    T = T.to(device=device, dtype=dtype)
    scale, mean = row_scales(*_row_norms_sums(T, chunk), T.shape[1])
    th = Target(name, T, scale.to(dtype), mean.to(dtype), 0.0)
    return Target(name, T, th.scale, th.mean, *target_terms(th, chunk))
