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
(||C_T C_T^T||_F), ``trace`` (tr C_T C_T^T), ``total`` (1^T C_T C_T^T 1) and
``grams(F, edges, chunk)``, the diagonal [r_i, r_i] blocks of (F^T C_T)(F^T C_T)^T for the
column groups ``edges`` of F. Implemented by :class:`~pythia_probe.analysis.dense.Target` (T
resident), :class:`~pythia_probe.analysis.prepared.StreamedTarget` (C_T streamed from disk) and
:class:`~pythia_probe.analysis.factored.FactoredTarget` (sparse plus rank-one statistics at the
full vocabulary, no V x V matrix at all).

Every score comes with its chance level (:mod:`pythia_probe.analysis.chance`: the exact
expectation of the cosine over a random relabelling of the statistics' tokens), from the same
products and the target's ``trace`` and ``total``.

``materialised_cosine`` is the literal float64 reference used by the tests and the benchmark.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from pythia_probe.analysis.basis import Basis, fill_target_grams
from pythia_probe.analysis.chance import chance_level, model_terms
from pythia_probe.analysis.dense import (  # noqa: F401 - the analyses' one import place
    DEFAULT_CHUNK,
    Target,
    blocked_grams,
    prepare_target,
    row_centre,
    row_normalise,
    target_terms,
)
from pythia_probe.linalg import frobenius_cosine


def covariance(X: Tensor) -> Tensor:
    """The paper's covariance: centre each ROW by its own mean, then C C^T / (ncols - 1)."""
    C = row_centre(X)
    return C @ C.T / (X.shape[1] - 1)


def materialised_cosine(M: Tensor, T: Tensor) -> float:
    """Literal reference: cos(cov(M), cov(rownorm(T))) in float64 with V x V matrices."""
    M, T = M.to(torch.float64), T.to(torch.float64)
    return frobenius_cosine(covariance(M), covariance(row_normalise(T)))


@dataclass(frozen=True, eq=False)
class Factors:
    """cov(M) up to a positive scale as F S F^T with F = basis.Y W (float64 coefficients, see
    :class:`~pythia_probe.analysis.basis.Basis`); W None means row_centre(E) itself, S None
    the identity. Build with :func:`tall`, :func:`product` or :func:`product_on`."""

    basis: Basis
    W: Tensor | None = None
    S: Tensor | None = None

    @property
    def rank(self) -> int:
        return self.basis.d if self.W is None else self.W.shape[1]


def tall(E: Tensor | Basis, dtype: torch.dtype = torch.float64) -> Factors:
    """Factors of cov(E) for a tall matrix E [V, d] (rows = tokens), or of a basis's E."""
    return Factors(E if isinstance(E, Basis) else Basis(E, dtype))


def product_on(basis: Basis, Wf: Tensor, Wg: Tensor, centred: bool = False) -> Factors:
    """Factors of cov(F G^T) with F = E Wf, G = E Wg on one basis (``centred``: F = C_E Wf,
    G = C_E Wg with C_E = row_centre(E)); S = Gc^T Gc = Wg'^T (Yc^T Yc) Wg'."""
    coef = basis.centred if centred else basis.whole
    Wg = coef(Wg)
    return Factors(basis, coef(Wf), Wg.T @ (basis.moments()[1] @ Wg))


def product(F: Tensor, G: Tensor, dtype: torch.dtype = torch.float64) -> Factors:
    """Factors of cov(F G^T) for F, G [V, r] without forming the V x V product."""
    basis = Basis(F, dtype)
    Gc = G.to(dtype) - G.to(dtype).mean(dim=0, keepdim=True)
    return Factors(basis, basis.whole(), (Gc.T @ Gc).to(torch.float64))


class Score(NamedTuple):
    """A covariance cosine and its chance level (:mod:`pythia_probe.analysis.chance`)."""

    value: float
    chance: float


def _moments(f: Factors, target) -> tuple[Tensor, Tensor, Tensor]:
    """(P P^T, H = F^T F, F^T 1) of a factor against ``target`` (float64, r x r)."""
    M = f.basis.target_gram(target)
    G, _, e = f.basis.moments()
    if f.W is None:
        d = f.basis.d
        return M[:d, :d], G[:d, :d], e[:d]
    return f.W.T @ (M @ f.W), f.W.T @ (G @ f.W), f.W.T @ e


def _score(f: Factors, target) -> Score:
    PPt, H, s = _moments(f, target)
    if f.S is None:
        cross, norm2 = PPt.trace(), (H * H).sum()
    else:
        SH = f.S @ H
        cross, norm2 = (f.S * PPt).sum(), (SH * SH.T).sum().clamp_min(0)
    trace, total = model_terms(f.S, H, s)
    norm = float(norm2.sqrt())
    return Score(float(cross) / (norm * target.norm),
                 chance_level(trace, total, norm, target.trace, target.total, target.norm,
                              target.d_vocab))


def scores(factors: Sequence[Factors], target, chunk: int = DEFAULT_CHUNK) -> list[Score]:
    """Covariance cosines, with their chance levels, of several model matrices against one
    target: every basis not yet projected on the target is, in one pass over it.

    ``target``: a :class:`Target` (T resident), a
    :class:`~pythia_probe.analysis.prepared.StreamedTarget` (C_T streamed from disk), a
    :class:`~pythia_probe.analysis.factored.FactoredTarget`, or anything with the protocol of
    this module's docstring.
    """
    fill_target_grams([f.basis for f in factors], target, chunk)
    return [_score(f, target) for f in factors]


def cosines(factors: Sequence[Factors], target, chunk: int = DEFAULT_CHUNK) -> list[float]:
    """The values of :func:`scores` (no chance levels)."""
    return [s.value for s in scores(factors, target, chunk)]


def cosine(f: Factors, target, chunk: int = DEFAULT_CHUNK) -> float:
    """Covariance cosine of one factored model matrix against a prepared target."""
    return cosines([f], target, chunk)[0]


def packed_scores(groups: Iterable[Sequence[Factors]], target, chunk: int = DEFAULT_CHUNK,
                  max_rank: int = 0) -> Iterator[list[Score]]:
    """:func:`scores` of each group (e.g. one layer's factors), in order.

    Consecutive groups share one pass over C_T while the stacked width of their distinct bases
    stays <= ``max_rank`` (0: one pass per group). ``groups`` is consumed lazily, so at most one
    pass's factors are alive: memory grows with ``max_rank``, passes over the target (reads of
    a streamed cache) shrink with it.
    """
    pending: list[Sequence[Factors]] = []
    for group in groups:
        bases = {id(f.basis): f.basis for g in (*pending, group) for f in g}
        width = sum(b.width for b in bases.values() if not b.has(target))
        if pending and width > max_rank:
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
