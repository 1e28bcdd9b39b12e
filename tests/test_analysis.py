"""Factored covariance cosines and the analyses against a literal float64 reference."""

import pytest
import torch

from pythia_probe.analysis import REGISTRY, Options, StepTensors, get_analyses, target_matrix
from pythia_probe.analysis.attention import attention_rows
from pythia_probe.analysis.cosine import (
    cosine,
    covariance,
    materialised_cosine,
    prepare_target,
    product,
    row_normalise,
    tall,
)
from pythia_probe.analysis.embedding import embedding_rows, unembedding_rows

TOL = 1e-10


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_covariance_is_row_centred_gram():
    X = _rand(5, 7)
    C = X - X.mean(1, keepdim=True)
    expect = torch.stack([torch.stack([(C[i] * C[j]).sum() / 6 for j in range(5)])
                          for i in range(5)])
    assert torch.allclose(covariance(X), expect, atol=1e-12)
    # each ROW centred, so it matches numpy's row-variable covariance
    assert torch.allclose(covariance(X), torch.cov(X), atol=1e-12)


def test_row_normalise_keeps_zero_rows():
    T = _rand(4, 6)
    T[2] = 0
    N = row_normalise(T)
    assert torch.equal(N[2], torch.zeros(6, dtype=torch.float64))
    assert torch.allclose(N[[0, 1, 3]].norm(dim=1), torch.ones(3, dtype=torch.float64))


@pytest.mark.parametrize("seed,chunk", [(0, 7), (1, 64), (2, 1)])
def test_tall_factored_equals_materialised(seed, chunk):
    V, d = 37, 6
    E, T = _rand(V, d, seed=seed), _rand(V, V, seed=seed + 10)
    T[3] = 0  # a token the corpus never shows
    th = prepare_target("T", T, chunk=chunk)
    assert cosine(tall(E), th, chunk) == pytest.approx(materialised_cosine(E, T), rel=TOL)


@pytest.mark.parametrize("seed,chunk", [(0, 5), (3, 100)])
def test_product_factored_equals_materialised(seed, chunk):
    V, r = 41, 5
    F, G, T = _rand(V, r, seed=seed), _rand(V, r, seed=seed + 1), _rand(V, V, seed=seed + 2)
    th = prepare_target("T", T, chunk=chunk)
    got = cosine(product(F, G), th, chunk)
    assert got == pytest.approx(materialised_cosine(F @ G.T, T), rel=TOL)


def test_cosine_is_one_for_the_target_itself_and_float32_close():
    T = _rand(30, 30, seed=4).abs()
    th = prepare_target("T", T)
    assert cosine(tall(row_normalise(T)), th) == pytest.approx(1.0, abs=1e-12)
    th32 = prepare_target("T", T, dtype=torch.float32)
    E = _rand(30, 8, seed=5)
    assert cosine(tall(E, torch.float32), th32) == pytest.approx(cosine(tall(E), th), rel=1e-5)


def test_wrong_vocab_size_is_a_clear_error():
    th = prepare_target("PhiBT", _rand(10, 10))
    with pytest.raises(ValueError, match="d_vocab=10"):
        cosine(tall(_rand(12, 3)), th)


def _paper_attention(E, W_Q, W_K, T, head=None):
    """Literal section-5 procedure: A_tok = E A_emb E^T with A_emb = mean_h W_Q^h W_K^h^T."""
    heads = range(W_Q.shape[0]) if head is None else [head]
    A_emb = torch.stack([W_Q[h] @ W_K[h].T for h in heads]).mean(0)
    return materialised_cosine(E @ A_emb @ E.T, T)


def _tiny(V=29, d=8, H=2, L=3, Vmodel=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    res = {k: [r(Vmodel, d) for _ in range(L)] for k in ("pre", "attn", "post")}
    return StepTensors(res, [r(H, d, d // H) for _ in range(L)],
                       [r(H, d, d // H) for _ in range(L)], r(Vmodel, d), r(d, Vmodel),
                       ln1_w=[1 + 0.5 * r(d) for _ in range(L)]), V


def test_attention_rows_equal_the_paper_procedure():
    x, V = _tiny()
    Q = _rand(V, V, seed=9)
    rows = attention_rows(x.residuals["pre"], x.W_Q, x.W_K, prepare_target("Qbar", Q, chunk=6),
                          options=Options(chunk=6, per_head=[2]))
    assert len(rows) == 3 + 2  # mean for 3 layers + 2 heads of layer 2 (numbered from 1)
    assert [r["layer"] for r in rows] == [1, 2, 2, 2, 3]
    for row in rows:
        i = row["layer"] - 1  # the tables number layers from 1, as the paper does
        expect = _paper_attention(x.residuals["pre"][i][:V], x.W_Q[i], x.W_K[i], Q, row["head"])
        assert row["value"] == pytest.approx(expect, rel=1e-6)
        assert row["metric"] == ("cos_mean" if row["head"] is None else "cos_head")


def test_embedding_and_unembedding_rows_equal_materialised():
    x, V = _tiny(seed=1)
    stats = type("S", (), {"PhiBT": _rand(V, V, seed=2), "Bbar": _rand(V, V, seed=3),
                           "Qbar": _rand(V, V, seed=4)})()
    th = {n: prepare_target(n, target_matrix(stats, n), chunk=8)
          for n in ("PhiBT", "Bbar", "BbarT")}
    rows = embedding_rows(x.residuals, th["PhiBT"], chunk=8)
    assert sorted({r["layer"] for r in rows}) == [1, 2, 3]
    for row in rows:
        E = x.residuals[row["metric"][4:]][row["layer"] - 1][:V]
        assert row["value"] == pytest.approx(materialised_cosine(E, stats.PhiBT), rel=1e-6)
    got = {r["metric"]: r["value"] for r in unembedding_rows(x.W_E, x.W_U, th, chunk=8)}
    WE, WU = x.W_E[:V], x.W_U[:, :V]
    assert got["cos_WU_Bbar"] == pytest.approx(materialised_cosine(WU.T, stats.Bbar.T), rel=1e-6)
    assert got["cos_WEWU_Bbar"] == pytest.approx(materialised_cosine(WE @ WU, stats.Bbar),
                                                 rel=1e-6)
    assert got["cos_WE_PhiBT"] == pytest.approx(materialised_cosine(WE, stats.PhiBT), rel=1e-6)


def test_registry_runs_every_analysis_and_rejects_unknown_names():
    x, V = _tiny(seed=2)
    stats = type("S", (), {n: _rand(V, V, seed=i) for i, n in
                           enumerate(("PhiBT", "Bbar", "Qbar", "QbarHead"))})()
    raw = {"Qbar": stats.Qbar, "Delta": _rand(8, seed=5)}
    with pytest.raises(ValueError, match="needs real text"):
        REGISTRY["attention_text"].run(x, {}, Options(raw=raw))
    x.text_tokens = torch.randint(0, V, (2, 6), generator=torch.Generator().manual_seed(0))
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    x.text_attn = [torch.softmax(_rand(2, 2, 6, 6, seed=s).masked_fill(~causal, -torch.inf), -1)
                   for s in range(3)]
    for a in get_analyses(list(REGISTRY)):
        th = {n: prepare_target(n, target_matrix(stats, n)) for n in a.targets}
        rows = a.run(x, th, Options(raw=raw))
        assert rows and all(r["analysis"] == a.name and -1 <= r["value"] <= 1 for r in rows)
    with pytest.raises(ValueError, match="valid: embedding, attention"):
        get_analyses(["embedding", "atention"])


def _authors_attention(E, W_Q, W_K, w, T, head=None):
    """Literal TransformerLens fold_ln + center_writing_weights: residual rows E P, query/key
    weights P diag(w) W^h, with P = I - 11^T / d_model materialised."""
    d = E.shape[1]
    P = torch.eye(d, dtype=torch.float64) - torch.full((d, d), 1.0 / d, dtype=torch.float64)
    Ec, D = E @ P, torch.diag(w)
    heads = range(W_Q.shape[0]) if head is None else [head]
    A_emb = torch.stack([(P @ D @ W_Q[h]) @ (P @ D @ W_K[h]).T for h in heads]).mean(0)
    return materialised_cosine(Ec @ A_emb @ Ec.T, T)


def test_attention_lnfold_equals_the_authors_materialised_procedure():
    x, V = _tiny(seed=3)
    Q = _rand(V, V, seed=11)
    th = {"Qbar": prepare_target("Qbar", Q, chunk=5)}
    rows = REGISTRY["attention_lnfold"].run(x, th, Options(chunk=5, per_head=[1, 3], max_rank=40))
    assert len(rows) == 3 + 2 * 2 and {r["analysis"] for r in rows} == {"attention_lnfold"}
    assert sorted({r["layer"] for r in rows if r["head"] is not None}) == [1, 3]
    for row in rows:
        i = row["layer"] - 1
        expect = _authors_attention(x.residuals["pre"][i][:V], x.W_Q[i], x.W_K[i], x.ln1_w[i],
                                    Q, row["head"])
        assert row["value"] == pytest.approx(expect, rel=1e-6, abs=1e-12)


def test_authors_orientation_rows_equal_pythia_py_materialised():
    """cos_mean_authors: the query-row model map against the rows of Qbar^T (pythia.py's Q_bar
    is NT Qbar^T); cos_head_authors: each head against the rows of QbarHead^T (the per-head
    script's own target). The theory rows are unchanged by adding them."""
    x, V = _tiny(seed=5)
    Q, QH = _rand(V, V, seed=13), _rand(V, V, seed=14)
    stats = type("S", (), {"Qbar": Q, "QbarHead": QH})()
    th = {n: prepare_target(n, target_matrix(stats, n), chunk=7)
          for n in ("Qbar", "QbarT", "QbarHeadT")}
    for name, literal in (("attention_lnfold", True), ("attention", False)):
        rows = REGISTRY[name].run(x, th, Options(chunk=7, per_head=[2]))
        alone = REGISTRY[name].run(x, {"Qbar": th["Qbar"]}, Options(chunk=7, per_head=[2]))
        assert [r for r in rows if not r["metric"].endswith("_authors")] == alone
        authors = [r for r in rows if r["metric"].endswith("_authors")]
        assert len(authors) == 3 + 2
        for row in authors:
            i, h = row["layer"] - 1, row["head"]
            T = Q.T if h is None else QH.T
            args = (x.residuals["pre"][i][:V], x.W_Q[i], x.W_K[i])
            expect = (_authors_attention(*args, x.ln1_w[i], T, h) if literal else
                      _paper_attention(*args, T, h))
            assert row["value"] == pytest.approx(expect, rel=1e-6, abs=1e-12)
            assert row["metric"] == ("cos_mean_authors" if h is None else "cos_head_authors")
            assert row["value"] != pytest.approx(
                next(r["value"] for r in alone if (r["layer"], r["head"]) == (row["layer"], h)))


def test_attention_lnfold_differs_from_raw_attention_unless_ln1_is_one():
    x, V = _tiny(seed=4)
    th = {"Qbar": prepare_target("Qbar", _rand(V, V, seed=12))}
    raw = [r["value"] for r in REGISTRY["attention"].run(x, th, Options())]
    fold = [r["value"] for r in REGISTRY["attention_lnfold"].run(x, th, Options())]
    assert min(abs(a - b) for a, b in zip(raw, fold, strict=True)) > 1e-4
    # ln1_w = 1 and residual rows already mean-free over d_model: the two coincide
    x.ln1_w = [torch.ones_like(w) for w in x.ln1_w]
    x.residuals["pre"] = [E - E.mean(1, keepdim=True) for E in x.residuals["pre"]]
    raw = [r["value"] for r in REGISTRY["attention"].run(x, th, Options())]
    fold = [r["value"] for r in REGISTRY["attention_lnfold"].run(x, th, Options())]
    assert fold == pytest.approx(raw, rel=1e-10)
    x.ln1_w = []
    with pytest.raises(ValueError, match="ln1 weights"):
        REGISTRY["attention_lnfold"].run(x, th, Options())
