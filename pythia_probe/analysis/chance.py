"""Chance level of a covariance cosine and its spread: the exact mean and standard deviation of
the cosine over relabelled statistics.

A cell's score is cos(A, B) = <A, B>_F / (|A|_F |B|_F) with A = cov(model matrix) and
B = cov(rownorm(target)) = C_T C_T^T (see :mod:`pythia_probe.analysis.cosine`). A model with no
relation to the statistics is modelled by relabelling the statistics' tokens uniformly at random:
B -> P B P^T for a uniformly random permutation matrix P (the same permutation on rows and
columns, which is what permuting the target's rows, or its rows and columns, does to B), while A
stays. The norms do not depend on P, so the null distribution of the cosine is that of the
numerator Gamma = <A, P B P^T>_F (the Mantel / QAP statistic) divided by |A|_F |B|_F.

Mean (``chance``). Entry (i, j) of P B P^T is B[pi(i), pi(j)]: on the diagonal a uniformly
random diagonal entry of B, off it a uniformly random off-diagonal one, so

    E[P B P^T] = d_B I + o_B (1 1^T - I),   d_B = tr(B) / V,
                                             o_B = (1^T B 1 - tr B) / (V (V - 1))
    E<A, P B P^T> = tr(A) d_B + (1^T A 1 - tr A) o_B.

Spread (``chance_sd``), exact permutation moments. Gamma^2 = sum_{ijkl} a_ij a_kl
b_{pi(i)pi(j)} b_{pi(k)pi(l)}. For an index tuple (i, j, k, l) whose equality pattern is the set
partition p of its four positions (|p| distinct values), (pi(i), pi(j), pi(k), pi(l)) is uniform
over the (V)_|p| = V (V-1) ... (V-|p|+1) tuples of the same pattern, so

    E[Gamma^2] = sum_p alpha_p(A) alpha_p(B) / (V)_|p|,   over the 15 set partitions p,

alpha_p(X) = sum of x_ij x_kl over the tuples of EXACTLY pattern p. The "free" sums phi_q(X)
(tuples whose positions in one block of q are equal, blocks free to coincide) are
phi_q = sum_{p >= q} alpha_p (p coarser than q), so alpha follows by Moebius inversion on the
partition lattice, alpha_q = sum_{p >= q} mu(q, p) phi_p with mu(q, p) = prod over the blocks
of p of (-1)^(k-1) (k-1)!, k the number of q's blocks merged into it. For a symmetric X every
phi_q is one of six primitives (:class:`Primitives`): (1^T X 1)^2, tr X 1^T X 1, (tr X)^2,
||X 1||^2 (two positions linked across the factors), ||X||_F^2 (both linked), sum_i x_ii
(X 1)_i (three positions equal), sum_i x_ii^2 (all four). Var = E[Gamma^2] - E[Gamma]^2 and
chance_sd = sqrt(Var) / (|A|_F |B|_F).

Numerically the variance is taken as E[Gamma_0^2] with A_0 = A - E[P A P^T] and B_0 = B -
E[P B P^T] (the parts of A and B that move under relabelling): Gamma - E[Gamma] =
<A_0, P B_0 P^T> exactly (the invariant parts are orthogonal to every P B_0 P^T), and A_0,
B_0 have trace and grand sum 0, so the large (1^T A 1)^2-type terms that E[Gamma]^2 would
cancel never enter. Their primitives are formed without cancellation (:func:`factor_terms`:
with F = Fc + 1 fbar^T token-centred, A = Fc S Fc^T + u 1^T + 1 u^T + gamma 1 1^T,
u = Fc S fbar, and ||A_0||_F^2 = ||Fc S Fc^T||_F^2 - t_c^2 / (V - 1) + 2 V ||u||^2,
A_0 1 = V u, diag(A_0) = diag(A) - tr(A) / V); :func:`centre` is the plain formula from the
raw primitives (the reference the tests hold the stable one to).

Every term is a vector quantity of the factors, never V x V: for the target (once per
statistics) tr(B) = ||C_T||_F^2, 1^T B 1 = ||C_T^T 1||^2, B 1 = C_T (C_T^T 1) and
b_ii = ||row i of C_T||^2; for a model matrix with covariance F S F^T (S = I for a tall matrix),
tr(A) = <S, F^T F>, 1^T A 1 = (F^T 1)^T S (F^T 1) and one pass over the rows of F for its
diagonal. The covariances are of ROW-centred matrices, not column-centred, so 1^T A 1 and
1^T B 1 are not zero: a model whose token rows share a common direction (an anisotropic
embedding) scores a chance level above that of isotropic random embeddings, and the relabelling
keeps that part, which is why it is the null here rather than random weights. For isotropic
random embeddings (E[A] proportional to I) the expectation reduces to tr(A) tr(B) / (V |A| |B|),
the value random embeddings themselves score on average; random weights whose distribution does
not change when tokens are relabelled (iid embeddings, each token fed alone through random
layers) score from a mixture of these relabelling nulls, so a test calibrated against the null
is calibrated for them.
"""

from __future__ import annotations

import math
from functools import cache
from typing import NamedTuple

import torch
from torch import Tensor


class Primitives(NamedTuple):
    """The six sums of a symmetric V x V matrix X that the permutation moments need."""

    total: float  # 1^T X 1
    trace: float  # tr X
    rowsum_sq: float  # ||X 1||^2
    frob_sq: float  # ||X||_F^2
    diag_rowsum: float  # sum_i x_ii (X 1)_i
    diag_sq: float  # sum_i x_ii^2


NULL_FIELDS = ("rowsum_sq", "frob_sq", "diag_rowsum", "diag_sq")  # centred: trace, total 0


def null_meta(p: Primitives) -> dict[str, str]:
    """The centred primitives as file metadata (``null_<field>``: repr of the float)."""
    return {f"null_{k}": repr(getattr(p, k)) for k in NULL_FIELDS}


def null_from_meta(meta: dict[str, str]) -> Primitives:
    """:func:`null_meta` read back (KeyError or ValueError where it is not there)."""
    return Primitives(0.0, 0.0, *(float(meta[f"null_{k}"]) for k in NULL_FIELDS))


def primitives(X: Tensor) -> Primitives:
    """The primitives of a materialised symmetric matrix (float64; the tests' reference)."""
    X = X.to(torch.float64)
    r, d = X.sum(dim=1), X.diagonal()
    return Primitives(float(r.sum()), float(d.sum()), float(r @ r), float((X * X).sum()),
                      float(d @ r), float(d @ d))


def centre(p: Primitives, V: int) -> Primitives:
    """The primitives of X_0 = X - E[P X P^T] from those of X (plain, cancelling formulas):
    X_0 1 = X 1 - (1^T X 1 / V) 1, diag(X_0) = diag(X) - tr X / V, ||X_0||^2 = ||X||^2 -
    ||E[P X P^T]||^2; its trace and grand sum are 0."""
    d = p.trace / V
    o = (p.total - p.trace) / (V * (V - 1)) if V > 1 else 0.0
    return Primitives(0.0, 0.0, p.rowsum_sq - p.total ** 2 / V,
                      p.frob_sq - V * d * d - V * (V - 1) * o * o,
                      p.diag_rowsum - p.trace * p.total / V, p.diag_sq - p.trace ** 2 / V)


def vector_terms(diag: Tensor, rowsum: Tensor, frob_sq: float, total: float) -> Primitives:
    """The centred primitives (:func:`centre`) of a symmetric X given in float64 by its diagonal,
    its row sums X 1 (or X 1 - (1^T X 1 / V) 1: they are centred entry by entry before any sum),
    ||X||_F^2 and 1^T X 1."""
    V = diag.numel()
    trace = float(diag.sum())
    d0, r0 = diag - diag.mean(), rowsum - rowsum.mean()
    o = (total - trace) / (V * (V - 1)) if V > 1 else 0.0
    frob0 = frob_sq - trace ** 2 / V - V * (V - 1) * o * o
    return Primitives(0.0, 0.0, float(r0 @ r0), max(frob0, 0.0), float(d0 @ r0), float(d0 @ d0))


def factor_terms(Gc: Tensor, s: Tensor, S: Tensor | None, q: Tensor, r0: Tensor,
                 V: int) -> Primitives:
    """The centred primitives of A = F S F^T without cancellation (see the module docstring):
    Gc = Fc^T Fc (token-centred), s = F^T 1, q_i = a_ii - fbar^T S fbar and r0 = A_0 1 (both
    from one pass over F's rows, float64)."""
    Ss = s if S is None else S @ s
    rowsum_sq = float(Ss @ Gc @ Ss)
    SG = Gc if S is None else S @ Gc
    t_c = float(SG.trace())
    frob_c = float((SG * SG.T).sum())
    frob0 = frob_c - t_c ** 2 / (V - 1) + 2 * rowsum_sq / V if V > 1 else 0.0
    q0 = q - q.mean()
    return Primitives(0.0, 0.0, rowsum_sq, max(frob0, 0.0), float(q0 @ r0), float(q0 @ q0))


def _partitions(n: int = 4) -> list[tuple[int, ...]]:
    """Set partitions of n positions as restricted growth strings (block labels in order of
    first appearance): 15 for n = 4."""
    out = [(0,)]
    for _ in range(n - 1):
        out = [(*p, b) for p in out for b in range(max(p) + 2)]
    return out


PARTITIONS = _partitions()


def _coarser(p: tuple[int, ...], q: tuple[int, ...]) -> bool:
    """q >= p: every block of p lies inside one block of q."""
    return all(q[a] == q[b] for a in range(4) for b in range(4) if p[a] == p[b])


def _moebius(p: tuple[int, ...], q: tuple[int, ...]) -> int:
    """mu(p, q) on the partition lattice (p finer than q)."""
    out = 1
    for block in set(q):
        k = len({p[a] for a in range(4) if q[a] == block})
        out *= (-1) ** (k - 1) * math.factorial(k - 1)
    return out


@cache
def _inversion() -> tuple[tuple[tuple[int, int], ...], ...]:
    """Per partition p: the (index of q, mu(p, q)) over q >= p, so alpha_p = sum mu phi_q."""
    return tuple(tuple((j, _moebius(p, q)) for j, q in enumerate(PARTITIONS) if _coarser(p, q))
                 for p in PARTITIONS)


def free_sum(q: tuple[int, ...], x: Primitives) -> float:
    """phi_q(X) = sum of x_ij x_kl over (i, j, k, l) equal within each block of q (labels of
    positions i, j, k, l), for symmetric X."""
    first, second = {q[0], q[1]}, {q[2], q[3]}
    diag1, diag2 = q[0] == q[1], q[2] == q[3]
    shared = first & second
    if not shared:
        return (x.trace if diag1 else x.total) * (x.trace if diag2 else x.total)
    if diag1 and diag2:
        return x.diag_sq
    if diag1 or diag2:
        return x.diag_rowsum
    return x.rowsum_sq if len(shared) == 1 else x.frob_sq


def exact_sums(x: Primitives) -> list[float]:
    """alpha_p(X) for the 15 partitions p (:data:`PARTITIONS`), by Moebius inversion."""
    phi = [free_sum(q, x) for q in PARTITIONS]
    return [math.fsum(mu * phi[j] for j, mu in row) for row in _inversion()]


def falling(V: int, m: int) -> int:
    """(V)_m = V (V - 1) ... (V - m + 1)."""
    return math.prod(range(V - m + 1, V + 1))


def second_moment(a: Primitives, b: Primitives, V: int) -> float:
    """E_P[<A, P B P^T>^2] over uniformly random permutations of V tokens."""
    alpha, beta = exact_sums(a), exact_sums(b)
    return math.fsum(x * y / falling(V, len(set(p)))
                     for x, y, p in zip(alpha, beta, PARTITIONS, strict=True)
                     if len(set(p)) <= V)


def mean_numerator(a: Primitives, b: Primitives, V: int) -> float:
    """E_P[<A, P B P^T>]."""
    o_b = (b.total - b.trace) / (V * (V - 1)) if V > 1 else 0.0
    return a.trace * b.trace / V + (a.total - a.trace) * o_b


def null_variance(a0: Primitives, b0: Primitives, V: int) -> float:
    """Var_P[<A, P B P^T>] from the centred primitives of A and B (:func:`centre`,
    :func:`factor_terms`, :func:`vector_terms`): E[<A_0, P B_0 P^T>^2]."""
    return max(second_moment(a0, b0, V), 0.0)


def chance_sd(a0: Primitives, b0: Primitives, norm_a: float, norm_b: float, V: int) -> float:
    """SD_P[cos(A, P B P^T)] from the centred primitives and the Frobenius norms."""
    den = norm_a * norm_b
    return math.sqrt(null_variance(a0, b0, V)) / den if den > 0 else math.nan


def model_terms(S: Tensor | None, H: Tensor, s: Tensor) -> tuple[float, float]:
    """(tr A, 1^T A 1) of A = F S F^T (S None: the identity) from H = F^T F and s = F^T 1."""
    if S is None:
        return float(H.trace()), float(s @ s)
    return float((S * H).sum()), float(s @ S @ s)


def chance_level(trace_a: float, total_a: float, norm_a: float, trace_b: float,
                 total_b: float, norm_b: float, V: int) -> float:
    """E_P[cos(A, P B P^T)] from the traces, grand sums (1^T X 1) and Frobenius norms."""
    d_b = trace_b / V
    o_b = (total_b - trace_b) / (V * (V - 1)) if V > 1 else 0.0
    den = norm_a * norm_b
    return (trace_a * d_b + (total_a - trace_a) * o_b) / den if den > 0 else math.nan
