"""Chance level of a covariance cosine: its exact expectation over relabelled statistics.

A cell's score is cos(A, B) = <A, B>_F / (|A|_F |B|_F) with A = cov(model matrix) and
B = cov(rownorm(target)) = C_T C_T^T (see :mod:`pythia_probe.analysis.cosine`). A model with no
relation to the statistics is modelled by relabelling the statistics' tokens uniformly at random:
B -> P B P^T for a uniformly random permutation matrix P (the same permutation on rows and
columns, which is what permuting the target's rows, or its rows and columns, does to B), while A
stays. The chance level is the exact expectation

    chance = E_P[cos(A, P B P^T)] = E_P[<A, P B P^T>] / (|A|_F |B|_F)

(the norms do not depend on P). Entry (i, j) of P B P^T is B[pi(i), pi(j)]: on the diagonal a
uniformly random diagonal entry of B, off it a uniformly random off-diagonal one, so

    E[P B P^T] = d_B I + o_B (1 1^T - I),   d_B = tr(B) / V,
                                             o_B = (1^T B 1 - tr B) / (V (V - 1))
    E<A, P B P^T> = tr(A) d_B + (1^T A 1 - tr A) o_B.

Every term is a vector quantity of the factors, never V x V: for the target tr(B) = ||C_T||_F^2
and 1^T B 1 = ||C_T^T 1||^2 (the target's ``trace`` and ``total``, computed once per statistics);
for a model matrix with covariance F S F^T (S = I for a tall matrix), tr(A) = <S, F^T F> and
1^T A 1 = (F^T 1)^T S (F^T 1). The covariances are of ROW-centred matrices, not column-centred,
so 1^T A 1 and 1^T B 1 are not zero: a model whose token rows share a common direction (an
anisotropic embedding) scores a chance level above that of isotropic random embeddings, and the
relabelling keeps that part, which is why it is the null here rather than random weights. For
isotropic random embeddings (E[A] proportional to I) the expectation reduces to
tr(A) tr(B) / (V |A| |B|), the value random embeddings themselves score on average.
"""

from __future__ import annotations

import math

from torch import Tensor


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
