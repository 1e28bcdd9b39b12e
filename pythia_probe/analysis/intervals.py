"""A cell's scale beside its value (issue 19 item 2): ``ceiling`` and ``ci_low``/``ci_high``.

``ceiling``: the cosine the target reaches against itself across two disjoint halves of the
corpus, the same covariance cosine with the model side replaced by the other half's target:

    ceiling = <C_A C_A^T, C_B C_B^T>_F / (||C_A C_A^T||_F ||C_B C_B^T||_F)
            = ||C_A^T C_B||_F^2 / (norm_A norm_B),

C_A, C_B the prepared targets (row-normalised, row-centred) of the statistics of half A and
half B. It depends on the target alone, so every cell scored against that target carries the
same ceiling. Computed over column blocks of C_B (``||C_A^T C_B||_F^2 = sum_J tr M_J``,
M_J = (C_B[:, J]^T C_A)(C_B[:, J]^T C_A)^T, the same product a model basis gets), so neither
target is ever V x V beyond what its own holding already is.

``ci_low``, ``ci_high``: a delete-a-group jackknife over the G document groups. With theta the
value from every document and theta_(g) the value with group g left out (the statistics of the
other G - 1 groups: pass-1 counts merge exactly, so each is cheap; Qbar and Delta conditioned on
the full corpus's Gbar), the pseudo-values p_g = G theta - (G - 1) theta_(g) give

    se = sqrt( sum_g (p_g - pbar)^2 / (G (G - 1)) ) = sqrt( (G - 1)/G sum_g (theta_(g) - mean)^2 )
    [ci_low, ci_high] = theta -+ t_{0.975, G-1} se,

centred on the value itself (so ci_low <= value <= ci_high by construction). Why a jackknife:
the replicates are exact sub-corpora statistics, no resampling of documents with repeats (which
a bootstrap would need, and which pass 2's Gbar conditioning does not allow cheaply).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import torch
from scipy.stats import t as student_t

LEVEL = 0.95
KEY = ("analysis", "layer", "head", "metric")


def jackknife(value: float, left_out: Sequence[float], level: float = LEVEL
              ) -> tuple[float, float]:
    """(ci_low, ci_high) of ``value`` from its G leave-one-group-out values (see above)."""
    G = len(left_out)
    if G < 2:
        raise ValueError(f"a jackknife needs at least 2 groups, got {G}")
    x = torch.tensor(list(left_out), dtype=torch.float64)
    se = float(((G - 1) / G * ((x - x.mean()) ** 2).sum()).sqrt())
    half = float(student_t.ppf(0.5 + level / 2, G - 1)) * se
    return value - half, value + half


def cross_cosine(A, blocks_B: Iterable[tuple], norm_B: float) -> float:
    """cos(C_A C_A^T, C_B C_B^T) with A a prepared target (``grams``, ``norm``) and C_B given
    as its column blocks: (s, C_B[:, s:e]), or (weights, block) where a column stands for
    ``weight`` equal columns (a factored target's columns the corpus never fills)."""
    total = 0.0
    for w, block in blocks_B:
        M = A.grams(block.to(A.dtype), [0, block.shape[1]])[0]
        d = M.diagonal()
        total += float(d.sum() if isinstance(w, int) else (d * w.to(d)).sum())
    return total / (A.norm * norm_B)


def ceiling(A, B, chunk: int = 1024) -> float:
    """The ceiling of the cells scored against target ``A`` (half A) with ``B`` (half B),
    both prepared targets (resident, streamed or factored)."""
    blocks = B.weighted_column_blocks(chunk) if hasattr(B, "weighted_column_blocks") else \
        B.column_blocks(chunk)
    return cross_cosine(A, blocks, B.norm)


def add_intervals(rows: list[dict], left_out: Sequence[list[dict]],
                  ceilings: Mapping[str, float] | None = None,
                  target_of: Callable[[str, str], str | None] | None = None) -> list[dict]:
    """``rows`` with ``ci_low``/``ci_high`` from the rows of the same cells scored against the
    G leave-one-group-out targets (joined on analysis, layer, head, metric), and ``ceiling``
    of the cell's target (``target_of(analysis, metric)``, None: no ceiling); a cell whose
    chance is not below its ceiling says so in its
    ``settings`` (``chance_not_below_ceiling=<chance>>=<ceiling>``: the two halves agree no
    better than unrelated models, so the value has no scale there), never silently."""
    by_cell = [{tuple(r.get(k) for k in KEY): r["value"] for r in rep} for rep in left_out]
    out = []
    for r in rows:
        cell = tuple(r.get(k) for k in KEY)
        missing = [i for i, rep in enumerate(by_cell) if cell not in rep]
        if missing:
            raise ValueError(f"cell {cell} missing from left-out replicate(s) {missing}")
        low, high = jackknife(r["value"], [rep[cell] for rep in by_cell])
        row = {**r, "ci_low": low, "ci_high": high}
        target = None if target_of is None else target_of(r["analysis"], r["metric"])
        if ceilings is not None and target is not None:
            row["ceiling"] = ceilings[target]
            chance = r.get("chance")
            if chance is not None and not chance < row["ceiling"]:
                flag = f"chance_not_below_ceiling={chance:.4g}>={row['ceiling']:.4g}"
                row["settings"] = ";".join(x for x in (r.get("settings"), flag) if x)
        out.append(row)
    return out
