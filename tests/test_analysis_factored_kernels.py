"""The fast paths of the factored products and Grams against float64 references on random
inputs: the upper-triangle Gram (basis.add_gram / mirror), the column tiles of the sparse
products (factored.Parts.tiled) and the live-row Gram (FactoredTarget.grams, the rows the
corpus never fills counted once), each with blocks small enough to be exercised."""

import pytest
import torch
from test_analysis_factored import _corpus, _dense, parts_from_tokens

from pythia_probe.analysis import basis, factored
from pythia_probe.analysis.cosine import row_centre, row_normalise
from pythia_probe.analysis.factored import NAMES, FactoredTarget, Parts, target_vectors
from pythia_probe.planner import step as step_plan
from pythia_probe.stats.reference import reference_stats

V = 23


@pytest.fixture(scope="module")
def corpus():
    tokens = _corpus(V)
    return parts_from_tokens(tokens, V), reference_stats(tokens, V)


@pytest.mark.parametrize("block", [1, 3, 5, 1100])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_upper_triangle_gram_equals_the_full_product(monkeypatch, block, dtype):
    monkeypatch.setattr(step_plan, "GRAM_BLOCK", block)
    g = torch.Generator().manual_seed(block)
    X = [torch.randn(13, 11, generator=g, dtype=torch.float64) for _ in range(3)]
    M = torch.zeros(11, 11, dtype=torch.float64)
    for Xb in X:
        basis.add_gram(M, Xb.to(dtype))
    basis.mirror(M)
    want = sum(Xb.T @ Xb for Xb in X)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    assert torch.allclose(M, want, rtol=0, atol=tol * float(want.abs().max()))
    assert torch.equal(M, M.T)


def _reference_ct(name, ref, X):
    """C_T^T X in float64 from the dense statistic: C_T = rownorm(T) row-centred."""
    C_T = row_centre(row_normalise(_dense(name, ref).to(torch.float64)))
    return C_T.T @ X


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("tile", [1, 2, 7, 10**6])
def test_tiled_products_equal_the_dense_reference(monkeypatch, corpus, name, tile):
    p, ref = corpus
    monkeypatch.setattr(factored, "CPU_TILE", tile)
    X = torch.randn(V, 9, generator=torch.Generator().manual_seed(tile), dtype=torch.float64)
    vec = target_vectors(name, p)
    want = _reference_ct(name, ref, X)
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-5)):
        th = FactoredTarget(name, Parts(p, dtype, "cpu", {name}), vec)
        got = th.ct_t(X.to(dtype)).to(torch.float64)
        assert torch.allclose(got, want, rtol=0, atol=tol * float(want.abs().max())), dtype


@pytest.mark.parametrize("name", NAMES)
def test_live_row_grams_equal_the_dense_reference(monkeypatch, corpus, name):
    """Grams over the live rows (chunks of 4), the shared row weighted, upper triangle in
    blocks of 2, tiles of 3 columns: equal (F_i^T C_T)(F_i^T C_T)^T in float64."""
    p, ref = corpus
    monkeypatch.setattr(factored, "CPU_TILE", 3)
    monkeypatch.setattr(factored, "GRAM_ROWS", 1)
    monkeypatch.setattr(step_plan, "GRAM_BLOCK", 2)
    F = torch.randn(V, 10, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    edges = [0, 4, 10]
    vec = target_vectors(name, p)
    rows, n_shared = FactoredTarget(name, Parts(p, torch.float64, "cpu", {name}),
                                    vec).live_rows
    assert n_shared >= 4 and rows.numel() == V - n_shared + 1  # ids 19..22 never occur
    Z = _reference_ct(name, ref, F)
    want = [Z[:, s:e].T @ Z[:, s:e] for s, e in zip(edges, edges[1:], strict=False)]
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-5)):
        th = FactoredTarget(name, Parts(p, dtype, "cpu", {name}), vec)
        got = th.grams(F.to(dtype), edges, chunk=4)
        for M, W in zip(got, want, strict=True):
            assert M.dtype == torch.float64
            assert torch.allclose(M, W, rtol=0, atol=tol * float(W.abs().max())), dtype


def test_gram_macs_count_the_upper_block_triangle(monkeypatch):
    monkeypatch.setattr(step_plan, "GRAM_BLOCK", 1)
    assert step_plan.gram_macs(7, 11) == 7 * 11 * 12 // 2  # every entry on or above the diagonal
    monkeypatch.setattr(step_plan, "GRAM_BLOCK", 11)
    assert step_plan.gram_macs(7, 11) == 7 * 11 * 11  # one block: the whole product
    monkeypatch.setattr(step_plan, "GRAM_BLOCK", 1100)
    assert step_plan.gram_macs(1, 2049) == 1024 * 2049 + 1025 * 1025  # two blocks: about 3/4


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_basis_moments_in_row_blocks_equal_the_float64_reference(monkeypatch, dtype):
    """G = Y^T Y, Gc = Yc^T Yc and e = Y^T 1 of a basis from row blocks of 5, the upper
    triangle in column blocks of 3: equal to the literal float64 products."""
    monkeypatch.setattr(basis, "GRAM_ROWS", 1)
    monkeypatch.setattr(step_plan, "GRAM_BLOCK", 3)
    g = torch.Generator().manual_seed(7)
    E = torch.randn(17, 8, generator=g, dtype=torch.float64) + 3.0  # a large common row
    Y = torch.cat([E - E.mean(1, keepdim=True), E.mean(1, keepdim=True)], dim=1)
    Yc = Y - Y.mean(0)
    G, Gc, e = basis.Basis(E.to(dtype), dtype, chunk=5).moments()
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    for got, want in ((G, Y.T @ Y), (Gc, Yc.T @ Yc), (e, Y.sum(0))):
        assert torch.allclose(got, want, rtol=0, atol=tol * float(want.abs().max()))
