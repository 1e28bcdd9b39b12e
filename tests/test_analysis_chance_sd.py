"""chance_sd, the standard deviation of the relabelling null (issue 26 item 3): the Moebius
inversion against the exact pattern sums, the factored primitives of every model factor and
target kind against the materialised matrices, the SD against every one of the V! relabellings
and a Monte-Carlo at a larger V, every analysis's rows, the caches' formats, and the
calibration of ``above_chance`` on weights unrelated to the statistics."""

import itertools
import math

import numpy as np
import pytest
import torch
from test_analysis_chance import _attention_matrix, _tiny
from test_analysis_factored import _dense, parts_from_tokens

from pythia_probe.analysis import (
    REGISTRY,
    Options,
    factored_cache,
    target_matrix,
)
from pythia_probe.analysis import chance as ch
from pythia_probe.analysis.basis import Basis
from pythia_probe.analysis.cosine import (
    covariance,
    prepare_target,
    product,
    product_on,
    row_centre,
    row_normalise,
    scores,
    tall,
)
from pythia_probe.analysis.factored import NAMES, FactoredTarget, Parts, target_vectors
from pythia_probe.analysis.intervals import Z_ABOVE, jackknife_se
from pythia_probe.stats.reference import reference_stats
from pythia_probe.testing import markov
from pythia_probe.testing.dense import DenseTarget

pytestmark = pytest.mark.usefixtures("one_thread")


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _target(V, seed):
    """Rows sharing a column profile, as corpus statistics' rows do; one token never seen."""
    T = _rand(V, V, seed=seed).abs() + 2 * _rand(V, seed=seed + 1).abs()
    T[1] = 0
    return T


def _relabelled(A, B):
    """Literal: cos(A, P B P^T) for every one of the V! permutations (float64)."""
    V = A.shape[0]
    P = torch.tensor(list(itertools.permutations(range(V))))
    Bp = B[P[:, :, None], P[:, None, :]]
    return (A[None] * Bp).sum(dim=(1, 2)) / (A.norm() * B.norm())


def _model_matrix(f):
    """F S F^T of a factor, materialised (the covariance up to its positive scale)."""
    Y = f.basis.Y
    F = Y[:, :f.basis.d] if f.W is None else Y @ f.W
    return F @ F.T if f.S is None else F @ f.S @ F.T


def _target_matrix(T):
    C = row_centre(row_normalise(T))
    return C @ C.T


def _factors(V, seed):
    """A tall anisotropic matrix, a product, and two factors on one basis: one of low rank,
    one wide enough that the row pass goes through W S W^T."""
    b = Basis(_rand(V, 4, seed=seed + 3) + 0.3)
    return [tall(_rand(V, 3, seed=seed) + 0.7),
            product(_rand(V, 2, seed=seed + 1), _rand(V, 2, seed=seed + 2) + 0.5),
            product_on(b, _rand(4, 2, seed=seed + 4), _rand(4, 2, seed=seed + 5)),
            product_on(b, _rand(4, 4, seed=seed + 6), _rand(4, 4, seed=seed + 7), centred=True)]


def test_moebius_inversion_gives_the_exact_pattern_sums():
    """alpha_p = sum of x_ij x_kl over the tuples of exactly pattern p, by enumerating all V^4
    tuples at V = 5, against the inversion of the six primitives' free sums."""
    V = 5
    X = _rand(V, 3, seed=1) + 0.4
    X = X @ X.T + torch.diag(_rand(V, seed=2))
    want = dict.fromkeys(ch.PARTITIONS, 0.0)
    for t in itertools.product(range(V), repeat=4):
        labels: dict[int, int] = {}
        pattern = tuple(labels.setdefault(v, len(labels)) for v in t)
        want[pattern] += float(X[t[0], t[1]] * X[t[2], t[3]])
    got = ch.exact_sums(ch.primitives(X))
    scale = max(abs(v) for v in want.values())
    assert len(ch.PARTITIONS) == 15
    assert got == pytest.approx([want[p] for p in ch.PARTITIONS], abs=1e-12 * scale)
    assert sum(got) == pytest.approx(float(X.sum()) ** 2, rel=1e-12)  # every tuple once


@pytest.mark.parametrize("seed", [0, 1])
def test_factored_primitives_equal_the_materialised_ones(seed):
    V = 6
    T = _target(V, seed + 40)
    th = prepare_target("T", T, chunk=4)
    want_b = ch.centre(ch.primitives(_target_matrix(T)), V)
    assert th.null_terms == pytest.approx(want_b, rel=1e-12, abs=1e-14)
    for f in _factors(V, seed):
        want = ch.centre(ch.primitives(_model_matrix(f)), V)
        assert f.null_terms == pytest.approx(want, rel=1e-11, abs=1e-12 * want.frob_sq)
    wide = _factors(V, seed)[3]
    assert wide.basis.width ** 2 < wide.rank * (wide.basis.width + wide.rank)  # the K route


@pytest.mark.parametrize("seed", [0, 1])
def test_chance_sd_is_the_sd_over_every_relabelling(seed):
    V = 6
    T = _target(V, seed + 50)
    fs = _factors(V, seed + 10)
    got = scores(fs, prepare_target("T", T, chunk=4), chunk=4)
    B = _target_matrix(T)
    for f, s in zip(fs, got, strict=True):
        vals = _relabelled(_model_matrix(f), B)
        assert s.chance == pytest.approx(float(vals.mean()), rel=1e-12, abs=1e-14)
        assert s.chance_sd == pytest.approx(float(vals.std(unbiased=False)), rel=1e-12)
        assert s.chance_sd > 1e-3  # not a degenerate null


def test_second_moment_of_the_raw_primitives_is_the_centred_variance():
    """E[Gamma^2] - E[Gamma]^2 from the raw primitives (cancelling) equals E[Gamma_0^2] from
    the centred ones; both equal the variance over every relabelling."""
    V = 6
    A = _model_matrix(_factors(V, 3)[0])
    B = _target_matrix(_target(V, 60))
    pa, pb = ch.primitives(A), ch.primitives(B)
    raw = ch.second_moment(pa, pb, V) - ch.mean_numerator(pa, pb, V) ** 2
    centred = ch.null_variance(ch.centre(pa, V), ch.centre(pb, V), V)
    vals = _relabelled(A, B) * A.norm() * B.norm()
    assert raw == pytest.approx(centred, rel=1e-9)
    assert centred == pytest.approx(float(vals.var(unbiased=False)), rel=1e-12)


def test_chance_sd_matches_a_monte_carlo_at_a_larger_vocabulary():
    V, n = 60, 4000
    T, E = _target(V, 5), _rand(V, 6, seed=6) + 0.4
    A, B = covariance(E), covariance(row_normalise(T))
    g = torch.Generator().manual_seed(7)
    P = torch.stack([torch.randperm(V, generator=g) for _ in range(n)])
    vals = (A[None] * B[P[:, :, None], P[:, None, :]]).sum(dim=(1, 2)) / (A.norm() * B.norm())
    s = scores([tall(E)], prepare_target("T", T))[0]
    # the sample SD of n draws has a relative standard error of about sqrt((kurtosis - 1)/4n)
    z = (vals - vals.mean()) / vals.std()
    rse = math.sqrt((float((z ** 4).mean()) - 1) / (4 * n))
    assert float(vals.std()) == pytest.approx(s.chance_sd, rel=4 * rse)
    assert rse < 0.02  # the check has teeth
    assert abs(float(vals.mean()) - s.chance) < 4 * s.chance_sd / math.sqrt(n)


def _sd(M, T):
    return float(_relabelled(covariance(M), _target_matrix(T)).std(unbiased=False))


def test_every_analysis_row_carries_the_exact_chance_sd():
    x, V = _tiny(seed=2), 6
    Q = _target(V, 8)
    for name in ("attention", "attention_lnfold"):
        rows = REGISTRY[name].run(x, {"Qbar": prepare_target("Qbar", Q, chunk=4)},
                                  Options(chunk=4, per_head=[2]))
        for row in rows:
            M = _attention_matrix(x, row["layer"] - 1, row["head"], name == "attention_lnfold")
            assert row["chance_sd"] == pytest.approx(_sd(M, Q), rel=1e-10)
    stats = type("S", (), {"PhiBT": _target(V, 9), "Bbar": _target(V, 10) - 0.5})()
    th = {n: prepare_target(n, target_matrix(stats, n), chunk=4)
          for n in ("PhiBT", "Bbar", "BbarT")}
    for row in REGISTRY["embedding"].run(x, th, Options(chunk=4)):
        E = x.residuals[row["metric"][4:]][row["layer"] - 1][:V]
        assert row["chance_sd"] == pytest.approx(_sd(E, stats.PhiBT), rel=1e-10)
    got = {r["metric"]: r["chance_sd"] for r in REGISTRY["unembedding"].run(x, th, Options())}
    WE, WU = x.W_E[:V], x.W_U[:, :V]
    assert got["cos_WU_Bbar"] == pytest.approx(_sd(WU.T, stats.Bbar.T), rel=1e-10)
    assert got["cos_WEWU_Bbar"] == pytest.approx(_sd(WE @ WU, stats.Bbar), rel=1e-10)
    assert got["cos_WE_PhiBT"] == pytest.approx(_sd(WE, stats.PhiBT), rel=1e-10)


def test_factored_and_float32_targets_give_the_oracle_chance_sd():
    V = 31
    T = _target(V, 11)
    fs = lambda dt=torch.float64: [tall(_rand(V, 5, seed=12) + 1, dt),  # noqa: E731
                                   product(_rand(V, 3, seed=13), _rand(V, 3, seed=14), dt)]
    th = DenseTarget("T", T)
    mem = scores(fs(), th, chunk=7)
    factored = prepare_target("PhiBT", T, chunk=7)
    assert factored.null_terms == pytest.approx(th.null_terms, rel=1e-12)
    assert [s.chance_sd for s in scores(fs(), factored, 7)] == pytest.approx(
        [s.chance_sd for s in mem], rel=1e-12)
    got = scores(fs(torch.float32), prepare_target("T", T, dtype=torch.float32))
    assert [s.chance_sd for s in got] == pytest.approx([s.chance_sd for s in mem], rel=1e-4)


@pytest.fixture(scope="module")
def corpus():
    V = 23
    tokens = torch.randint(0, V - 4, (9, 8), generator=torch.Generator().manual_seed(0))
    return V, parts_from_tokens(tokens, V), reference_stats(tokens, V)


@pytest.mark.parametrize("name", NAMES)
def test_factored_targets_give_the_resident_null_terms(corpus, name):
    V, p, ref = corpus
    dense = DenseTarget(name, _dense(name, ref))
    vec = target_vectors(name, p, chunk=4)
    assert vec.null == pytest.approx(dense.null_terms, rel=1e-10, abs=1e-14)
    th = FactoredTarget(name, Parts(p, torch.float64, "cpu", {name}), vec)
    E = _rand(V, 5, seed=3) + 0.5
    assert scores([tall(E)], th)[0].chance_sd == pytest.approx(
        scores([tall(E)], dense)[0].chance_sd, rel=1e-10)


def test_old_caches_without_null_terms_are_rebuilt_never_misread(corpus, tmp_path,
                                                                 monkeypatch, caplog):
    """A factored-vectors file of format /1 (written before the null terms existed) is
    rebuilt with them, with a warning."""
    V, p, ref = corpus
    with monkeypatch.context() as m:  # write the old format: old name, no null terms
        m.setattr(factored_cache, "FORMAT", "pythia_probe.factored_target/1")
        m.setattr(factored_cache, "null_meta", lambda _: {})
        factored_cache.cached_vectors("Qbar", lambda: p, tmp_path, "s0")
    assert factored_cache.read_vectors(factored_cache.vectors_path(tmp_path, "Qbar"), "Qbar",
                                       "s0")[0] is None
    with caplog.at_level("WARNING"):
        vec = factored_cache.cached_vectors("Qbar", lambda: p, tmp_path, "s0")
    assert caplog.text.count("rebuilding") == 1
    want = DenseTarget("Qbar", ref["Qbar"]).null_terms
    assert vec.null == pytest.approx(want, rel=1e-10)
    again = factored_cache.cached_vectors("Qbar", lambda: pytest.fail("rebuilt"), tmp_path, "s0")
    assert again.null == vec.null


# ---- calibration of above_chance ----------------------------------------------------------
def _markov_corpus(V, N, T, seed=0):
    """N documents of T + 1 tokens from a random Markov chain (real bigram structure)."""
    P, _ = markov.chain(V, sharpness=2.0, seed=seed)
    return markov.sample(P, torch.full((V,), 1.0 / V, dtype=torch.float64), N, T, seed)


def _random_factor(kind, V, seed):
    """Weights unrelated to the statistics: a Gaussian residual stream (tall) or random
    W_Q, W_K on one (a rank-8 attention map)."""
    g = torch.Generator().manual_seed(seed)
    E = torch.randn(V, 16, generator=g, dtype=torch.float64)
    if kind == "stream":
        return tall(E)
    W_Q, W_K = (torch.randn(16, 8, generator=g, dtype=torch.float64) for _ in range(2))
    return product(E @ W_Q, E @ W_K)


N_DRAWS = 800
# a true flag rate of 5% exceeds this in under 1% of runs of N_DRAWS draws (one-sided binomial
# 99% point, normal approximation): the test refuses a rate noticeably above 5%
BOUND = 0.05 + 2.326 * math.sqrt(0.05 * 0.95 / N_DRAWS)


@pytest.mark.parametrize("name,kind", [("PhiBT", "stream"), ("Qbar", "attention")])
def test_random_weights_are_flagged_above_chance_at_most_5_percent(name, kind):
    """The sweep's default: value, chance, chance_sd and the jackknife se over G = 5 document
    groups of a 60-document Markov corpus (V = 64); N_DRAWS independent random weights, each
    flagged when z = (value - chance) / sqrt(chance_sd^2 + se^2) > 1.960. Asserted: the
    rate <= BOUND (5% plus its binomial slack, 6.8% at 800 draws)."""
    V, N, G = 64, 60, 5
    tokens = _markov_corpus(V, N, 24)
    full = prepare_target(name, reference_stats(tokens, V)[name])
    left_out = [prepare_target(name, reference_stats(tokens[np.arange(N) % G != g], V)[name])
                for g in range(G)]
    flagged = 0
    for i in range(N_DRAWS):
        f = _random_factor(kind, V, 1000 + i)
        s = scores([f], full)[0]
        se = jackknife_se([scores([f], t)[0].value for t in left_out])
        flagged += (s.value - s.chance) / math.hypot(s.chance_sd, se) > Z_ABOVE
    assert flagged / N_DRAWS <= BOUND


def test_relabelled_statistics_are_flagged_by_chance_sd_alone_at_most_5_percent():
    """Without intervals (se = 0) the test is the relabelling null's normal approximation.
    Over 20,000 relabellings of a 128-token corpus's PhiBT against one random stream
    (Gamma = tr(F_p^T B F_p), F_p the stream's rows permuted), z has mean 0 and SD 1 (the
    exact moments), and the flag rate at above_chance's threshold is at most 5% (the null is
    right-skewed: the normal 5% point, 1.645, flags more than 5%, which is why the threshold is
    the 2.5% point, 1.960)."""
    V, n = 128, 20000
    T = reference_stats(_markov_corpus(V, 4 * V, 24), V)["PhiBT"]
    f = _random_factor("stream", V, 3)
    s = scores([f], prepare_target("PhiBT", T))[0]
    F, B = f.basis.Y[:, :f.basis.d], _target_matrix(T)
    g = torch.Generator().manual_seed(4)
    vals = torch.empty(n, dtype=torch.float64)
    for k in range(0, n, 1000):
        Fp = F[torch.rand(1000, V, generator=g).argsort(dim=1)]
        vals[k:k + 1000] = (Fp * (B @ Fp)).sum(dim=(1, 2))
    z = (vals / (torch.linalg.matrix_norm(F @ F.T) * B.norm()) - s.chance) / s.chance_sd
    assert abs(float(z.mean())) < 4 / math.sqrt(n) and float(z.std()) == pytest.approx(1, 0.02)
    assert float((z > Z_ABOVE).double().mean()) <= 0.05
    assert float((z > 1.6449).double().mean()) > 0.05  # why not the normal 5% point
