"""Statistics engine vs the literal float64 oracle (spec leading-terms section 2)."""

from __future__ import annotations

import json
import random

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pythia_probe.errors import (
    BadInputError,
    CorruptFileError,
    MismatchError,
    MissingFileError,
    ResourceError,
)
from pythia_probe.stats import (
    CorpusStats,
    CountAccumulator,
    QAccumulator,
    batch_stats,
    first_pass,
)
from pythia_probe.stats.dense import kernels
from pythia_probe.stats.dense.engine import DenseEngine
from pythia_probe.stats.engine import top_k_ids
from pythia_probe.stats.reference import reference_stats, reference_stats_ragged

NAMES = ("Bbar", "Phibar", "SigmaB", "PhiBT", "Gbar", "Qbar", "Delta")
RTOL = 1e-10


def close(a: torch.Tensor, b: torch.Tensor, rtol: float = RTOL,
          scale: float | None = None) -> None:
    """Equal to ``rtol`` relative to the largest entry of the reference (or ``scale``)."""
    if scale is None:
        scale = float(b.abs().max()) if b.numel() else 0.0
    torch.testing.assert_close(a, b, rtol=rtol, atol=rtol * scale + 1e-300)


def scale_of(ref: dict, name: str) -> float:
    """Natural magnitude of a statistic from its factors (exact cancellations leave noise).

    Each factor's magnitude is floored at its unit (one count over the P positions, and its
    powers), so a statistic that is exactly zero is compared at 1e-10 of one count, not of the
    reference's rounding noise.
    """
    u = 1.0 / ref["positions"]
    floor = {"Bbar": u, "Phibar": u, "SigmaB": u * u, "Gbar": u ** 3}
    m = {k: max(float(ref[k].abs().max()), floor[k]) for k in floor}
    V = ref["Bbar"].shape[0]
    return {"Bbar": m["Bbar"], "Phibar": m["Phibar"], "SigmaB": V * m["Bbar"] ** 2,
            "PhiBT": V * m["Bbar"] * m["Phibar"], "Gbar": V * m["SigmaB"] * m["Phibar"],
            "Qbar": 2 * m["Gbar"], "Delta": 2 * m["Gbar"]}[name]


@st.composite
def corpora(draw, max_v: int = 12, max_n: int = 5, max_t: int = 12):
    V = draw(st.integers(2, max_v))
    N = draw(st.integers(1, max_n))
    T = draw(st.integers(1, max_t))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (N, T + 1), generator=g), V


def splits(n: int, rng: random.Random) -> list[slice]:
    """A random split of range(n) into consecutive non-empty chunks."""
    cuts = sorted(rng.sample(range(1, n), rng.randint(0, n - 1))) if n > 1 else []
    edges = [0, *cuts, n]
    return [slice(a, b) for a, b in zip(edges, edges[1:], strict=False)]


def count_state(acc: CountAccumulator) -> list[torch.Tensor]:
    tensors, _ = acc.state()
    return [tensors[k].clone() for k in ("token_counts", "bigram", "context_hi", "context_lo")]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(corpora())
@example(data=(torch.tensor([[1, 0], [1, 1], [1, 2]]), 3))  # Bbar exactly 0: reference is noise
def test_batch_stats_equals_reference(data):
    tokens, V = data
    stats, ref = batch_stats(tokens, V), reference_stats(tokens, V)
    for name in NAMES:
        close(stats[name], ref[name], scale=scale_of(ref, name))


@settings(max_examples=40, deadline=None)
@given(corpora())
def test_counts_are_exact(data):
    tokens, V = data
    acc = CountAccumulator(V, tokens.shape[1] - 1).update(tokens)
    X, Y = torch.nn.functional.one_hot(tokens[:, :-1], V), torch.nn.functional.one_hot(
        tokens[:, 1:], V)
    assert torch.equal(acc.bigram.view(V, V), torch.einsum("ntv,ntw->vw", X, Y))
    assert torch.equal(acc.token_counts, torch.bincount(tokens.reshape(-1), minlength=V))
    assert acc.n_positions == tokens.shape[0] * (tokens.shape[1] - 1)


@settings(max_examples=40, deadline=None)
@given(corpora(max_n=8), st.integers(0, 2**31 - 1))
def test_any_chunking_and_shard_merge_is_bit_identical(data, seed):
    tokens, V = data
    T, rng = tokens.shape[1] - 1, random.Random(seed)
    whole = count_state(CountAccumulator(V, T).update(tokens))
    chunked = CountAccumulator(V, T)
    for sl in splits(tokens.shape[0], rng):
        chunked.update(tokens[sl])
    parts = []
    for i, sl in enumerate(splits(tokens.shape[0], rng)):
        part = CountAccumulator(V, T).update(tokens[sl])
        part.ledger = [{"shard": f"s{i}"}]
        parts.append(part)
    rng.shuffle(parts)
    merged = parts[0]
    for p in parts[1:]:
        merged.merge(p)
    for a, b, c in zip(whole, count_state(chunked), count_state(merged), strict=True):
        assert torch.equal(a, b) and torch.equal(a, c)


@settings(max_examples=30, deadline=None)
@given(corpora(max_n=8), st.integers(0, 2**31 - 1))
def test_second_pass_chunks_and_merges_match_reference(data, seed):
    tokens, V = data
    T, rng = tokens.shape[1] - 1, random.Random(seed)
    fp = first_pass(CountAccumulator(V, T).update(tokens))
    parts = [QAccumulator(fp.Gbar, T).update(tokens[sl]) for sl in splits(len(tokens), rng)]
    rng.shuffle(parts)
    q = parts[0]
    for p in parts[1:]:
        q.merge(p)
    ref = reference_stats(tokens, V)
    P = fp.n_positions
    close(q.Qbar.view(V, V) / P, ref["Qbar"], scale=scale_of(ref, "Qbar"))
    close(q.Delta / P, ref["Delta"], scale=scale_of(ref, "Delta"))


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 9), st.lists(st.integers(2, 10), min_size=1, max_size=5),
       st.integers(0, 2**31 - 1))
def test_variable_lengths_padding_never_counted(V, lens, seed):
    g = torch.Generator().manual_seed(seed)
    seqs = [torch.randint(0, V, (n,), generator=g) for n in lens]
    L = max(lens)
    tokens = torch.randint(0, V, (len(seqs), L), generator=g)  # random padding values
    for i, s in enumerate(seqs):
        tokens[i, : len(s)] = s
    stats = batch_stats(tokens, V, lengths=torch.tensor(lens))
    ref = reference_stats_ragged(seqs, V)
    for name in NAMES:
        close(stats[name], ref[name], scale=scale_of(ref, name))


def test_invariants_row_col_sums_and_symmetry():
    tokens = torch.randint(0, 40, (6, 31), generator=torch.Generator().manual_seed(0))
    s = batch_stats(tokens, 40)
    assert float(s.Bbar.sum(1).abs().max()) < 1e-15
    assert float(s.Phibar.sum(0).abs().max()) < 1e-15
    torch.testing.assert_close(s.SigmaB, s.SigmaB.T, rtol=0, atol=1e-18)
    assert s.meta["counts"]["positions"] == 6 * 30 and len(s.stats_id) == 12


@settings(max_examples=25, deadline=None)
@given(corpora(max_v=15), st.integers(1, 15))
def test_top_k_composes_then_slices(data, k):
    tokens, V = data
    k = min(k, V)
    s, ref = batch_stats(tokens, V, top_k=k), reference_stats(tokens, V)
    ids = s.token_ids
    assert torch.equal(ids, top_k_ids(torch.bincount(tokens.reshape(-1), minlength=V), k))
    assert s.meta["vocab"]["compose"] == "full_then_slice" and s.restricted
    for name in NAMES[:-1]:
        close(s[name], ref[name][ids][:, ids], scale=scale_of(ref, name))
    close(s.Delta, ref["Delta"], scale=scale_of(ref, "Delta"))


def test_top_k_order():
    counts = torch.tensor([5, 9, 9, 0, 7])
    assert top_k_ids(counts, 3).tolist() == [1, 2, 4]
    with pytest.raises(ValueError, match="top-k must be in 1..5"):
        top_k_ids(counts, 6)


def test_save_load_roundtrip_and_lazy_derived(tmp_path):
    tokens = torch.randint(0, 9, (4, 11), generator=torch.Generator().manual_seed(1))
    s = batch_stats(tokens, 9, tokenizer={"name": "t", "sha256": "ab", "d_vocab": 9})
    path = s.save(tmp_path / "s.safetensors")
    loaded = CorpusStats.load(path, expect={"name": "x", "sha256": "ab", "d_vocab": 9})
    assert loaded.stats_id == s.stats_id and loaded.T == 10 and loaded.d_vocab == 9
    for name in NAMES:
        assert torch.equal(loaded[name], s[name])
    lazy = CorpusStats({k: s[k] for k in ("Bbar", "Phibar", "Qbar", "Delta")}, dict(s.meta))
    close(lazy.Gbar, s.Gbar, 1e-14)
    close(lazy.PhiBT, s.PhiBT, 1e-14)


def test_load_refuses_mismatch_and_corruption(tmp_path):
    tokens = torch.randint(0, 9, (4, 11), generator=torch.Generator().manual_seed(2))
    path = batch_stats(tokens, 9, tokenizer={"name": "t", "sha256": "ab", "d_vocab": 9}
                       ).save(tmp_path / "s.safetensors")
    with pytest.raises(MismatchError, match="sha256"):
        CorpusStats.load(path, expect={"name": "other", "sha256": "cd", "d_vocab": 9})
    with pytest.raises(MismatchError, match="d_vocab"):
        CorpusStats.load(path, expect={"name": "t", "d_vocab": 50277})
    raw = bytearray(path.read_bytes())
    flipped = tmp_path / "flip.safetensors"
    raw[-5] ^= 0xFF
    flipped.write_bytes(bytes(raw))
    with pytest.raises(CorruptFileError, match="sha256"):
        CorpusStats.load(flipped)
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(path.read_bytes()[: len(raw) // 2])
    with pytest.raises(CorruptFileError, match="corrupt"):
        CorpusStats.load(cut)
    with pytest.raises(MissingFileError, match="does not exist"):
        CorpusStats.load(tmp_path / "missing.safetensors")


def test_bad_batches_are_refused_clearly():
    acc = CountAccumulator(5, 4)
    with pytest.raises(BadInputError, match="token id 7 outside the vocabulary 0..4"):
        acc.update(torch.tensor([[0, 1, 7, 2, 3]]))
    with pytest.raises(BadInputError, match="outside the vocabulary"):
        acc.update(torch.tensor([[0, -1, 2, 2, 3]]))
    with pytest.raises(BadInputError, match="columns; valid: 2..T\\+1 = 5"):
        acc.update(torch.zeros(2, 7, dtype=torch.long))
    with pytest.raises(BadInputError, match="lengths"):
        acc.update(torch.zeros(2, 5, dtype=torch.long), torch.tensor([1, 5]))
    with pytest.raises(BadInputError, match="integer tensor"):
        acc.update(torch.zeros(2, 5))
    acc.update(torch.tensor([[0, 1, 9, 9, 9]]), torch.tensor([2]))  # ids past length ignored
    assert acc.n_positions == 1 and acc.n_sequences == 1
    acc.update(torch.zeros(0, 5, dtype=torch.long))  # an empty batch counts nothing
    assert acc.n_positions == 1
    with pytest.raises(ValueError, match="no positions were counted"):
        first_pass(CountAccumulator(5, 4))


def test_merge_refuses_double_counting_and_mismatch():
    a, b = CountAccumulator(5, 4), CountAccumulator(5, 4)
    a.ledger = [{"shard": "x"}]
    b.ledger = [{"shard": "x"}]
    with pytest.raises(MismatchError, match="shards counted twice"):
        a.merge(b)
    with pytest.raises(MismatchError, match="cannot merge"):
        a.merge(CountAccumulator(6, 4))


def test_fixed_point_carry_keeps_exact_sum():
    """Carrying lo into hi at any moment leaves the canonical (hi, lo) state unchanged."""
    tokens = torch.randint(0, 7, (40, 9), generator=torch.Generator().manual_seed(3))
    carried = CountAccumulator(7, 8)
    for i in range(40):
        carried.update(tokens[i:i + 1])
        carried.context.normalize()
    whole = CountAccumulator(7, 8).update(tokens)
    assert all(torch.equal(a, b) for a, b in zip(count_state(carried), count_state(whole),
                                                 strict=True))
    fp = whole.context
    fp.lo += (1 << 61) + 5 * (1 << fp.F)  # a large pending lo carries exactly
    before = fp.hi.clone()
    fp.normalize()
    assert torch.equal(fp.hi - before, torch.full_like(before, (1 << (61 - fp.F)) + 5))
    assert bool(((fp.lo >= 0) & (fp.lo < (1 << fp.F))).all())


def test_long_sequences_T200_within_tolerance():
    """Fixed-point context weights stay within 1e-10 at the paper's T = 200."""
    tokens = torch.randint(0, 30, (2, 201), generator=torch.Generator().manual_seed(4))
    s, ref = batch_stats(tokens, 30), reference_stats(tokens, 30)
    for name in NAMES:
        close(s[name], ref[name], scale=scale_of(ref, name))


def test_tiled_compositions_and_offload_equal_direct():
    from pythia_probe.stats import compose

    g = torch.Generator().manual_seed(5)
    A, B = torch.randn(37, 23, generator=g, dtype=torch.float64), torch.randn(
        23, 11, generator=g, dtype=torch.float64)
    close(compose.matmul_tiled(A, B, budget_bytes=1), A @ B, 1e-14)  # one row per tile
    close(compose.matmul_tiled(A.T, A, budget_bytes=300), A.T @ A, 1e-14)
    tokens = torch.randint(0, 13, (5, 9), generator=g)
    a = first_pass(CountAccumulator(13, 8).update(tokens), offload=True, budget_bytes=64)
    b = first_pass(CountAccumulator(13, 8).update(tokens), offload=False)
    for x, y in ((a.Bbar, b.Bbar), (a.Phibar, b.Phibar), (a.SigmaB, b.SigmaB), (a.Gbar, b.Gbar)):
        close(x, y, 1e-14)


def test_a_first_format_file_still_loads(tmp_path):
    """A file written before the factored format (dense tensors, format 1) loads and reads the
    same; one of an unknown format is refused in one line saying to rebuild it."""
    tokens = torch.randint(0, 9, (4, 11), generator=torch.Generator().manual_seed(6))
    s = batch_stats(tokens, 9)
    dense = {k: s[k] for k in ("Bbar", "Phibar", "Qbar", "Delta")}
    old = CorpusStats(dict(dense, token_counts=s.token_counts), dict(s.meta))
    path = old.save(tmp_path / "old.safetensors")
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        assert set(f.keys()) == {"Bbar", "Phibar", "Qbar", "Delta", "token_counts"}
        assert json.loads(f.metadata()["pythia_probe"])["format"] == "pythia_probe.stats/1"
    loaded = CorpusStats.load(path)
    for name in NAMES:
        close(loaded[name], s[name], 1e-14)
    meta = json.loads(safe_open(str(path), "pt").metadata()["pythia_probe"])
    meta["format"] = "pythia_probe.stats/0"
    from safetensors.torch import save_file

    save_file(dense, str(tmp_path / "older.safetensors"), {"pythia_probe": json.dumps(meta)})
    with pytest.raises(CorruptFileError, match="rebuild it with `python -m pythia_probe.stats "
                                               "compute"):
        CorpusStats.load(tmp_path / "older.safetensors")


def test_gather_path_used_on_gpus_equals_reference(monkeypatch):
    """The kernels' non-CPU branch (one gather per step, as on CUDA), exercised on CPU."""
    monkeypatch.setattr(kernels, "use_slices", lambda device: False)
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, 17, (5, 14), generator=g)
    lengths = torch.tensor([14, 9, 2, 14, 5])
    seqs = [tokens[i, :n] for i, n in enumerate(lengths.tolist())]
    s, ref = batch_stats(tokens, 17, lengths=lengths), reference_stats_ragged(seqs, 17)
    for name in NAMES:
        close(s[name], ref[name], scale=scale_of(ref, name))
    top = batch_stats(tokens[:, :10], 17, top_k=6)
    ref = reference_stats(tokens[:, :10], 17)
    close(top.Qbar, ref["Qbar"][top.token_ids][:, top.token_ids], scale=scale_of(ref, "Qbar"))


def test_streaming_update_api_equals_batch_stats():
    """The accumulators driven by hand through the engine interface (first pass, then
    QAccumulator.update batch by batch, then assemble) give batch_stats' statistics."""
    from pythia_probe.ranks import Ranks
    from pythia_probe.stats.driver import RunSpec
    from pythia_probe.stats.factors import SparseQ
    from pythia_probe.stats.sequences import SequencePolicy

    tokens = torch.randint(0, 10, (6, 8), generator=torch.Generator().manual_seed(8))
    acc = CountAccumulator(10, 7)
    for i in range(0, 6, 2):
        assert acc.update(tokens[i:i + 2]) is acc
    engine = DenseEngine()
    spec = RunSpec(10, SequencePolicy(7), None, {}, None, progress=False)
    first = engine.first_pass(acc, spec, Ranks())
    q = QAccumulator(first.Gbar, 7)
    for i in range(0, 6, 3):
        assert q.update(tokens[i:i + 3]) is q
    stats = engine.assemble(first, SparseQ.from_dense(q.qbar_sum()), q.Delta, {"T": 7}, None,
                            spec)
    ref = batch_stats(tokens, 10)
    for name in NAMES:
        close(stats[name], ref[name], 1e-13)


def test_accumulator_refuses_a_vocabulary_that_cannot_fit():
    with pytest.raises(ResourceError, match="need .* GB on cpu"):
        CountAccumulator(10**6, 8)  # 24 TB of pass-1 state
