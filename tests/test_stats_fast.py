"""The compiled C pass-1 kernel (stats/native/_fastcount.c) against the torch kernel and the
oracle; the backend switch and the one loader of stats/native/.

Promises checked: pass 1 (token, bigram and fixed-point context counts) bit-identical whatever
the backend; the dense engine's statistics with either pass-1 backend equal bit for bit (pass 2
is torch on every device); both equal to the literal float64 reference (1e-10, as
tests/test_stats.py).
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pythia_probe.errors import KernelError
from pythia_probe.stats import CountAccumulator, batch_stats, native
from pythia_probe.stats.fixedpoint import context_weights
from pythia_probe.stats.native import fastcount, sparsecount
from pythia_probe.stats.reference import reference_stats, reference_stats_ragged

PASS1 = ("token_counts", "bigram", "context_hi", "context_lo")


def row_splits(n: int, rng: random.Random) -> list[slice]:
    cuts = sorted(rng.sample(range(1, n), rng.randint(0, n - 1))) if n > 1 else []
    edges = [0, *cuts, n]
    return [slice(a, b) for a, b in zip(edges, edges[1:], strict=False)]


@st.composite
def ragged_corpora(draw, max_v: int = 30, max_n: int = 7, max_t: int = 24):
    """tokens [N, T+1] with junk padding (ids outside the vocabulary) beyond ``lengths``."""
    V, N, T = draw(st.integers(2, max_v)), draw(st.integers(1, max_n)), draw(st.integers(1, max_t))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    tokens = torch.randint(0, V, (N, T + 1), generator=g)
    lengths = torch.randint(2, T + 2, (N,), generator=g) if draw(st.booleans()) else None
    if lengths is not None:
        pad = torch.arange(T + 1)[None, :] >= lengths[:, None]
        junk = torch.tensor([-3, V + 3])  # never read: would be out of range if it were
        tokens[pad] = junk[torch.randint(0, 2, (int(pad.sum()),), generator=g)]
    return tokens, lengths, V, draw(st.integers(0, 2**31 - 1))


def pass1(backend: str, tokens, lengths, V: int, splits) -> CountAccumulator:
    with native.use_backend(backend):
        acc = CountAccumulator(V, tokens.shape[1] - 1)
        for sl in splits:
            acc.update(tokens[sl], None if lengths is None else lengths[sl])
    return acc


def test_extension_is_built_and_selected_on_cpu():
    assert fastcount.available() and sparsecount.available(), (
        "pythia_probe/stats/native/_fastcount*.so / _sparsecount*.so are not built: "
        "`pip install -e .` compiles them (needs a C compiler)")
    assert fastcount.info()["backend"] == "c" and sparsecount.info()["backend"] == "c"
    assert native.library_path("_fastcount").parent.name == "native"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ragged_corpora())
def test_c_kernel_equals_torch_kernel_bit_for_bit(data):
    tokens, lengths, V, seed = data
    rng = random.Random(seed)
    a = pass1("c", tokens, lengths, V, row_splits(len(tokens), rng))
    b = pass1("torch", tokens, lengths, V, row_splits(len(tokens), rng))
    ta, tb = a.state()[0], b.state()[0]
    for name in PASS1:
        assert torch.equal(ta[name], tb[name]), name


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ragged_corpora(max_v=12, max_n=5, max_t=12))
def test_c_kernel_equals_float64_reference(data):
    tokens, lengths, V, _ = data
    with native.use_backend("c"):
        s = batch_stats(tokens, V, lengths=lengths)
    if lengths is None:
        ref = reference_stats(tokens, V)
    else:
        ref = reference_stats_ragged([tokens[i, :n] for i, n in enumerate(lengths.tolist())], V)
    u = 1.0 / ref["positions"]  # one count: the floor of each statistic's scale
    scale = 2 * max(float(ref["Gbar"].abs().max()), u ** 3)
    for name in ("Bbar", "Phibar", "Gbar"):
        m = max(float(ref[name].abs().max()), u ** (3 if name == "Gbar" else 1))
        torch.testing.assert_close(s[name], ref[name], rtol=1e-10, atol=1e-10 * m + 1e-300)
    D = ref["Delta"].numel()  # ragged: the reference stops at the longest row
    assert not s.Delta[D:].any()
    for a, b in ((s.Qbar, ref["Qbar"]), (s.Delta[:D], ref["Delta"])):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10 * scale + 1e-300)


def test_full_statistics_identical_across_backends_at_t128():
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, 50, (12, 129), generator=g)
    lengths = torch.randint(2, 130, (12,), generator=g)
    out = {}
    for backend in ("c", "torch"):
        with native.use_backend(backend):
            out[backend] = batch_stats(tokens, 50, lengths=lengths)
    c, t = out["c"], out["torch"]
    for name in ("Bbar", "Phibar", "SigmaB", "Gbar", "PhiBT", "Qbar", "Delta"):
        assert torch.equal(c[name], t[name]), name
    assert c.stats_id == t.stats_id  # pass-1 checksums identical


def test_kernel_refuses_bad_input_with_clear_errors():
    lo = torch.zeros(25, dtype=torch.int64)
    w = context_weights(4, torch.device("cpu"))
    bad = torch.tensor([[0, 1, 5, 2, 0]])
    with pytest.raises(KernelError, match="outside the vocabulary"):
        fastcount.add_context(lo, bad, torch.tensor([5]), 5, w)
    with pytest.raises(KernelError, match="2 <= length"):
        fastcount.add_context(lo, bad, torch.tensor([1]), 5, w)
    with pytest.raises(KernelError, match="d_vocab\\^2"):
        fastcount.add_context(lo[:20], bad, torch.tensor([2]), 5, w)
    assert int(lo.abs().sum()) == 0  # refused before touching the accumulator


def test_backend_choice_is_validated_and_restored():
    with pytest.raises(ValueError, match="valid: auto, c, torch"):
        with native.use_backend("fortran"):
            pass
    with native.use_backend("torch"):
        assert fastcount.info()["backend"] == "torch" and not sparsecount.use_c()
    assert fastcount.info()["backend"] == "c"


def test_kernel_choice_is_recorded_in_metadata():
    tokens = torch.randint(0, 7, (3, 9))
    assert batch_stats(tokens, 7).meta["kernel"]["backend"] == "c"
    with native.use_backend("torch"):
        assert batch_stats(tokens, 7).meta["kernel"]["backend"] == "torch"
    assert batch_stats(tokens, 7, engine="sparse").meta["kernel"]["pass2"] == "c"


def test_c_kernel_not_built_is_one_line_or_a_logged_fallback(monkeypatch, caplog):
    """PYTHIA_PROBE_KERNEL=c without the built library: a KernelError (exit 2), never a
    RuntimeError traceback; auto: the torch / numpy kernels, said once in the log; the sparse
    engine, whose pass 2 exists only in C, is refused in one line."""
    from pythia_probe.errors import user_message
    from pythia_probe.planner import statistics as plan

    monkeypatch.setattr(fastcount, "available", lambda: False)
    monkeypatch.setattr(sparsecount, "available", lambda: False)
    with native.use_backend("c"), pytest.raises(KernelError, match="PYTHIA_PROBE_KERNEL=c, "
                                                "but the C kernel _fastcount is not built") as e:
        fastcount.use_c()
    assert "\n" not in user_message(e.value)
    with native.use_backend("c"), pytest.raises(KernelError, match="_sparsecount is not built"):
        sparsecount.use_c()
    native.log_fallback.cache_clear()
    with caplog.at_level("WARNING", logger="pythia_probe.stats.native"):
        assert not fastcount.use_c() and not sparsecount.use_c() and not fastcount.use_c()
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and all("is not built: using the" in m for m in said)
    with pytest.raises(KernelError, match="the sparse engine needs its C kernels"):
        sparsecount.require()
    choice = plan.choose_engine("auto", plan.StatsShape(50277, 128, None), budget=(1e15, "test"),
                                sparse_built=False)
    assert choice.resolved == "dense" and "not built" in choice.reason
    with pytest.raises(KernelError, match="sparse engine needs its C kernels"):
        plan.choose_engine("sparse", plan.StatsShape(3000, 128, None), budget=(1e12, "test"),
                           sparse_built=False)
