"""Frobenius cosine of row-centred covariances, factored so no |V| x |V| model matrix is formed.

The paper's score (spec leading-terms.md section 5): for a model matrix M (rows = tokens) and a
target matrix T (a corpus statistic; rows = the same tokens),

    cov(X)  = C C^T / (ncols - 1),  C = X with each ROW centred by its own mean
    score   = <cov(M), cov(rownorm(T))>_F / (||cov(M)||_F ||cov(rownorm(T))||_F)

where rownorm divides each row by its L2 norm (all-zero rows, e.g. tokens the corpus never
shows, stay zero). The (ncols - 1) factors cancel in a cosine.

Factored form. Every model matrix here is either a tall matrix E [V, d] (its covariance is
C_E C_E^T) or a low-rank product M = F G^T with F, G [V, r] (attention, logits). Row-centring
M gives F Gc^T with Gc = G centred over its rows (column means removed), so

    cov(M) ~ F S F^T,  S = Gc^T Gc  [r, r]   (S = I for a tall matrix, F = C_E).

With C_T the row-normalised, row-centred target matrix and P = F^T C_T [r, V]:

    <F S F^T, C_T C_T^T> = <S, P P^T>,   ||F S F^T||_F^2 = tr(S H S H),  H = F^T F,

i.e. the identity <A A^T, B B^T> = ||A^T B||_F^2 generalised by a middle factor S. P P^T is
accumulated over column chunks of C_T, so peak extra memory is O(V * chunk + r^2), never V^2.
In memory (:class:`Target`) C_T is never stored: a column chunk is rebuilt from the target
matrix and two V-vectors (row scales and row means), so the only V x V matrix held is the
statistic itself. The sweep can instead prepare C_T once per statistics file on disk and stream
it in blocks (:class:`~pythia_probe.analysis.prepared.StreamedTarget`), so no V x V matrix is
held at all. ``target_terms`` (||C_T C_T^T||_F, a V^3 computation) depends only on the
statistics and is computed once per run, chunked the same way.

The target protocol (what :func:`scores` reads): ``name``, ``d_vocab``, ``dtype``, ``norm``,
``trace`` (tr C_T C_T^T), ``total`` (1^T C_T C_T^T 1) and ``grams(F, edges, chunk)``, the
diagonal [r_i, r_i] blocks of (F^T C_T)(F^T C_T)^T for the column groups ``edges`` of F. Both
targets here compute them over column blocks of C_T (:func:`blocked_grams`); a target stored
another way (e.g. sparse plus low rank at the full vocabulary) implements ``grams``, ``norm``,
``trace`` and ``total`` its own way and every analysis works unchanged.

Every score comes with its chance level (:mod:`pythia_probe.analysis.chance`: the exact
expectation of the cosine over a random relabelling of the statistics' tokens), from the same
r x r products and the target's ``trace`` and ``total``: :func:`scores`.

``materialised_cosine`` is the literal float64 reference used by the tests and the benchmark.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from pythia_probe.analysis.chance import chance_level, model_terms
from pythia_probe.linalg import frobenius_cosine

DEFAULT_CHUNK = 4096


def row_centre(X: Tensor) -> Tensor:
    """Subtract each row's own mean."""
    return X - X.mean(dim=1, keepdim=True)


def row_normalise(X: Tensor) -> Tensor:
    """Divide each row by its L2 norm; all-zero rows stay zero."""
    norms = torch.linalg.vector_norm(X, dim=1, keepdim=True)
    return X / torch.where(norms > 0, norms, torch.ones_like(norms))


def covariance(X: Tensor) -> Tensor:
    """The paper's covariance: centre each ROW by its own mean, then C C^T / (ncols - 1)."""
    C = row_centre(X)
    return C @ C.T / (X.shape[1] - 1)


def materialised_cosine(M: Tensor, T: Tensor) -> float:
    """Literal reference: cos(cov(M), cov(rownorm(T))) in float64 with V x V matrices."""
    M, T = M.to(torch.float64), T.to(torch.float64)
    return frobenius_cosine(covariance(M), covariance(row_normalise(T)))


@dataclass(frozen=True)
class Factors:
    """cov(M) up to a positive scale as F S F^T; S None means the identity.

    Build with :func:`tall` (M = E itself) or :func:`product` (M = F G^T).
    """

    F: Tensor
    S: Tensor | None = None

    @property
    def rank(self) -> int:
        return self.F.shape[1]


def tall(E: Tensor, dtype: torch.dtype = torch.float64) -> Factors:
    """Factors of cov(E) for a tall matrix E [V, d] (rows = tokens)."""
    return Factors(row_centre(E.to(dtype)))


def product(F: Tensor, G: Tensor, dtype: torch.dtype = torch.float64) -> Factors:
    """Factors of cov(F G^T) for F, G [V, r] without forming the V x V product."""
    G = G.to(dtype)
    Gc = G - G.mean(dim=0, keepdim=True)
    return Factors(F.to(dtype), Gc.T @ Gc)


@dataclass(frozen=True)
class Target:
    """A target matrix T prepared for scoring without a second V x V copy.

    C_T = rownorm(T) row-centred is never stored: its column chunk s:e is
    ``scale[:, None] * T[:, s:e] - mean[:, None]`` (scale = 1 / row norm, 0 for zero rows;
    mean = row means of rownorm(T)). ``norm`` = ||C_T C_T^T||_F, ``trace`` = ||C_T||_F^2 and
    ``total`` = ||C_T^T 1||^2 (the chance level's terms).
    """

    name: str
    T: Tensor
    scale: Tensor
    mean: Tensor
    norm: float
    trace: float = 0.0
    total: float = 0.0

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
        """(s, C_T[:, s:s+chunk]) for every column block (as StreamedTarget's)."""
        for s in range(0, self.d_vocab, chunk):
            yield s, self.columns(s, s + chunk)

    def grams(self, F: Tensor, edges: Sequence[int], chunk: int = DEFAULT_CHUNK) -> list[Tensor]:
        """Diagonal blocks of (F^T C_T)(F^T C_T)^T, see :func:`blocked_grams`."""
        return blocked_grams(F, edges, self.column_blocks(chunk))


def blocked_grams(F: Tensor, edges: Sequence[int],
                  blocks: Iterable[tuple[int, Tensor]]) -> list[Tensor]:
    """For each column group F[:, edges[i]:edges[i+1]] = F_i: (F_i^T C_T)(F_i^T C_T)^T in
    float64, accumulated over the column blocks (s, C_T[:, s:e]) of the target."""
    PPt = [torch.zeros(e - s, e - s, dtype=torch.float64, device=F.device)
           for s, e in zip(edges, edges[1:], strict=False)]
    for _, Cb in blocks:
        P = F.T @ Cb
        for i in range(len(PPt)):
            Pi = P[edges[i]:edges[i + 1]].to(torch.float64)
            PPt[i] += Pi @ Pi.T
    return PPt


def target_terms(th: Target, chunk: int = DEFAULT_CHUNK) -> tuple[float, float, float]:
    """(||C C^T||_F, ||C||_F^2, ||C^T 1||^2) over column chunks; ||C C^T||_F = ||C^T C||_F with
    C^T C_b = T^T (scale * C_b) - 1 (mean^T C_b).

    Peak extra memory O(V * chunk); cost O(V^3), once per statistics.
    """
    total = torch.zeros((), dtype=torch.float64, device=th.T.device)
    trace, grand = total.clone(), total.clone()
    for s in range(0, th.d_vocab, chunk):
        Cb = th.columns(s, s + chunk)
        trace += torch.linalg.vector_norm(Cb, dtype=torch.float64) ** 2
        grand += (Cb.sum(dim=0, dtype=torch.float64) ** 2).sum()
        m = th.mean @ Cb
        G = th.T.T @ Cb.mul_(th.scale[:, None])
        total += torch.linalg.vector_norm(G.sub_(m[None, :]), dtype=torch.float64) ** 2
    return float(total.sqrt()), float(trace), float(grand)


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
    """Prepare target matrix T (rows = tokens): row scales, row means and ||cov||.

    T itself is kept (moved/cast only if ``dtype``/``device`` differ): no V x V copy is made.
    """
    if T.ndim != 2 or T.shape[0] != T.shape[1]:
        raise ValueError(f"target matrix {name!r} must be square [V, V], got {tuple(T.shape)}")
    T = T.to(device=device, dtype=dtype)
    norms, sums = _row_norms_sums(T, chunk)
    scale = torch.where(norms > 0, 1.0 / norms.clamp_min(1e-300), torch.zeros_like(norms))
    mean = scale * sums / T.shape[1]
    th = Target(name, T, scale.to(dtype), mean.to(dtype), 0.0)
    return Target(name, T, th.scale, th.mean, *target_terms(th, chunk))


class Score(NamedTuple):
    """A covariance cosine and its chance level (:mod:`pythia_probe.analysis.chance`)."""

    value: float
    chance: float


def _model_norm(f: Factors, H: Tensor) -> Tensor:
    if f.S is None:
        return (H * H).sum().sqrt()
    A = f.S @ H
    return (A * A.T).sum().clamp_min(0).sqrt()


def _cross(f: Factors, PPt: Tensor) -> Tensor:
    return PPt.trace() if f.S is None else (f.S * PPt).sum()


def scores(factors: Sequence[Factors], target, chunk: int = DEFAULT_CHUNK) -> list[Score]:
    """Covariance cosines, with their chance levels, of several model matrices against one
    target, sharing each C_T chunk.

    ``target``: a :class:`Target` (T resident), a
    :class:`~pythia_probe.analysis.prepared.StreamedTarget` (C_T streamed from disk), or
    anything with ``name``, ``d_vocab``, ``dtype``, ``norm``, ``trace``, ``total`` and
    ``grams(F, edges, chunk)``. All factors are stacked column-wise so each chunk of C_T is read
    once; the only intermediates are [sum r, chunk] and per-factor [r, r].
    """
    if not factors:
        return []
    V = target.d_vocab
    for f in factors:
        if f.F.shape[0] != V:
            raise ValueError(f"model matrix has {f.F.shape[0]} token rows but target "
                             f"{target.name!r} has d_vocab={V}")
    Fall = torch.cat([f.F.to(target.dtype) for f in factors], dim=1)
    edges = torch.tensor([0] + [f.rank for f in factors]).cumsum(0).tolist()
    PPt = target.grams(Fall, edges, chunk)
    out = []
    for f, ppt in zip(factors, PPt, strict=True):
        f64 = Factors(f.F.to(torch.float64), None if f.S is None else f.S.to(torch.float64))
        H = f64.F.T @ f64.F
        norm = float(_model_norm(f64, H))
        trace, total = model_terms(f64.F, f64.S, H)
        out.append(Score(float(_cross(f64, ppt)) / (norm * target.norm),
                         chance_level(trace, total, norm, target.trace, target.total,
                                      target.norm, V)))
    return out


def cosines(factors: Sequence[Factors], target, chunk: int = DEFAULT_CHUNK) -> list[float]:
    """The values of :func:`scores` (no chance levels)."""
    return [s.value for s in scores(factors, target, chunk)]


def cosine(f: Factors, target, chunk: int = DEFAULT_CHUNK) -> float:
    """Covariance cosine of one factored model matrix against a prepared target."""
    return cosines([f], target, chunk)[0]


def packed_scores(groups: Iterable[Sequence[Factors]], target, chunk: int = DEFAULT_CHUNK,
                  max_rank: int = 0) -> Iterator[list[Score]]:
    """:func:`scores` of each group (e.g. one layer's factors), in order.

    Consecutive groups share one pass over C_T while their stacked rank stays <= ``max_rank``
    (0: one pass per group). ``groups`` is consumed lazily, so at most one pass's factors are
    alive: memory grows with ``max_rank``, passes over the target (reads of a streamed cache)
    shrink with it.
    """
    pending: list[Sequence[Factors]] = []
    for group in groups:
        rank = sum(f.rank for g in (*pending, group) for f in g)
        if pending and rank > max_rank:
            yield from _split(scores([f for g in pending for f in g], target, chunk), pending)
            pending = []
        pending.append(group)
    if pending:
        yield from _split(scores([f for g in pending for f in g], target, chunk), pending)


def packed_cosines(groups: Iterable[Sequence[Factors]], target, chunk: int = DEFAULT_CHUNK,
                   max_rank: int = 0) -> Iterator[list[float]]:
    """The values of :func:`packed_scores`."""
    for group in packed_scores(groups, target, chunk, max_rank):
        yield [s.value for s in group]


def _split(values: list, groups: Sequence[Sequence[Factors]]) -> Iterator[list]:
    i = 0
    for g in groups:
        yield values[i:i + len(g)]
        i += len(g)
