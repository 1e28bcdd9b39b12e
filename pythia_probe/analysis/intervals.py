"""A cell's scale beside its value (issue 19 item 2, issue 26 item 3): ``ceiling``,
``ceiling_half``, ``ci_low``/``ci_high``, ``effect`` and ``above_chance``.

``ceiling_half``: the cosine the target reaches against itself across two disjoint halves of the
corpus, the same covariance cosine with the model side replaced by the other half's target:

    r = <C_A C_A^T, C_B C_B^T>_F / (||C_A C_A^T||_F ||C_B C_B^T||_F)
      = ||C_A^T C_B||_F^2 / (norm_A norm_B),

C_A, C_B the prepared targets (row-normalised, row-centred) of the statistics of half A and
half B. It depends on the target alone, so every cell scored against that target carries the
same ceiling. Computed over column blocks of C_B (``||C_A^T C_B||_F^2 = sum_J tr M_J``,
M_J = (C_B[:, J]^T C_A)(C_B[:, J]^T C_A)^T, the same product a model basis gets), so neither
target is ever V x V beyond what its own holding already is.

``ceiling``: the score the corpus-independent statistic itself would reach against the run's
target, estimated from r: sqrt(2 r / (1 + r)) (r itself where r <= 0: two halves that do not
agree have no scale to correct). In the signal-plus-noise model behind split-half reliability
(a target = the statistic of the text, corpus-independent, plus sampling noise whose power falls
as 1 / documents, independent between halves) r = s / (s + 2 e), with s the signal's and e the
full corpus's noise power; Spearman-Brown's 2 r / (1 + r) = s / (s + e) is what an independent
corpus of the run's size scores against the run's target, and the statistic itself scores the
square root of that, sqrt(s / (s + e)) (as for reliability in psychometrics: an observed
score correlates with its true score by the square root of its reliability). That is the
highest value a model can be expected to reach against this finite corpus, so it is the
ceiling: ``effect`` = 1 means as close as the text's own statistic. The split half alone
understates it: on Markov-chain text with a known transition matrix the corrected value is the
closer to what the true statistic scores (tests/test_analysis_intervals.py;
benchmarks/bench_chance.py prints the numbers).

``effect`` = (value - chance) / (ceiling - chance): 0 at chance, 1 at the ceiling; NaN where
there is no ceiling or the ceiling is not above chance. ``above_chance``: a one-sided test whose
rate of flagging weights unrelated to the statistics is at most 5%: z = (value - chance) /
sqrt(chance_sd^2 + se^2) > 1.960, with chance_sd the exact standard deviation of the
relabelling null (:mod:`pythia_probe.analysis.chance`) and se the jackknife's standard error
below (0 for a row without intervals): the value's distance from chance against both the null's
spread and the documents' sampling noise. 1.960 is the normal 2.5% point, not the 5% one: the
relabelling null is skewed to the right, and at 1.645 random weights were flagged 5.3-6.1% of
the time by chance_sd alone (tests/test_analysis_chance_sd.py, benchmarks/bench_chance.py);
at 1.960 the rate stays under 5% for a skewness up to about 1.1 (Cornish-Fisher), where the
relabellings measured show 0.16-0.56.

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

import math
from collections.abc import Callable, Iterable, Mapping, Sequence

import torch
from scipy.stats import norm as normal
from scipy.stats import t as student_t

LEVEL = 0.95
KEY = ("analysis", "layer", "head", "metric")
TEST_LEVEL = 0.025  # above_chance: one-sided, the normal point; false flags <= 5% (above)
Z_ABOVE = float(normal.ppf(1 - TEST_LEVEL))  # 1.960


def jackknife_se(left_out: Sequence[float]) -> float:
    """The jackknife standard error from G leave-one-group-out values (see above)."""
    G = len(left_out)
    if G < 2:
        raise ValueError(f"a jackknife needs at least 2 groups, got {G}")
    x = torch.tensor(list(left_out), dtype=torch.float64)
    return float(((G - 1) / G * ((x - x.mean()) ** 2).sum()).sqrt())


def jackknife(value: float, left_out: Sequence[float], level: float = LEVEL
              ) -> tuple[float, float]:
    """(ci_low, ci_high) of ``value`` from its G leave-one-group-out values (see above)."""
    half = float(student_t.ppf(0.5 + level / 2, len(left_out) - 1)) * jackknife_se(left_out)
    return value - half, value + half


def spearman_brown(r: float) -> float:
    """Spearman-Brown: the split-half cosine r at twice the documents, 2 r / (1 + r) (what an
    independent corpus of the full size scores against the full corpus; r where r <= 0)."""
    return 2 * r / (1 + r) if r > 0 else r


def full_ceiling(r: float) -> float:
    """The ``ceiling`` of a split-half cosine r: sqrt(2 r / (1 + r)), the expected score of
    the corpus-independent statistic against the full corpus's target (r where r <= 0)."""
    return math.sqrt(spearman_brown(r)) if r > 0 else r


def effect(value: float, chance: float, ceiling: float | None) -> float:
    """(value - chance) / (ceiling - chance); NaN without a ceiling above chance."""
    if ceiling is None or not ceiling > chance:
        return math.nan
    return (value - chance) / (ceiling - chance)


def above_chance(value: float, chance: float, chance_sd: float, se: float = 0.0) -> bool:
    """The one-sided test: (value - chance) / sqrt(chance_sd^2 + se^2) > 1.960 (False
    where both are 0: the null is then the point chance itself)."""
    spread = math.hypot(chance_sd, se)
    return bool(spread > 0 and value - chance > Z_ABOVE * spread)


def judge(row: dict, se: float = 0.0) -> dict:
    """``row`` with ``effect`` and ``above_chance`` (rows with a chance level and its spread;
    ``se`` the value's jackknife standard error, 0 without intervals)."""
    chance, sd = row.get("chance"), row.get("chance_sd")
    if chance is None or sd is None:
        return row
    return {**row, "effect": effect(row["value"], chance, row.get("ceiling")),
            "above_chance": above_chance(row["value"], chance, sd, se)}


def cross_cosine(A, blocks_B: Iterable[tuple], norm_B: float) -> float:
    """cos(C_A C_A^T, C_B C_B^T) with A a prepared target (``grams``, ``norm``) and C_B given
    as its column blocks (weights, block), each column standing for ``weight`` equal columns
    (a factored target's columns the corpus never fills)."""
    total = 0.0
    for w, block in blocks_B:
        M = A.grams(block.to(A.dtype), [0, block.shape[1]])[0]
        total += float((M.diagonal() * w.to(M)).sum())
    return total / (A.norm * norm_B)


def ceiling(A, B, chunk: int = 1024) -> float:
    """The ceiling of the cells scored against target ``A`` (half A) with ``B`` (half B),
    both factored targets."""
    return cross_cosine(A, B.weighted_column_blocks(chunk), B.norm)


def add_intervals(rows: list[dict], left_out: Sequence[list[dict]],
                  ceilings: Mapping[str, float] | None = None,
                  target_of: Callable[[str, str], str | None] | None = None) -> list[dict]:
    """``rows`` with ``ci_low``/``ci_high`` from the rows of the same cells scored against the
    G leave-one-group-out targets (joined on analysis, layer, head, metric), ``ceiling_half``
    (``ceilings``: the split-half cosine per target) and ``ceiling`` (:func:`full_ceiling` of
    it) of the cell's target (``target_of(analysis, metric)``, None: no ceiling),
    then ``effect`` and ``above_chance`` (:func:`judge`, with the jackknife's se); a cell
    whose chance is not below its ceiling says so in its
    ``settings`` (``chance_not_below_ceiling=<chance>>=<ceiling>``: the two halves agree no
    better than unrelated models, so the value has no scale there), never silently."""
    by_cell = [{tuple(r.get(k) for k in KEY): r["value"] for r in rep} for rep in left_out]
    out = []
    for r in rows:
        cell = tuple(r.get(k) for k in KEY)
        missing = [i for i, rep in enumerate(by_cell) if cell not in rep]
        if missing:
            raise ValueError(f"cell {cell} missing from left-out replicate(s) {missing}")
        values = [rep[cell] for rep in by_cell]
        low, high = jackknife(r["value"], values)
        row = {**r, "ci_low": low, "ci_high": high}
        target = None if target_of is None else target_of(r["analysis"], r["metric"])
        if ceilings is not None and target is not None:
            row["ceiling_half"] = ceilings[target]
            row["ceiling"] = full_ceiling(row["ceiling_half"])
            chance = r.get("chance")
            if chance is not None and not chance < row["ceiling"]:
                flag = f"chance_not_below_ceiling={chance:.4g}>={row['ceiling']:.4g}"
                row["settings"] = ";".join(x for x in (r.get("settings"), flag) if x)
        out.append(judge(row, jackknife_se(values)))
    return out
