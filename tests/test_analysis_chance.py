"""Chance levels: the closed form equals the average over every relabelling of the statistics'
tokens (exactly, at a small vocabulary), a Monte-Carlo average at a larger one, every analysis's
rows (per head and LN-folded too), the streamed cache, and random embeddings on average."""

import itertools
import math

import pytest
import torch

from pythia_probe.analysis import REGISTRY, Options, StepTensors, target_matrix
from pythia_probe.analysis.cosine import (
    covariance,
    materialised_cosine,
    prepare_target,
    product,
    row_normalise,
    scores,
    tall,
)
from pythia_probe.errors import OutOfRangeError
from pythia_probe.linalg import frobenius_cosine
from pythia_probe.testing.dense import DenseTarget


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _target(V, seed):
    # every row shares a column profile (frequent tokens follow every token), so the rows of
    # the centred target correlate, as corpus statistics' rows do
    T = _rand(V, V, seed=seed).abs() + 2 * _rand(V, seed=seed + 1).abs()
    T[1] = 0  # a token the corpus never shows
    return T


def _every_relabelling(M, T):
    """Literal: the mean of cos(cov(M), cov(rownorm(T[p]))) over all V! row permutations p
    (token i described by token p[i]'s statistics)."""
    vals = [materialised_cosine(M, T[list(p)]) for p in itertools.permutations(range(len(T)))]
    return sum(vals) / len(vals)


@pytest.mark.parametrize("seed", [0, 1])
def test_closed_form_equals_the_mean_over_every_permutation(seed):
    V = 6
    T = _target(V, seed)
    th = prepare_target("T", T, chunk=4)
    E = _rand(V, 3, seed=seed + 10) + 0.7  # anisotropic: every row shares a direction
    F, G = _rand(V, 2, seed=seed + 20), _rand(V, 2, seed=seed + 30) + 0.5
    got = scores([tall(E), product(F, G)], th, chunk=4)
    assert got[0].chance == pytest.approx(_every_relabelling(E, T), rel=1e-12, abs=1e-14)
    assert got[1].chance == pytest.approx(_every_relabelling(F @ G.T, T), rel=1e-12,
                                          abs=1e-14)
    assert got[0].value == pytest.approx(materialised_cosine(E, T), rel=1e-12)


def test_relabelling_rows_or_rows_and_columns_is_the_same_null():
    T, E = _target(7, 3), _rand(7, 4, seed=4)
    for p in ([3, 0, 6, 1, 5, 2, 4], [6, 5, 4, 3, 2, 1, 0]):
        assert materialised_cosine(E, T[p]) == pytest.approx(
            materialised_cosine(E, T[p][:, p]), rel=1e-12)


def test_closed_form_equals_a_monte_carlo_average():
    V, n = 40, 4000
    T, E = _target(V, 5), _rand(V, 6, seed=6) + 0.4
    A, B = covariance(E), covariance(row_normalise(T))
    g = torch.Generator().manual_seed(7)
    vals = torch.tensor([frobenius_cosine(A, B[p][:, p]) for p in
                         (torch.randperm(V, generator=g) for _ in range(n))],
                        dtype=torch.float64)
    chance = scores([tall(E)], prepare_target("T", T))[0].chance
    se = float(vals.std()) / math.sqrt(n)
    assert abs(float(vals.mean()) - chance) < 4 * se
    assert se < 0.01 * abs(chance)  # the check has teeth: the error is small against chance


def _tiny(V=6, Vmodel=8, d=4, H=2, L=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    res = {k: [r(Vmodel, d) + 0.3 for _ in range(L)] for k in ("pre", "attn", "post")}
    return StepTensors(res, [r(H, d, d // H) for _ in range(L)],
                       [r(H, d, d // H) for _ in range(L)], r(Vmodel, d) + 0.2, r(d, Vmodel),
                       ln1_w=[1 + 0.5 * r(d) for _ in range(L)])


def _attention_matrix(x, layer, head, folded):
    """Literal A_tok of one layer (head None: the head mean), raw or LN-folded."""
    E, W_Q, W_K = x.residuals["pre"][layer][:6], x.W_Q[layer], x.W_K[layer]
    d = E.shape[1]
    P = torch.eye(d, dtype=torch.float64) - 1.0 / d
    D = torch.diag(x.ln1_w[layer]) if folded else torch.eye(d, dtype=torch.float64)
    P = P if folded else torch.eye(d, dtype=torch.float64)
    heads = range(W_Q.shape[0]) if head is None else [head]
    A_emb = torch.stack([(P @ D @ W_Q[h]) @ (P @ D @ W_K[h]).T for h in heads]).mean(0)
    return (E @ P) @ A_emb @ (E @ P).T


@pytest.mark.parametrize("name", ["attention", "attention_lnfold"])
def test_attention_rows_per_head_carry_the_exact_chance(name):
    x, V = _tiny(seed=1), 6
    Q = _target(V, 8)
    rows = REGISTRY[name].run(x, {"Qbar": prepare_target("Qbar", Q, chunk=4)},
                              Options(chunk=4, per_head=[2]))
    assert [r["head"] for r in rows] == [None, None, 0, 1]
    for row in rows:
        M = _attention_matrix(x, row["layer"] - 1, row["head"], name == "attention_lnfold")
        assert row["value"] == pytest.approx(materialised_cosine(M, Q), rel=1e-10)
        assert row["chance"] == pytest.approx(_every_relabelling(M, Q), rel=1e-10, abs=1e-13)


def test_embedding_and_unembedding_rows_carry_the_exact_chance():
    x, V = _tiny(seed=2), 6
    stats = type("S", (), {"PhiBT": _target(V, 9), "Bbar": _target(V, 10) - 0.5})()
    th = {n: prepare_target(n, target_matrix(stats, n), chunk=4)
          for n in ("PhiBT", "Bbar", "BbarT")}
    rows = REGISTRY["embedding"].run(x, th, Options(chunk=4))
    for row in rows[:3]:
        E = x.residuals[row["metric"][4:]][row["layer"] - 1][:V]
        assert row["chance"] == pytest.approx(_every_relabelling(E, stats.PhiBT), rel=1e-10)
    got = {r["metric"]: r["chance"] for r in REGISTRY["unembedding"].run(x, th, Options())}
    WE, WU = x.W_E[:V], x.W_U[:, :V]
    assert got["cos_WU_Bbar"] == pytest.approx(_every_relabelling(WU.T, stats.Bbar.T),
                                               rel=1e-10)
    assert got["cos_WEWU_Bbar"] == pytest.approx(_every_relabelling(WE @ WU, stats.Bbar),
                                                 rel=1e-10)


def test_factored_and_float32_targets_give_the_oracle_chance():
    V = 31
    T = _target(V, 11)
    E, F, G = _rand(V, 5, seed=12) + 1, _rand(V, 3, seed=13), _rand(V, 3, seed=14)
    mem = scores([tall(E), product(F, G)], DenseTarget("T", T), chunk=7)
    factored = prepare_target("PhiBT", T, chunk=7)
    assert [s.chance for s in scores([tall(E), product(F, G)], factored, 7)] == pytest.approx(
        [s.chance for s in mem], rel=1e-12)
    th32 = prepare_target("T", T, dtype=torch.float32)
    got = scores([tall(E, torch.float32), product(F, G, torch.float32)], th32)
    assert [s.chance for s in got] == pytest.approx([s.chance for s in mem], rel=1e-5)


def test_isotropic_random_embeddings_score_their_chance_on_average():
    """For random Gaussian embeddings E[A] is proportional to I, so the mean cosine of many
    random embeddings is the mean chance level (the norms barely fluctuate at V >> d)."""
    V, d, n = 300, 16, 60
    th = prepare_target("T", _target(V, 15), chunk=128)
    got = [scores([tall(_rand(V, d, seed=100 + i))], th, 128)[0] for i in range(n)]
    values = torch.tensor([s.value for s in got])
    chances = torch.tensor([s.chance for s in got])
    se = float(values.std()) / math.sqrt(n)
    assert abs(float(values.mean()) - float(chances.mean())) < 4 * se + 1e-3
    # an anisotropic model (a shared direction in every row) has a much higher chance level
    shared = scores([tall(_rand(V, d, seed=1) + 3 * _rand(1, d, seed=2))], th, 128)[0]
    assert shared.chance > 5 * float(chances.mean()) > 0


def test_a_chance_out_of_range_is_refused_naming_the_cell():
    from pythia_probe.sweep.scoring import check_range

    a = REGISTRY["embedding"]
    check_range([{"analysis": "embedding", "value": 0.5, "chance": None}], a, 1e-8)
    with pytest.raises(OutOfRangeError, match="layer 3, metric cos_pre: chance 1.5"):
        check_range([{"analysis": "embedding", "layer": 3, "metric": "cos_pre", "value": 0.5,
                      "chance": 1.5}], a, 1e-8)
