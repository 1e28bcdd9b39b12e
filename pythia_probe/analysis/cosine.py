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

i.e. the identity <A A^T, B B^T> = ||A^T B||_F^2 generalised by a middle factor S. Every F is
F = E W for a model-side matrix E shared by many factors (a residual stream, all heads of a
layer, both attention variants): :class:`~pythia_probe.analysis.basis.Basis` computes
(E^T C_T)(E^T C_T)^T and E^T E once per (E, target), and each factor's P P^T and H are
W^T (.) W, never V x V, and the target is read once per basis, not once per factor.

The target protocol (what :func:`scores` reads): ``name``, ``d_vocab``, ``dtype``, ``norm``
(||C_T C_T^T||_F), ``trace`` (tr C_T C_T^T), ``total`` (1^T C_T C_T^T 1), ``null_terms`` (the
centred permutation primitives of C_T C_T^T, :mod:`pythia_probe.analysis.chance`) and
``grams(F, edges, chunk)``, the diagonal [r_i, r_i] blocks of (F^T C_T)(F^T C_T)^T for the
column groups ``edges`` of F. Implemented by
:class:`~pythia_probe.analysis.factored.FactoredTarget`, the one way a target is held: the
statistics' sparse parts plus rank-one terms at the full vocabulary, or a dense [V, V] matrix (a
top-k or first-format statistics file's, a hand-built one) as its own single factor
(:func:`~pythia_probe.analysis.factored.prepare_target`).

Every score comes with its chance level and that level's spread
(:mod:`pythia_probe.analysis.chance`: the exact mean and standard deviation of the cosine over a
random relabelling of the statistics' tokens), from the same products, the target's ``trace``,
``total`` and ``null_terms``, and one pass over the rows of each factor (:attr:`ModelCovariance.
null_terms`, computed once per factor however many targets it is scored against).

Cost of ``chance_sd`` per cell: the row pass, about V r (d + 1) + V r^2 multiply-adds for a
factor of rank r on a basis of width d + 1 (V (d + 1)^2 + (d + 1)^2 r where that is less, e.g.
a head mean of rank d; V d for a tall matrix), in the compute dtype over row blocks of the basis,
sums in float64; against each target then a few scalar operations. This is V / (d + 1) times
the cell's own r-space algebra and about r / V of one pass of its basis over a dense target
(measured in benchmarks/bench_chance.py).

``materialised_cosine`` is the literal float64 reference used by the tests and the benchmark.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

import torch
from torch import Tensor

from pythia_probe.analysis.basis import DEFAULT_CHUNK, Basis, fill_target_grams
from pythia_probe.analysis.chance import (
    Primitives,
    chance_level,
    chance_sd,
    factor_terms,
    model_terms,
)
from pythia_probe.analysis.factored import (  # noqa: F401 - the analyses' one import place
    FactoredTarget,
    prepare_target,
)
from pythia_probe.linalg import frobenius_cosine


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


@dataclass(frozen=True, eq=False)
class ModelCovariance:
    """cov(M) up to a positive scale as F S F^T with F = basis.Y W (float64 coefficients, see
    :class:`~pythia_probe.analysis.basis.Basis`); W None means row_centre(E) itself, S None
    the identity. Build with :func:`tall`, :func:`product` or :func:`product_on`."""

    basis: Basis
    W: Tensor | None = None
    S: Tensor | None = None

    @property
    def rank(self) -> int:
        return self.basis.d if self.W is None else self.W.shape[1]

    @cached_property
    def null_terms(self) -> Primitives:
        """The centred permutation primitives of A = F S F^T
        (:func:`~pythia_probe.analysis.chance.factor_terms`), once per factor."""
        b = self.basis
        _, Gc, e = b.moments()
        if self.W is None:
            Gc, s = Gc[:b.d, :b.d], e[:b.d]
        else:
            Gc, s = self.W.T @ (Gc @ self.W), self.W.T @ e
        q, r0 = _row_terms(self)
        return factor_terms(Gc, s, self.S, q, r0, b.V)


def tall(E: Tensor | Basis, dtype: torch.dtype = torch.float64) -> ModelCovariance:
    """Factors of cov(E) for a tall matrix E [V, d] (rows = tokens), or of a basis's E."""
    return ModelCovariance(E if isinstance(E, Basis) else Basis(E, dtype))


def product_on(basis: Basis, Wf: Tensor, Wg: Tensor, centred: bool = False) -> ModelCovariance:
    """Factors of cov(F G^T) with F = E Wf, G = E Wg on one basis (``centred``: F = C_E Wf,
    G = C_E Wg with C_E = row_centre(E)); S = Gc^T Gc = Wg'^T (Yc^T Yc) Wg'."""
    coef = basis.centred if centred else basis.whole
    Wg = coef(Wg)
    return ModelCovariance(basis, coef(Wf), Wg.T @ (basis.moments()[1] @ Wg))


def product(F: Tensor, G: Tensor, dtype: torch.dtype = torch.float64) -> ModelCovariance:
    """Factors of cov(F G^T) for F, G [V, r] without forming the V x V product."""
    basis = Basis(F, dtype)
    Gc = G.to(dtype) - G.to(dtype).mean(dim=0, keepdim=True)
    return ModelCovariance(basis, basis.whole(), (Gc.T @ Gc).to(torch.float64))


def _row_terms(f: ModelCovariance) -> tuple[Tensor, Tensor]:
    """(q, r0), float64 [V]: q_i = a_ii - fbar^T S fbar and r0 = A_0 1 = V Fc S fbar of
    A = F S F^T, F = Y W, over row blocks of the basis's token-centred Yc = Y - 1 ybar^T:
    L = Yc W (rank r) and Z = L S give q_i = z_i.l_i + 2 z_i.fbar, r0_i = V z_i.fbar; where
    (d + 1)^2 < r (d + 1 + r), L = Yc and Z = Yc (W S W^T) instead (same sums, fewer
    multiply-adds). Products in the basis's dtype, sums in float64."""
    b = f.basis
    ybar = b.moments()[2] / b.V
    W, M = f.W, f.S
    wide = W is not None and M is not None and b.width ** 2 < f.rank * (b.width + f.rank)
    if wide:
        W, M = None, W @ M @ W.T
        m = ybar
    else:
        m = ybar[:b.d] if W is None else W.T @ ybar
    cols = b.width if wide or f.W is not None else b.d
    dt = b.dtype
    shift, m_dt = ybar.to(dt), m.to(dt)
    W_dt = None if W is None else W.to(dt)
    M_dt = None if M is None else M.to(dt)
    q, r0 = [], []
    for s in range(0, b.V, b.chunk):
        L = (b.Y[s:s + b.chunk] - shift)[:, :cols]
        if W_dt is not None:
            L = L @ W_dt
        Z = L if M_dt is None else L @ M_dt
        zm = (Z @ m_dt).to(torch.float64)
        q.append((Z * L).sum(dim=1, dtype=torch.float64) + 2 * zm)
        r0.append(b.V * zm)
    return torch.cat(q), torch.cat(r0)


class Score(NamedTuple):
    """A covariance cosine, its chance level and the chance level's standard deviation
    (:mod:`pythia_probe.analysis.chance`)."""

    value: float
    chance: float
    chance_sd: float


def _moments(f: ModelCovariance, target) -> tuple[Tensor, Tensor, Tensor]:
    """(P P^T, H = F^T F, F^T 1) of a factor against ``target`` (float64, r x r)."""
    M = f.basis.target_gram(target)
    G, _, e = f.basis.moments()
    if f.W is None:
        d = f.basis.d
        return M[:d, :d], G[:d, :d], e[:d]
    return f.W.T @ (M @ f.W), f.W.T @ (G @ f.W), f.W.T @ e


def _score(f: ModelCovariance, target) -> Score:
    PPt, H, s = _moments(f, target)
    if f.S is None:
        cross, norm2 = PPt.trace(), (H * H).sum()
    else:
        SH = f.S @ H
        cross, norm2 = (f.S * PPt).sum(), (SH * SH.T).sum().clamp_min(0)
    trace, total = model_terms(f.S, H, s)
    norm = float(norm2.sqrt())
    V = target.d_vocab
    return Score(float(cross) / (norm * target.norm),
                 chance_level(trace, total, norm, target.trace, target.total, target.norm, V),
                 chance_sd(f.null_terms, target.null_terms, norm, target.norm, V))


def scores(factors: Sequence[ModelCovariance], target, chunk: int = DEFAULT_CHUNK) -> list[Score]:
    """Covariance cosines, with their chance levels, of several model matrices against one
    target: every basis not yet projected on the target is, in one pass over it.

    ``target``: a :class:`~pythia_probe.analysis.factored.FactoredTarget`, or anything with
    the protocol of this module's docstring.
    """
    fill_target_grams([f.basis for f in factors], target, chunk)
    return [_score(f, target) for f in factors]


def cosines(factors: Sequence[ModelCovariance], target, chunk: int = DEFAULT_CHUNK) -> list[float]:
    """The values of :func:`scores` (no chance levels)."""
    return [s.value for s in scores(factors, target, chunk)]


def cosine(f: ModelCovariance, target, chunk: int = DEFAULT_CHUNK) -> float:
    """Covariance cosine of one factored model matrix against a prepared target."""
    return cosines([f], target, chunk)[0]


def packed_scores(groups: Iterable[Sequence[ModelCovariance]], target, chunk: int = DEFAULT_CHUNK,
                  max_rank: int = 0) -> Iterator[list[Score]]:
    """:func:`scores` of each group (e.g. one layer's factors), in order.

    Consecutive groups share one pass over C_T while the stacked width of their distinct bases
    stays <= ``max_rank`` (0: one pass per group). ``groups`` is consumed lazily, so at most one
    pass's factors are alive: memory grows with ``max_rank``, passes over the target shrink
    with it.
    """
    pending: list[Sequence[ModelCovariance]] = []
    for group in groups:
        bases = {id(f.basis): f.basis for g in (*pending, group) for f in g}
        width = sum(b.width for b in bases.values() if not b.has(target))
        if pending and width > max_rank:
            yield from _split(scores([f for g in pending for f in g], target, chunk), pending)
            pending = []
        pending.append(group)
    if pending:
        yield from _split(scores([f for g in pending for f in g], target, chunk), pending)


def packed_cosines(groups: Iterable[Sequence[ModelCovariance]], target, chunk: int = DEFAULT_CHUNK,
                   max_rank: int = 0) -> Iterator[list[float]]:
    """The values of :func:`packed_scores`."""
    for group in packed_scores(groups, target, chunk, max_rank):
        yield [s.value for s in group]


def _split(values: list, groups: Sequence[Sequence[ModelCovariance]]) -> Iterator[list]:
    i = 0
    for g in groups:
        yield values[i:i + len(g)]
        i += len(g)
