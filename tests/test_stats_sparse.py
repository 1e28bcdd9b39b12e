"""The sparse / out-of-core engine against the dense engine (spec leading-terms, section 6).

Promises checked: pass 1 bit-identical (densified state, checksum, hence stats_id; Bbar and
Phibar entries too); SigmaB, PhiBT, Gbar, Qbar and Delta equal to float64 rounding
(|diff| <= 1e-12 x each statistic's natural scale), and to the literal float64 oracle (1e-10,
as tests/test_stats.py); any chunking, buffer size, head size, tile width, merge order, kernel
backend, kill-and-resume and process count; ids absent from the corpus (the 1/V centring).
"""

from __future__ import annotations

import random
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse
import sparse_pass2_oracle as oracle
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pythia_probe.errors import BadInputError, KernelError, MismatchError, ResourceError
from pythia_probe.planner import statistics as plan
from pythia_probe.stats import CorpusStats, CountAccumulator, batch_stats, native
from pythia_probe.stats import driver as run
from pythia_probe.stats.native import sparsecount
from pythia_probe.stats.native.sparsecount import Correction, Tile, TokenWindows
from pythia_probe.stats.reference import reference_stats_ragged
from pythia_probe.stats.sequences import SequencePolicy
from pythia_probe.stats.sparse import second
from pythia_probe.stats.sparse.count import SparseCountAccumulator
from pythia_probe.testing.counts import as_dense
from pythia_probe.testing.dist import stats_in_processes
from pythia_probe.testing.shards import IdShard, encode_ids

NAMES = ("Bbar", "Phibar", "SigmaB", "PhiBT", "Gbar", "Qbar", "Delta")
EXACT = ("Bbar", "Phibar")
BACKENDS = ("c", "torch")  # pass 1 and the products in C or in numpy / scipy
PASS1 = ("token_counts", "bigram", "context_hi", "context_lo")


@st.composite
def corpora(draw, max_v: int = 14, max_n: int = 6, max_t: int = 12):
    """(tokens [N, T+1] with junk padding, lengths or None, V, seed); ids in 0..V-1 but only
    some of them used, so that absent ids are common."""
    V, N, T = draw(st.integers(2, max_v)), draw(st.integers(1, max_n)), draw(st.integers(1, max_t))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    used = draw(st.integers(1, V))
    tokens = torch.randint(0, used, (N, T + 1), generator=g)
    tokens = torch.randperm(V, generator=g)[tokens]  # the used ids are scattered over 0..V-1
    lengths = torch.randint(2, T + 2, (N,), generator=g) if draw(st.booleans()) else None
    if lengths is not None:
        pad = torch.arange(T + 1)[None, :] >= lengths[:, None]
        tokens[pad] = torch.tensor([-3, V + 3])[torch.randint(0, 2, (int(pad.sum()),),
                                                              generator=g)]
    return tokens, lengths, V, draw(st.integers(0, 2**31 - 1))


def splits(n: int, rng: random.Random) -> list[slice]:
    cuts = sorted(rng.sample(range(1, n), rng.randint(0, n - 1))) if n > 1 else []
    edges = [0, *cuts, n]
    return [slice(a, b) for a, b in zip(edges, edges[1:], strict=False)]


def sparse_counts(tokens, lengths, V: int, rng: random.Random) -> SparseCountAccumulator:
    """A sparse pass 1 in random chunks, with a random buffer and head size."""
    T = tokens.shape[1] - 1
    acc = SparseCountAccumulator(V, T, buffer_pairs=rng.choice([1, 7, 40, 10**6]),
                                 head=rng.randint(0, V))
    for sl in splits(tokens.shape[0], rng):
        acc.update(tokens[sl], None if lengths is None else lengths[sl])
    return acc


def sparse_stats(tokens, V: int, lengths=None, top_k=None, width: int | None = None):
    """batch_stats with the sparse engine; ``width``: the Gbar tile width (the tile budget
    that gives it)."""
    budget = None if width is None else width * first_tiles_bytes(V)
    return batch_stats(tokens, V, lengths=lengths, top_k=top_k, engine="sparse",
                       budget_bytes=budget)


def first_tiles_bytes(V: int) -> int:
    """Bytes of one column of every array of a Gbar tile (plan.tile_width's unit)."""
    return plan.TILE_ARRAYS * 8 * V


def dense_state(acc: CountAccumulator) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in acc.state()[0].items() if k in PASS1}


def natural_scale(ref, name: str) -> float:
    """Magnitude of a statistic from its factors, floored at one count over P positions."""
    u = 1.0 / ref.meta["counts"]["positions"]
    m = {k: max(float(ref[k].abs().max()), f) for k, f in (("Bbar", u), ("Phibar", u),
                                                           ("SigmaB", u * u), ("Gbar", u**3))}
    V = ref["Bbar"].shape[0]
    return {"SigmaB": V * m["Bbar"] ** 2, "PhiBT": V * m["Bbar"] * m["Phibar"],
            "Gbar": V * m["SigmaB"] * m["Phibar"], "Qbar": 2 * m["Gbar"],
            "Delta": 2 * m["Gbar"]}.get(name, m.get(name, 0.0))


def assert_same_stats(sparse, dense, rtol: float = 1e-12) -> None:
    """Bbar, Phibar bit for bit; the compositions and pass 2 to float64 rounding."""
    assert sparse.stats_id == dense.stats_id
    assert torch.equal(sparse.token_ids, dense.token_ids)
    for name in NAMES:
        if name in EXACT:
            assert torch.equal(sparse[name], dense[name]), name
            continue
        atol = rtol * natural_scale(dense, name) + 1e-300
        torch.testing.assert_close(sparse[name], dense[name], rtol=0, atol=atol, msg=name)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(corpora(max_v=20, max_n=7, max_t=16))
def test_sparse_pass1_is_the_dense_state_bit_for_bit(data):
    tokens, lengths, V, seed = data
    rng = random.Random(seed)
    dense = CountAccumulator(V, tokens.shape[1] - 1).update(tokens, lengths)
    for backend in BACKENDS:
        with native.use_backend(backend):
            acc = sparse_counts(tokens, lengths, V, rng)
            want = dense_state(dense)
            for k, v in dense_state(as_dense(acc)).items():
                assert torch.equal(v, want[k]), (backend, k)
            assert acc.checksum() == dense.checksum()
            assert (acc.n_positions, acc.n_tokens) == (dense.n_positions, dense.n_tokens)


@settings(max_examples=25, deadline=None)
@given(corpora(max_n=8), st.integers(0, 2**31 - 1))
def test_merge_in_any_order_and_checkpoints_are_exact(data, seed):
    tokens, lengths, V, _ = data
    rng = random.Random(seed)
    T = tokens.shape[1] - 1
    parts = []
    for i, sl in enumerate(splits(tokens.shape[0], rng)):
        part = sparse_counts(tokens[sl], None if lengths is None else lengths[sl], V, rng)
        part.ledger = [{"shard": f"s{i}", "index": i}]
        tensors, meta = part.state()  # through a checkpoint and back
        parts.append(SparseCountAccumulator.from_state(tensors, meta))
    rng.shuffle(parts)
    merged = parts[0]
    for p in parts[1:]:
        merged.merge(p)
    dense = CountAccumulator(V, T).update(tokens, lengths)
    assert merged.checksum() == dense.checksum()
    from_dense = SparseCountAccumulator.from_state(*dense.state())  # a dense checkpoint
    assert from_dense.checksum() == dense.checksum()
    for k, v in dense_state(as_dense(from_dense)).items():
        assert torch.equal(v, dense_state(dense)[k]), k


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(corpora(), st.integers(1, 16), st.integers(0, 2**31 - 1))
def test_sparse_statistics_equal_dense_and_the_oracle(data, k, seed):
    tokens, lengths, V, _ = data
    rng = random.Random(seed)
    top_k = rng.choice([None, min(k, V)])
    for backend in BACKENDS:
        with native.use_backend(backend):
            sparse = sparse_stats(tokens, V, lengths=lengths, top_k=top_k,
                                  width=rng.randint(1, V + 1))
        dense = batch_stats(tokens, V, lengths=lengths, top_k=top_k)
        assert_same_stats(sparse, dense)
    full = sparse if top_k is None else sparse_stats(tokens, V, lengths=lengths)
    n = lengths.tolist() if lengths is not None else [tokens.shape[1]] * tokens.shape[0]
    ref = reference_stats_ragged([tokens[i, :m] for i, m in enumerate(n)], V)
    for name in NAMES:
        D = ref[name].shape[0]
        got = full[name][:D] if name == "Delta" else full[name]
        scale = natural_scale(full, name)
        torch.testing.assert_close(got, ref[name], rtol=0, atol=1e-10 * scale + 1e-300)


def test_absent_ids_get_the_centring_of_the_full_vocabulary():
    """Rows of ids that never occur are -n/(PV) (Bbar columns) and -w/(VP) (Phibar rows)."""
    tokens = torch.tensor([[1, 4, 1, 4, 6], [4, 6, 6, 1, 1]])
    V = 9  # ids 0, 2, 3, 5, 7, 8 never occur
    s, d = sparse_stats(tokens, V, top_k=9), batch_stats(tokens, V, top_k=9)
    assert_same_stats(s, d)
    absent = [i for i, t in enumerate(s.token_ids.tolist()) if t not in (1, 4, 6)]
    assert len(absent) == 6 and bool((s.Phibar[absent] != 0).any())
    assert not s.Bbar[absent].any()  # an absent current token has an all-zero row


def test_the_product_sums_each_entry_in_the_order_of_the_sparse_entries():
    """sc_spmm (its packed rows prefetched ahead of use) is bit-identical to a loop that adds
    a * x in A's order, then corrects and scales: long rows, empty rows, the last entries."""
    g = np.random.default_rng(3)
    rows, nx, w = 29, 41, 70  # three column blocks, the last one partial
    counts = g.integers(0, 30, rows)
    counts[[0, 5, rows - 1]] = [0, 40, 33]  # empty, far longer than the prefetch distance, last
    col = np.concatenate([np.sort(g.choice(nx, c, replace=False)) for c in counts])
    ip = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    val, X = g.standard_normal(col.size), g.standard_normal((nx, w))
    u, v, scale = g.standard_normal(rows), g.standard_normal(w), 0.3
    want = np.zeros((rows, w))
    for r in range(rows):
        for c in range(w):
            acc = 0.0
            for p in range(ip[r], ip[r + 1]):
                acc += val[p] * X[col[p], c]
            want[r, c] = (acc - u[r] * v[c]) * scale
    for threads in (1, 2):
        got = sparsecount.spmm((ip, col.astype(np.int64), val), X, threads, True,
                               Correction(u, v, scale))
        assert np.array_equal(got, want.T)


def test_compiled_kernels_equal_their_numpy_twins():
    g = np.random.default_rng(0)
    A = scipy.sparse.random(37, 23, density=0.3, format="csr", random_state=1) * 7
    X = g.standard_normal((23, 45))
    ip, col = A.indptr.astype(np.int64), A.indices.astype(np.int64)
    want = A @ X
    u, v = g.standard_normal(37), g.standard_normal(45)
    for threads in (1, 3):
        got = sparsecount.spmm((ip, col, A.data), X, threads)
        np.testing.assert_allclose(got, want, rtol=1e-15, atol=1e-15)
        np.testing.assert_allclose(sparsecount.spmm((ip, col, A.data), X, threads, True), want.T,
                                   rtol=1e-15, atol=1e-15)
        fused = sparsecount.spmm((ip, col, A.data), X, threads, True, Correction(u, v, 0.5))
        np.testing.assert_allclose(fused, ((want - np.outer(u, v)) * 0.5).T, rtol=1e-14,
                                   atol=1e-14)
        ones = sparsecount.spmm((ip, col, A.data), X, threads, False, Correction(None, v))
        np.testing.assert_allclose(ones, want - v[None, :], rtol=1e-14, atol=1e-14)
    for size in (0, 7, 8, 63, 64, 65, 1000):  # the tile compaction: numpy's flatnonzero
        block, mask = g.standard_normal(size), g.random(size) < 0.2
        words = sparsecount.bitmap_words(size)
        touched = np.zeros(words, dtype=np.uint64)  # bit j of word j // 64: entry j
        for j in np.flatnonzero(mask):
            touched[j // 64] |= np.uint64(1) << np.uint64(j % 64)
        want = np.flatnonzero(mask)
        vals = block[want]
        flat, got = sparsecount.compact(block, touched)
        assert np.array_equal(flat, want) and np.array_equal(got, vals)
        assert not touched.any() and not block[want].any()
    tokens = torch.randint(0, 11, (9, 8), generator=torch.Generator().manual_seed(2))
    lengths = torch.tensor([8, 2, 5, 8, 3, 8, 7, 6, 4])
    for head in (0, 4, 11):
        for backend in BACKENDS:
            with native.use_backend(backend):
                acc = SparseCountAccumulator(11, 7, buffer_pairs=5, head=head)
                acc.update(tokens, lengths).update(tokens[:4], lengths[:4])
                tensors = as_dense(acc).state()[0]
            ref = CountAccumulator(11, 7).update(tokens, lengths).update(tokens[:4], lengths[:4])
            for k, v in dense_state(ref).items():
                assert torch.equal(tensors[k], v), (head, backend, k)


@pytest.mark.parametrize("top_k", [None, 5])
def test_c_pass2_equals_its_numpy_specification(top_k, monkeypatch):
    """sc_sweep, sc_centre_tile and sc_centre against tests/sparse_pass2_oracle.py (in small
    vectorised steps too), through the whole second pass: Qbar on the same pairs, Qbar and
    Delta to float64 rounding."""
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, 13, (6, 12), generator=g)
    lengths = torch.tensor([12, 2, 7, 12, 5, 9])
    c = sparse_stats(tokens, 13, lengths=lengths, top_k=top_k, width=4)
    for pairs in (oracle.OCC_PAIRS, 3):
        monkeypatch.setattr(oracle, "OCC_PAIRS", pairs)
        for name in ("sweep", "centre_tile", "centre"):
            monkeypatch.setattr(sparsecount, name, getattr(oracle, name))
        ref = sparse_stats(tokens, 13, lengths=lengths, top_k=top_k, width=4)
        monkeypatch.undo()
        assert np.array_equal(c.store.qbar.indptr, ref.store.qbar.indptr)
        assert np.array_equal(c.store.qbar.rows, ref.store.qbar.rows)
        for name in ("Qbar", "Delta"):
            torch.testing.assert_close(c[name], ref[name], rtol=0,
                                       atol=1e-13 * float(ref[name].abs().max()))


def test_kernels_refuse_bad_input():
    out = np.empty(100, dtype=np.int64)
    bad = np.array([[0, 1, 5, 2]])
    with pytest.raises(KernelError, match="outside the vocabulary"):
        sparsecount.pairs(bad, np.array([4]), 5, 3, out)
    with pytest.raises(KernelError, match="2 <= length"):
        sparsecount.pairs(bad, np.array([1]), 9, 3, out)
    with pytest.raises(KernelError, match="pair buffer"):
        sparsecount.pairs(bad, np.array([4]), 9, 3, out[:2])
    with pytest.raises(KernelError, match="S: need"):
        sparsecount.sweep(TokenWindows(bad.astype(np.int32), np.array([4])),
                          Tile(np.array([0]), np.zeros(9, dtype=np.int64), None, 9, -1),
                          np.zeros((1, 9)), second.TileSums(np.zeros(1), np.zeros(3), np.zeros(3)),
                          np.zeros(9), np.zeros(1, dtype=np.uint64))
    with pytest.raises(KernelError, match="touched: need"):
        sparsecount.sweep(TokenWindows(bad.astype(np.int32), np.array([4])),
                          Tile(np.array([0]), np.zeros(9, dtype=np.int64), None, 9, -1),
                          np.zeros((1, 9)), second.TileSums(np.zeros(3), np.zeros(3), np.zeros(3)),
                          np.zeros(9), np.zeros(9))


# -- the automatic choice --------------------------------------------------------------------
def test_auto_choice_dense_when_it_fits_else_sparse():
    fits = plan.choose_engine("auto", plan.StatsShape(3000, 128, None), budget=(1e12, "test"))
    assert fits.resolved == "dense" and "fits" in fits.reason
    pythia = plan.choose_engine("auto", plan.StatsShape(50277, 128, 5000), budget=(25.3e9, "test"))
    assert pythia.resolved == "sparse" and "exceeds budget" in pythia.reason
    assert pythia.plan["dense_peak_bytes"] == 5 * 8 * 50277**2 + (1 << 30)
    plan.check_sparse_fits(pythia, 50277, 5000)  # top-5000 outputs: 1.6 GB
    full = plan.choose_engine("auto", plan.StatsShape(50277, 128, None), budget=(25.3e9, "test"))
    plan.check_sparse_fits(full, 50277, None)  # factored: no V x V output at any vocabulary
    assert full.plan["sparse"]["fixed_bytes"] < 3e9
    tiny = plan.choose_engine("sparse", plan.StatsShape(50277, 128, None), budget=(1e9, "test"))
    with pytest.raises(ResourceError, match="full-vocabulary statistics at d_vocab 50,277"):
        plan.check_sparse_fits(tiny, 50277, None)
    resumed = plan.choose_engine("auto", plan.StatsShape(3000, 128, None), budget=(1e12, "test"),
                                 checkpoint_kind="sparse_count")
    assert resumed.resolved == "sparse" and "resuming" in resumed.reason
    with pytest.raises(MismatchError, match="sparse pass-1 checkpoint"):
        plan.choose_engine("dense", plan.StatsShape(3000, 128, None), budget=(1e12, "test"),
                           checkpoint_kind="sparse_count")
    given = plan.choose_engine("sparse", plan.StatsShape(3000, 128, None), budget=(1e12, "test"))
    assert given.resolved == "sparse" and given.meta()["requested"] == "sparse"
    with pytest.raises(BadInputError, match="--engine 'fast'"):
        plan.choose_engine("fast", plan.StatsShape(3000, 128, None))
    assert plan.tile_width(50277) == 640 and plan.tile_width(10, 1) == 1


Shard, encode = IdShard, encode_ids


def make_shards(n: int = 4, docs: int = 6, V: int = 15, seed: int = 0) -> list[Shard]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for s in range(n):
        texts = tuple(" ".join(map(str, torch.randint(1, V - 2, (int(m),), generator=g).tolist()))
                      for m in torch.randint(4, 12, (docs,), generator=g))
        out.append(Shard(f"shard{s}", texts))
    return out


def spec(tmp: Path, engine: str, V: int = 15, T: int = 6, **kw) -> run.RunSpec:
    return run.RunSpec(V, SequencePolicy(T, short="keep"), encode, {"test": 1}, tmp,
                       progress=False, batch_size=4, engine=engine, **kw)


@pytest.mark.parametrize("top_k", [None, 6])
def test_driver_sparse_equals_dense(tmp_path, top_k):
    shards = make_shards()
    dense = run.compute_stats(shards, spec(tmp_path / "d", "dense", top_k=top_k), {})
    sparse = run.compute_stats(shards, spec(tmp_path / "s", "sparse", top_k=top_k), {})
    assert_same_stats(sparse, dense)
    assert sparse.meta["engine"]["resolved"] == "sparse" and sparse.meta["ledger"] == \
        dense.meta["ledger"]
    path = sparse.save(tmp_path / "s.safetensors")
    loaded = CorpusStats.load(path)
    for name in NAMES:
        assert torch.equal(loaded[name], sparse[name]), name


def test_sparse_driver_kill_and_resume_is_bit_identical(tmp_path, monkeypatch):
    monkeypatch.setattr(second, "CHECKPOINT_SECONDS", 0.0)
    shards = make_shards()
    kw = {"budget_bytes": 1}  # the narrowest tiles: several tiles to resume between
    clean = run.compute_stats(shards, spec(tmp_path / "clean", "sparse", **kw), {})
    broken = list(shards)
    broken[2] = Shard(shards[2].name, shards[2].texts, fail=True)
    with pytest.raises(KeyboardInterrupt):  # killed in pass 1
        run.compute_stats(broken, spec(tmp_path / "r", "sparse", **kw), {})
    real, calls = second.Sweep.first, []

    def dying(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt("killed in pass 2")
        return real(*a, **k)

    monkeypatch.setattr(second.Sweep, "first", dying)
    with pytest.raises(KeyboardInterrupt):
        run.compute_stats(shards, spec(tmp_path / "r", "auto", **kw), {})  # auto resumes sparse
    monkeypatch.setattr(second.Sweep, "first", real)
    resumed = run.compute_stats(shards, spec(tmp_path / "r", "auto", **kw), {})
    assert resumed.meta["engine"]["resolved"] == "sparse"
    assert "resuming" in resumed.meta["engine"]["reason"]
    assert resumed.stats_id == clean.stats_id
    for name in NAMES:
        assert torch.equal(resumed[name], clean[name]), name


def _job(work: str):
    return make_shards(), spec(Path(work), "sparse", max_docs=20, budget_bytes=1)


def test_two_processes_equal_one(tmp_path):
    one = run.compute_stats(make_shards(), spec(tmp_path / "one", "sparse", max_docs=20,
                                                budget_bytes=1), {})
    out = tmp_path / "two.safetensors"
    stats_in_processes(partial(_job, str(tmp_path / "two")), out)
    two = CorpusStats.load(out)
    assert two.meta["ledger"] == one.meta["ledger"] and two.stats_id == one.stats_id
    assert_same_stats(two, one)


def test_cli_engine_flag_and_metadata(tmp_path):
    from pythia_probe.stats.__main__ import main
    from pythia_probe.stats.job import StatsConfig

    args = ["--dataset", "builtin", "--stories", "60", "--stories-per-shard", "30",
            "--seq-len", "16", "--tokenizer", "word:300", "--top-k", "40", "--no-progress"]
    out = {}
    for engine in ("auto", "sparse"):
        path = tmp_path / f"{engine}.safetensors"
        assert main(["compute", *args, "--engine", engine, "--out", str(path)]) == 0
        out[engine] = CorpusStats.load(path)
    assert out["auto"].meta["engine"]["resolved"] == "dense"  # a tiny vocabulary fits
    assert out["sparse"].meta["engine"]["requested"] == "sparse"
    assert out["sparse"].meta["kernel"]["backend"] in ("c", "numpy")
    assert_same_stats(out["sparse"], out["auto"])
    with pytest.raises(BadInputError, match="--engine 'gpu'"):
        StatsConfig(engine="gpu")
