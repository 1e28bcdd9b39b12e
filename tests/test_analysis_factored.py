"""Factored targets (sparse parts + vector corrections, no V x V matrix) against the dense
targets and the literal float64 cosine, on random corpora where some tokens never occur."""

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from pythia_probe.analysis.cosine import (
    materialised_cosine,
    product,
    scores,
    tall,
)
from pythia_probe.analysis.factored import NAMES, FactoredTarget, Parts, target_vectors
from pythia_probe.stats.reference import reference_stats
from pythia_probe.testing.dense import DenseTarget


def parts_from_tokens(tokens: torch.Tensor, V: int) -> dict:
    """The sparse parts counted literally, position by position (the oracle of the factors):
    C[x_t, y_t] += 1; W[y_t, x_m] += 1/t for m <= t (1-indexed t); Qbar from the literal
    reference statistics (non-zero only on the pairs that occur)."""
    C, W = np.zeros((V, V)), np.zeros((V, V))
    for seq in tokens.tolist():
        x, y = seq[:-1], seq[1:]
        for t in range(len(x)):
            C[x[t], y[t]] += 1
            for m in range(t + 1):
                W[y[t], x[m]] += 1.0 / (t + 1)
    ref = reference_stats(tokens, V)
    return {"C": sp.csr_matrix(C), "W": sp.csr_matrix(W), "n": C.sum(1), "w": W.sum(0),
            "positions": tokens.shape[0] * (tokens.shape[1] - 1), "full_d_vocab": V,
            "Qbar": sp.csc_matrix(ref["Qbar"].numpy()),
            "QbarHead": sp.csc_matrix(ref["QbarHead"].numpy()), "ids": None}


def _dense(name, ref):
    if name in ("BbarT", "QbarT", "QbarHeadT"):  # the transpose of the statistic
        return ref[name[:-1]].T
    return ref[name]


def _corpus(V=23, N=9, T=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V - 4, (N, T + 1), generator=g)  # ids V-4.. never occur


@pytest.fixture(scope="module")
def corpus():
    V = 23
    tokens = _corpus(V)
    return V, tokens, parts_from_tokens(tokens, V), reference_stats(tokens, V)


def test_the_literal_parts_recompose_the_reference_statistics(corpus):
    V, tokens, p, ref = corpus
    P = p["positions"]
    B = (p["C"].toarray() - np.outer(p["n"], np.ones(V)) / V) / P
    Phi = (p["W"].toarray() - np.outer(np.ones(V), p["w"]) / V) / P
    assert np.allclose(B, ref["Bbar"].numpy(), rtol=0, atol=1e-15)
    assert np.allclose(Phi, ref["Phibar"].numpy(), rtol=0, atol=1e-15)
    assert np.allclose(Phi.T @ B.T, ref["PhiBT"].numpy(), rtol=0, atol=1e-15)


@pytest.mark.parametrize("name", NAMES)
def test_vectors_equal_the_dense_target(corpus, name):
    V, _, p, ref = corpus
    dense = DenseTarget(name, _dense(name, ref))
    vec = target_vectors(name, p, chunk=4)
    assert torch.allclose(vec.scale, dense.scale, rtol=1e-12, atol=0)
    assert torch.allclose(vec.mean, dense.mean, rtol=1e-10, atol=1e-14)  # |mean| <= 1/sqrt(V)
    for key in ("norm", "trace", "total"):
        assert getattr(vec, key) == pytest.approx(getattr(dense, key), rel=1e-12), key
    assert int((vec.scale == 0).sum()) == int((dense.scale == 0).sum())


@pytest.mark.parametrize("name", NAMES)
def test_factored_cosines_equal_the_literal_ones_in_float64(corpus, name):
    V, _, p, ref = corpus
    T = _dense(name, ref)
    th = FactoredTarget(name, Parts(p, torch.float64, "cpu", {name}), target_vectors(name, p))
    g = torch.Generator().manual_seed(1)
    E = torch.randn(V, 5, generator=g, dtype=torch.float64) + 0.5
    F, G = (torch.randn(V, 3, generator=g, dtype=torch.float64) for _ in range(2))
    got = scores([tall(E), product(F, G)], th, chunk=6)
    want = [materialised_cosine(E, T), materialised_cosine(F @ G.T, T)]
    assert [s.value for s in got] == pytest.approx(want, rel=1e-10)
    dense = scores([tall(E), product(F, G)], DenseTarget(name, T), chunk=6)
    assert [s.chance for s in got] == pytest.approx([s.chance for s in dense], rel=1e-10)


def test_float32_factored_is_close_to_float64(corpus):
    V, _, p, ref = corpus
    E = torch.randn(V, 6, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    vec = target_vectors("PhiBT", p)
    th32 = FactoredTarget("PhiBT", Parts(p, torch.float32, "cpu", {"PhiBT"}), vec)
    got = scores([tall(E, torch.float32)], th32)[0]
    assert got.value == pytest.approx(materialised_cosine(E, ref["PhiBT"]), rel=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_shared_columns_are_equal_columns_of_the_dense_target(corpus, name):
    from pythia_probe.analysis.factored import shared_columns

    V, _, p, ref = corpus
    T = _dense(name, ref)
    shared = torch.from_numpy(shared_columns(name, p))
    assert 4 <= int(shared.sum()) < V  # the ids the corpus never shows, at least
    cols = T[:, shared]
    assert torch.equal(cols, cols[:, :1].expand_as(cols))


# ---- at Pythia's d_vocab: 50,277 statistic ids, a corpus of a few hundred of them -------------
def _full_vocab_parts(V=50277, docs=6, T=12, seed=4):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randperm(V, generator=g)[:40]  # the tokens the corpus uses, spread over V
    tokens = ids[torch.randint(0, ids.numel(), (docs, T + 1), generator=g)]
    x, y = tokens[:, :-1].numpy(), tokens[:, 1:].numpy()
    C = sp.coo_matrix((np.ones(x.size), (x.ravel(), y.ravel())), shape=(V, V)).tocsr()
    ti, mi = np.tril_indices(T)
    W = sp.coo_matrix((np.tile(1.0 / (ti + 1), docs), (y[:, ti].ravel(), x[:, mi].ravel())),
                      shape=(V, V)).tocsr()
    Q = sp.coo_matrix((np.tile(1.0 / (ti - mi + 1), docs), (x[:, ti].ravel(), x[:, mi].ravel())),
                      shape=(V, V)).tocsc() / (docs * T)
    return {"C": C, "W": W, "n": np.asarray(C.sum(1)).ravel(), "w": np.asarray(W.sum(0)).ravel(),
            "positions": docs * T, "full_d_vocab": V, "Qbar": sp.csc_matrix(Q), "ids": None}


def _live_rows_reference(name, p):
    """T's non-zero rows, dense float64, from the definitions (Bbar = (C - n 1^T / V) / P,
    Phibar = (W - 1 w^T / V) / P, PhiBT = Phibar^T Bbar^T), and their indices."""
    V, P = p["full_d_vocab"], p["positions"]
    C, n = p["C"], p["n"]
    if name == "Qbar":
        live = np.flatnonzero(np.diff(sp.csr_matrix(p["Qbar"]).indptr))
        return live, sp.csr_matrix(p["Qbar"])[live].toarray()
    live = np.flatnonzero(p["w"])  # PhiBT row a is zero unless a is ever a context
    Phi_cols = (p["W"][:, live].toarray() - p["w"][live][None, :] / V) / P  # Phibar[:, live]
    BX = (C @ Phi_cols - np.outer(n, Phi_cols.sum(0)) / V) / P  # Bbar Phibar[:, live]
    return live, BX.T


@pytest.mark.parametrize("name", ["PhiBT", "Qbar"])
def test_full_vocabulary_against_a_chunked_float64_reference(name):
    """d_vocab 50,277: the factored cosine (and chance) of a tall and a product model matrix
    equal a reference computed from T's live rows (dense, from the definitions) and the model's
    rows in float64 chunks, never a V x V array."""
    from pythia_probe.analysis.cosine import row_centre, row_normalise

    p = _full_vocab_parts()
    V = p["full_d_vocab"]
    target = FactoredTarget(name, Parts(p, torch.float64, "cpu", {name}),
                            target_vectors(name, p, chunk=4096))
    live, T_live = _live_rows_reference(name, p)
    Cl = torch.from_numpy(row_centre(row_normalise(torch.from_numpy(T_live))).numpy())
    B = Cl @ Cl.T  # B's only non-zero block (rows/columns `live`)
    g = torch.Generator().manual_seed(2)
    E = torch.randn(V, 6, generator=g, dtype=torch.float64) + 0.3
    Wq, Wk = (torch.randn(6, 3, generator=g, dtype=torch.float64) for _ in range(2))
    Fq, Fk = E @ Wq, E @ Wk
    Gc = Fk - Fk.mean(0)  # cov(Fq Fk^T) = Fq (Gc^T Gc) Fq^T up to scale
    models = {"tall": (row_centre(E), None), "product": (Fq, Gc.T @ Gc)}
    got = {"tall": scores([tall(E)], target, chunk=8192)[0],
           "product": scores([product(Fq, Fk)], target, chunk=8192)[0]}
    for kind, (F, S) in models.items():
        S = torch.eye(F.shape[1], dtype=torch.float64) if S is None else S
        FtF = sum(F[s:s + 8192].T @ F[s:s + 8192] for s in range(0, V, 8192))
        normA = float(((S @ FtF) * (S @ FtF).T).sum().sqrt())
        A_live = F[live] @ S @ F[live].T
        value = float((A_live * B).sum()) / (normA * float(B.norm()))
        trA = float((FtF * S).sum())
        Fs = F.sum(0)
        totA = float(Fs @ S @ Fs)
        trB, totB = float(B.trace()), float(B.sum())
        chance = (trA * trB / V + (totA - trA) * (totB - trB) / (V * (V - 1))) / (
            normA * float(B.norm()))
        assert got[kind].value == pytest.approx(value, abs=1e-10), kind
        assert got[kind].chance == pytest.approx(chance, abs=1e-10), kind
