"""Factored statistics (issue 18): every statistic stored as C, W, their vectors, Qbar on the
pairs that occur and Delta, never a V x V array; read through ``block(name, rows, cols)``;
products with a dense X without forming the matrix.

Promises checked: blocks of both engines equal the literal float64 oracle on random inputs with
absent ids (1e-10 of each statistic's natural scale, as tests/test_stats.py) and equal the
whole matrix's entries at any index tensors (Bbar, Phibar, Qbar bit for bit, the compositions
to 1e-13 of scale); products equal dense products (1e-12 of scale); at d_vocab 50,277 on a Zipf
stream a few blocks equal a chunked literal float64 reference; the file holds no V x V tensor.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pythia_probe.errors import BadInputError
from pythia_probe.stats import CorpusStats, batch_stats
from pythia_probe.stats.reference import reference_stats_ragged, softmax_jacobian_uniform
from pythia_probe.stats.result import part_counts

NAMES = ("Bbar", "Phibar", "SigmaB", "PhiBT", "Gbar", "Qbar", "Delta")
EXACT = ("Bbar", "Phibar", "Qbar")
PRODUCTS = ("Bbar", "Phibar", "SigmaB", "PhiBT", "Gbar", "Qbar")

pytestmark = pytest.mark.usefixtures("one_thread")


@st.composite
def corpora(draw, max_v: int = 14, max_n: int = 6, max_t: int = 10):
    """(tokens [N, T+1], lengths or None, V, seed): ids scattered over 0..V-1, some absent."""
    V, N, T = draw(st.integers(2, max_v)), draw(st.integers(1, max_n)), draw(st.integers(1, max_t))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    used = draw(st.integers(1, V))
    tokens = torch.randperm(V, generator=g)[torch.randint(0, used, (N, T + 1), generator=g)]
    lengths = torch.randint(2, T + 2, (N,), generator=g) if draw(st.booleans()) else None
    return tokens, lengths, V, draw(st.integers(0, 2**31 - 1))


def scales(full: dict, P: int) -> dict[str, float]:
    """Each statistic's natural magnitude from its factors, floored at one count over P."""
    u = 1.0 / P
    m = {k: max(float(full[k].abs().max()), f) for k, f in (("Bbar", u), ("Phibar", u),
                                                            ("SigmaB", u * u),
                                                            ("Gbar", u ** 3))}
    V = full["Bbar"].shape[0]
    return {"Bbar": m["Bbar"], "Phibar": m["Phibar"], "SigmaB": V * m["Bbar"] ** 2,
            "PhiBT": V * m["Bbar"] * m["Phibar"], "Gbar": V * m["SigmaB"] * m["Phibar"],
            "Qbar": 2 * m["Gbar"], "Delta": 2 * m["Gbar"]}


def windows(tokens, lengths):
    n = lengths.tolist() if lengths is not None else [tokens.shape[1]] * tokens.shape[0]
    return [tokens[i, :m] for i, m in enumerate(n)]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(corpora(), st.sampled_from(["dense", "sparse"]), st.integers(0, 2**31 - 1))
def test_blocks_equal_the_oracle_and_the_whole_matrix(data, engine, seed):
    tokens, lengths, V, _ = data
    rng = np.random.default_rng(seed)
    stats = batch_stats(tokens, V, lengths=lengths, engine=engine)
    ref = reference_stats_ragged(windows(tokens, lengths), V)
    scale = scales(ref, stats.meta["counts"]["positions"])
    full = {n: stats.block(n) for n in NAMES}
    for n in NAMES:
        want = ref[n] if n != "Delta" else torch.nn.functional.pad(
            ref[n], (0, stats.T - ref[n].numel()))
        torch.testing.assert_close(full[n], want, rtol=0, atol=1e-10 * scale[n] + 1e-300)
    rows = rng.integers(0, V, rng.integers(1, 2 * V))  # any order, repeats allowed
    cols = rng.integers(0, V, rng.integers(1, 2 * V))
    for n in NAMES[:-1]:
        got = stats.block(n, torch.from_numpy(rows), cols.tolist())
        want = full[n][torch.from_numpy(rows)][:, torch.from_numpy(cols)]
        if n in EXACT:
            assert torch.equal(got, want), n
        else:
            torch.testing.assert_close(got, want, rtol=0, atol=1e-13 * scale[n] + 1e-300)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(corpora(), st.integers(1, 14), st.integers(1, 5))
def test_products_equal_dense_products_restricted_too(data, k, d):
    tokens, lengths, V, seed = data
    for top_k in (None, min(k, V)):
        stats = batch_stats(tokens, V, lengths=lengths, top_k=top_k, engine="sparse")
        X = torch.randn(stats.d_vocab, d, generator=torch.Generator().manual_seed(seed),
                        dtype=torch.float64)
        full = {n: stats.block(n) for n in NAMES}
        scale = scales(full, stats.meta["counts"]["positions"])
        for n in PRODUCTS:
            tol = 1e-12 * scale[n] * float(X.abs().sum(0).max()) + 1e-300
            torch.testing.assert_close(stats.mul(n, X), full[n] @ X, rtol=0, atol=tol)
            torch.testing.assert_close(stats.tmul(n, X), X.T @ full[n], rtol=0, atol=tol)


def test_qbar_lives_on_the_pairs_that_occur_and_the_file_holds_no_v_by_v(tmp_path):
    g = torch.Generator().manual_seed(4)
    V = 40
    tokens = torch.randint(0, 25, (7, 9), generator=g)  # ids 25..39 never occur
    for engine in ("dense", "sparse"):
        stats = batch_stats(tokens, V, engine=engine)
        pairs = {(int(s[t]), int(s[j])) for s in tokens[:, :-1] for t in range(8)
                 for j in range(t + 1)}
        # (query, key) pairs with the key at or before the query; the dense engine keeps only
        # its non-zero entries (an entry can be exactly 0: Q[1, 1] = M - M at t = 1)
        nnz = stats.store.qbar.nnz
        assert nnz == len(pairs) if engine == "sparse" else 0 < nnz <= len(pairs)
        Q = stats.Qbar
        off = torch.ones(V, V, dtype=torch.bool)
        off[tuple(torch.tensor(sorted(pairs)).T)] = False
        assert not Q[off].any()
        path = stats.save(tmp_path / f"{engine}.safetensors")
        from safetensors import safe_open

        with safe_open(str(path), "pt") as f:
            assert max(f.get_slice(k).get_shape()[0] for k in f.keys()) < V * V
        loaded = CorpusStats.load(path)
        for n in NAMES:
            assert torch.equal(loaded[n], stats[n]), n


def test_parts_are_the_factors_of_section_6():
    tokens = torch.randint(0, 12, (5, 8), generator=torch.Generator().manual_seed(2))
    stats = batch_stats(tokens, 15, engine="sparse")
    p = stats.parts()
    P, V = p["positions"], p["full_d_vocab"]
    C, W = torch.from_numpy(p["C"].toarray()), torch.from_numpy(p["W"].toarray())
    n, w = torch.from_numpy(p["n"]), torch.from_numpy(p["w"])
    assert torch.equal(C.sum(1), n) and torch.allclose(W.sum(0), w, rtol=1e-15, atol=0)
    torch.testing.assert_close((C - n[:, None] / V) / P, stats.Bbar, rtol=1e-15, atol=1e-18)
    torch.testing.assert_close((W - w[None, :] / V) / P, stats.Phibar, rtol=1e-15, atol=1e-18)
    torch.testing.assert_close(torch.from_numpy(p["Qbar"].toarray()), stats.Qbar, rtol=0,
                               atol=0)


def test_part_counts_from_the_header_equal_the_stored_parts(tmp_path):
    """What the sweep's plan reads without loading the file: the entries of C, W, Qbar and
    QbarHead, counted literally here (distinct bigrams, distinct (target, context) pairs, Qbar's
    and QbarHead's stored pairs)."""
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, 30, (9, 12), generator=g)
    stats = batch_stats(tokens, 33, engine="sparse", groups=3)
    path = stats.save(tmp_path / "s.safetensors")
    p = stats.parts()
    bigrams = {(int(s[t]), int(s[t + 1])) for s in tokens for t in range(11)}
    assert part_counts(path) == {"C": p["C"].nnz, "W": p["W"].nnz, "Qbar": p["Qbar"].nnz,
                                 "QbarHead": p["QbarHead"].nnz}
    assert part_counts(path)["C"] == len(bigrams)
    dense = batch_stats(tokens, 33, engine="dense", top_k=None)
    assert part_counts(dense.save(tmp_path / "d.safetensors")) == part_counts(path)


def test_block_index_outside_the_vocabulary_is_one_line():
    stats = batch_stats(torch.randint(0, 6, (3, 5)), 6, top_k=4)
    for bad, what in (([0, 4], "row index 4"), ([-1], "row index -1")):
        with pytest.raises(BadInputError, match=rf"block {what} outside 0\.\.3 \(the d_vocab "
                                                r"of these statistics is 4\)") as e:
            stats.block("Gbar", bad)
        assert "\n" not in str(e.value)
    with pytest.raises(BadInputError, match="block column indices must be integers"):
        stats.block("Bbar", None, [0.5])
    with pytest.raises(BadInputError, match="X must be \\[d_vocab, d\\] = \\[4, d\\]"):
        stats.mul("Bbar", torch.zeros(6, 2, dtype=torch.float64))


def test_empty_indices_of_any_dtype_are_empty_and_delta_takes_none():
    stats = batch_stats(torch.randint(0, 6, (3, 5)), 6)
    cols = torch.tensor([1, 4])
    want = stats.block("Bbar", torch.zeros(0, dtype=torch.int64), cols)
    for empty in ([], (), torch.zeros(0), np.zeros(0), torch.zeros(0, dtype=torch.bool)):
        got = stats.block("Bbar", empty, cols)
        assert got.shape == (0, 2) and torch.equal(got, want)
        assert stats.block("Qbar", cols, empty).shape == (2, 0)
    for rows, cols_ in (([10**6], None), (None, [0]), ([0], [0])):
        with pytest.raises(BadInputError, match=r"block\('Delta'\) is the whole Delta vector"
                                                r".*give no row or column indices") as e:
            stats.block("Delta", rows, cols_)
        assert "\n" not in str(e.value)
    assert torch.equal(stats.block("Delta"), stats.Delta)
    with pytest.raises(BadInputError, match="block row indices must be an integer tensor or a "
                                            "sequence of integers, got str"):
        stats.block("Bbar", "ab")


# -- the Pythia vocabulary -------------------------------------------------------------------------
V_PYTHIA = 50277


def zipf_tokens(n_docs: int, T: int, seed: int = 0) -> torch.Tensor:
    rank = np.arange(1, V_PYTHIA + 1, dtype=np.float64)
    p = rank ** -1.08
    rng = np.random.default_rng(seed)
    ids = rng.permutation(V_PYTHIA)[rng.choice(V_PYTHIA, size=n_docs * (T + 1), p=p / p.sum())]
    return torch.from_numpy(ids.astype(np.int64)).view(n_docs, T + 1)


class Literal:
    """Chunked float64 sums over positions, straight from section 2's definitions, for a few
    rows and columns at once (never V x V): the reference at d_vocab 50,277."""

    def __init__(self, tokens: torch.Tensor) -> None:
        self.tok = tokens.numpy()
        self.x, self.y = self.tok[:, :-1], self.tok[:, 1:]
        self.N, self.T = self.x.shape
        self.P = self.N * self.T
        self.V = V_PYTHIA

    def bbar_cols(self, cols) -> np.ndarray:
        """Bbar[:, cols] = (1/P) sum_t e_{x_t} (e_{y_t}[cols] - 1/V)."""
        out = np.zeros((self.V, len(cols)))
        for j, c in enumerate(cols):
            np.add.at(out[:, j], self.x[self.y == c], 1.0)
        out -= np.bincount(self.x.ravel(), minlength=self.V)[:, None] / self.V
        return out / self.P

    def bbar_rows(self, rows) -> np.ndarray:
        """Bbar[rows, :] = (1/P) sum_t [x_t = r] (e_{y_t} - 1/V)."""
        out = np.zeros((len(rows), self.V))
        for i, r in enumerate(rows):
            hit = self.x == r
            np.add.at(out[i], self.y[hit], 1.0)
            out[i] -= hit.sum() / self.V
        return out / self.P

    def phibar_cols(self, cols) -> np.ndarray:
        """Phibar[:, cols] = (1/P) sum_t (e_{y_t} - 1/V) (1/(t+1)) sum_{m<=t} e_{x_m}[cols]."""
        pos = {c: j for j, c in enumerate(cols)}
        out = np.zeros((self.V, len(cols)))
        total = np.zeros(len(cols))
        for s in range(self.N):
            onehot = np.zeros((self.T, len(cols)))
            for m, a in enumerate(self.x[s]):
                if a in pos:
                    onehot[m, pos[a]] = 1.0
            ctx = np.cumsum(onehot, 0) / np.arange(1, self.T + 1)[:, None]
            np.add.at(out, self.y[s], ctx)
            total += ctx.sum(0)
        return (out - total[None, :] / self.V) / self.P

    def sigma_rows(self, rows) -> np.ndarray:
        """SigmaB[rows, :] = (1/P) sum_t Bbar[x_t, rows] (e_{y_t} - 1/V)."""
        B = self.bbar_cols(rows)
        out = np.zeros((len(rows), self.V))
        bx = B[self.x.ravel()]  # [positions, rows]
        np.add.at(out.T, self.y.ravel(), bx)
        out -= bx.sum(0)[:, None] / self.V
        return out / self.P

    def gbar(self, rows, cols) -> np.ndarray:
        return self.sigma_rows(rows) @ self.phibar_cols(cols)

    def qbar_delta(self, rows, cols) -> tuple[np.ndarray, np.ndarray, float]:
        """Qbar[rows, cols], Delta (Eqs. 14-17 with M_i = (Y_i - U) Gbar X_i^T) and the
        largest |M| (their natural scale)."""
        ys, xs = np.unique(self.y), np.unique(self.x)
        G = self.gbar(ys, xs)
        ones = np.zeros((self.V, 1))  # colsum(Gbar) = 1^T SigmaB Phibar, summed literally
        rs = self.bbar_rows(np.unique(self.x)).sum(1)  # Bbar's row sums (0 up to rounding)
        rsv = np.zeros(self.V)
        rsv[np.unique(self.x)] = rs
        np.add.at(ones[:, 0], self.y.ravel(), rsv[self.x.ravel()])
        sig_colsum = (ones[:, 0] - rsv[self.x.ravel()].sum() / self.V) / self.P
        cs = sig_colsum @ self.phibar_cols(xs)
        yi, xi = {v: i for i, v in enumerate(ys)}, {v: i for i, v in enumerate(xs)}
        J = softmax_jacobian_uniform(self.T).numpy()
        Qb, D = np.zeros((len(rows), len(cols))), np.zeros(self.T)
        rpos, cpos = {r: i for i, r in enumerate(rows)}, {c: j for j, c in enumerate(cols)}
        for s in range(self.N):
            gy = G[[yi[v] for v in self.y[s]]][:, [xi[v] for v in self.x[s]]]
            M = gy - cs[[xi[v] for v in self.x[s]]][None, :] / self.V
            Q = np.einsum("tjk,tk->tj", J, M)
            for t in range(self.T):
                D[: t + 1] += Q[t, t::-1]
                if self.x[s, t] not in rpos:
                    continue
                for j in range(t + 1):
                    if self.x[s, j] in cpos:
                        Qb[rpos[self.x[s, t]], cpos[self.x[s, j]]] += Q[t, j]
        return Qb / self.P, D / self.P, float(np.abs(G).max())


def test_full_pythia_vocabulary_blocks_equal_a_chunked_literal_reference():
    tokens = zipf_tokens(40, 16)
    stats = batch_stats(tokens, V_PYTHIA, engine="sparse")
    ref = Literal(tokens)
    counts = np.bincount(tokens.numpy().ravel(), minlength=V_PYTHIA)
    common, rare = int(np.argmax(counts)), int(np.flatnonzero(counts == 1)[0])
    absent = [int(i) for i in np.flatnonzero(counts == 0)[[0, 7, -1]]]
    rows = [common, rare, *absent, int(tokens[0, 3])]
    cols = [int(tokens[1, 5]), common, absent[1], rare, int(tokens[2, 0])]
    want = {"Bbar": ref.bbar_cols(cols)[rows], "Phibar": ref.phibar_cols(cols)[rows],
            "SigmaB": ref.bbar_cols(rows).T @ ref.bbar_cols(cols),
            "PhiBT": ref.phibar_cols(rows).T @ ref.bbar_rows(cols).T,
            "Gbar": ref.gbar(rows, cols)}
    want["Qbar"], delta, gmax = ref.qbar_delta(rows, cols)
    for name, w in want.items():  # 1e-10 of the block's own largest entry (or of 2 max|M|)
        got = stats.block(name, rows, cols).numpy()
        tol = 1e-10 * (2 * gmax if name == "Qbar" else float(np.abs(w).max()))
        np.testing.assert_allclose(got, w, rtol=0, atol=tol, err_msg=name)
    np.testing.assert_allclose(stats.Delta.numpy(), delta, rtol=0, atol=1e-10 * 2 * gmax)
    assert stats.d_vocab == V_PYTHIA and stats.store.qbar.nnz < 40 * 16 * 17 // 2
