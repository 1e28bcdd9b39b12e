"""QbarHead, the per-head target (pass 2 with GbarHead = Bbar^T Phibar^T Bbar^T in place of
Gbar), against the literal float64 oracle (stats/reference.py): both engines, ragged windows with
absent ids, a top-k vocabulary, document groups (each subset against the oracle with the full
corpus's GbarHead), a pass 2 killed and resumed (bit for bit), the file, products, parts, and a
file built before QbarHead existed (loads; ``has`` says so; reading it is one line)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

from pythia_probe.errors import BadInputError
from pythia_probe.stats import CorpusStats, batch_stats, native
from pythia_probe.stats import driver as run
from pythia_probe.stats.checkpoint import write_atomic
from pythia_probe.stats.pass1 import Windows
from pythia_probe.stats.reference import reference_q_given, reference_stats_ragged
from pythia_probe.stats.sequences import SequencePolicy, Sequencer
from pythia_probe.stats.sparse import second
from pythia_probe.testing.shards import IdShard, encode_ids

ENGINES = ("dense", "sparse")
RTOL = 1e-10


def ragged(seed: int, V: int = 13, N: int = 9, T: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Windows [N, T+1] of ids drawn from part of 0..V-1 (absent ids), lengths 2..T+1."""
    g = torch.Generator().manual_seed(seed)
    used = torch.randperm(V, generator=g)[: V - 3]
    tokens = used[torch.randint(0, used.numel(), (N, T + 1), generator=g)]
    lengths = torch.randint(2, T + 2, (N,), generator=g)
    return tokens, lengths


def seqs_of(tokens: torch.Tensor, lengths: torch.Tensor) -> list[torch.Tensor]:
    return [tokens[i, : int(n)] for i, n in enumerate(lengths)]


def scales(ref: dict) -> dict[str, float]:
    """Natural magnitudes (each factor floored at one count over the positions)."""
    u = 1.0 / ref["positions"]
    V = ref["Bbar"].shape[0]
    b = max(float(ref["Bbar"].abs().max()), u)
    p = max(float(ref["Phibar"].abs().max()), u)
    gh = max(float(ref["GbarHead"].abs().max()), u ** 3)
    return {"GbarHead": V * V * b * b * p, "QbarHead": 2 * gh}


def close(a: torch.Tensor, b: torch.Tensor, scale: float) -> None:
    torch.testing.assert_close(a, b, rtol=0, atol=RTOL * scale + 1e-300)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_qbar_head_equals_the_literal_reference(engine, seed):
    tokens, lengths = ragged(seed)
    st = batch_stats(tokens, 13, lengths=lengths, engine=engine)
    ref = reference_stats_ragged(seqs_of(tokens, lengths), 13)
    sc = scales(ref)
    assert st.has("QbarHead") and st.has("GbarHead")
    for name in ("GbarHead", "QbarHead"):
        close(st[name], ref[name], sc[name])
    rows, cols = [4, 1, 4], [0, 12, 3, 5]  # the by-rows path (fewer rows than columns), repeats
    close(st.block("GbarHead", rows, cols), ref["GbarHead"][rows][:, cols], sc["GbarHead"])
    close(st.GbarHead.sum(0), torch.zeros(13, dtype=torch.float64), sc["GbarHead"])
    assert not torch.allclose(st.QbarHead, st.Qbar)  # another target than the mean's
    X = torch.randn(13, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    for name in ("GbarHead", "QbarHead"):
        close(st.mul(name, X), ref[name] @ X, sc[name] * 13)
        close(st.tmul(name, X), X.T @ ref[name], sc[name] * 13)
    dense = st.parts()["QbarHead"].toarray()
    assert np.array_equal(dense, st.QbarHead.numpy())


@pytest.mark.parametrize("engine", ENGINES)
def test_top_k_slices_the_full_qbar_head(engine):
    tokens, lengths = ragged(4, V=15, N=11)
    st = batch_stats(tokens, 15, lengths=lengths, top_k=6, engine=engine)
    ref = reference_stats_ragged(seqs_of(tokens, lengths), 15)
    ids = st.token_ids
    sc = scales(ref)
    for name in ("GbarHead", "QbarHead"):
        close(st[name], ref[name][ids][:, ids], sc[name])


def test_engines_agree_through_the_file(tmp_path):
    tokens, lengths = ragged(5)
    a = batch_stats(tokens, 13, lengths=lengths, engine="dense", groups=3)
    b = batch_stats(tokens, 13, lengths=lengths, engine="sparse", groups=3)
    sc = scales(reference_stats_ragged(seqs_of(tokens, lengths), 13))
    for st in (a, b):
        loaded = CorpusStats.load(st.save(tmp_path / f"{st.meta['engine']['resolved']}.st"
                                          ".safetensors"))
        assert torch.equal(loaded.QbarHead, st.QbarHead)
        for g in ([0], [1, 2]):
            assert torch.equal(loaded.subset(g).QbarHead, st.subset(g).QbarHead)
    close(a.QbarHead, b.QbarHead, sc["QbarHead"])
    close(a.subset([1]).QbarHead, b.subset([1]).QbarHead, sc["QbarHead"])


def test_gbar_head_tiles_in_c_equal_their_scipy_twins(tmp_path):
    """GbarHead's tiles: the C kernels (sc_spgemm_dense, sc_spmm reading X transposed) against
    scipy on the same factors, and against the literal reference."""
    tokens, lengths = ragged(7, V=17, N=12)
    st = batch_stats(tokens, 17, lengths=lengths, engine="sparse")
    f = st.store.factors
    cols = np.array([0, 3, 4, 9, 16])
    with native.use_backend("c"):
        c = (f.head_rows(cols), f.gbar_head_tile(cols))
    f = CorpusStats.load(st.save(tmp_path / "s.safetensors")).store.factors  # nothing cached
    with native.use_backend("torch"):
        twin = (f.head_rows(cols), f.gbar_head_tile(cols))
    ref = reference_stats_ragged(seqs_of(tokens, lengths), 17)
    for a, b in zip(c, twin, strict=True):
        close(torch.from_numpy(a), torch.from_numpy(b), float(np.abs(b).max()))
    close(torch.from_numpy(c[1]), ref["GbarHead"][:, cols].T, scales(ref)["GbarHead"])
    assert np.array_equal(f.w_rows[0], np.searchsorted(
        np.sort(f.context.arrays()[0] % 17), np.arange(18)))  # W by target rows


V, T, G = 11, 6, 3


def documents(n: int = 30, seed: int = 0) -> list[str]:
    g = torch.Generator().manual_seed(seed)
    return [" ".join(map(str, torch.randint(0, V, (int(torch.randint(3, 12, (1,),
                                                                      generator=g)),),
                                            generator=g).tolist())) for _ in range(n)]


def shards_of(docs: list[str], n: int) -> list[IdShard]:
    step = -(-len(docs) // n)
    return [IdShard(f"s{i}", tuple(docs[i * step:(i + 1) * step])) for i in range(n)]


def spec(work: Path, engine: str, **kw) -> run.RunSpec:
    return run.RunSpec(V, SequencePolicy(T), encode_ids, {"test": 1}, work, progress=False,
                       engine=engine, groups=G, batch_size=3, **kw)


def windows(docs: list[str]) -> list[torch.Tensor]:
    return [torch.tensor(w) for w in Sequencer(SequencePolicy(T), V).windows(encode_ids(docs))]


def kill_in_pass_2(monkeypatch, engine: str, at: int) -> None:
    """Raise at the ``at``-th unit of pass-2 work: a shard (dense) or a tile sweep (sparse)."""
    cls, name = (Windows, "load") if engine == "dense" else (second.Sweep, "first")
    real, calls = getattr(cls, name), []

    def dying(*a, **k):
        calls.append(1)
        if len(calls) == at:
            raise KeyboardInterrupt("killed in pass 2")
        return real(*a, **k)

    monkeypatch.setattr(cls, name, dying)


@pytest.mark.parametrize("engine", ENGINES)
def test_groups_and_a_pass_2_killed_and_resumed(tmp_path, monkeypatch, engine):
    """Four shards, pass 2 killed after some work and resumed: every statistic bit for bit a
    clean run's; the totals and each subset's QbarHead equal the literal reference with the
    full corpus's GbarHead."""
    monkeypatch.setattr(second, "CHECKPOINT_SECONDS", 0.0)
    docs = documents()
    kw = {"budget_bytes": 1} if engine == "sparse" else {}  # several tiles to resume between
    clean = run.compute_stats(shards_of(docs, 4), spec(tmp_path / "c", engine, **kw), {})
    # dense: the groups read the 4 caches, then pass 2 dies at its third; sparse: its fourth tile
    kill_in_pass_2(monkeypatch, engine, 4 + 3 if engine == "dense" else 3 * 2 * G + 1)
    with pytest.raises(KeyboardInterrupt):
        run.compute_stats(shards_of(docs, 4), spec(tmp_path / "r", engine, **kw), {})
    monkeypatch.undo()
    assert list((tmp_path / "r").glob("pass2-*.safetensors"))  # a checkpoint to resume from
    st = run.compute_stats(shards_of(docs, 4), spec(tmp_path / "r", engine, **kw), {})
    for name in ("Qbar", "QbarHead", "Delta"):
        assert torch.equal(st[name], clean[name]), name
    ref = reference_q_given(windows(docs), V, st.GbarHead)
    scale = 2 * float(st.GbarHead.abs().max())
    close(st.QbarHead, ref["Qbar"], scale)
    for which in ([0], [1, 2]):
        mine = [d for i, d in enumerate(docs) if i % G in which]
        ref = reference_q_given(windows(mine), V, st.GbarHead)
        close(st.subset(which).QbarHead, ref["Qbar"], scale)
        assert torch.equal(st.subset(which).QbarHead, clean.subset(which).QbarHead)


def test_a_file_built_before_qbar_head_loads_and_says_so(tmp_path):
    tokens, lengths = ragged(6)
    st = batch_stats(tokens, 13, lengths=lengths, groups=2)
    path = st.save(tmp_path / "new.safetensors")
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys() if "qbar_head" not in k}
    old = write_atomic(tmp_path / "old.safetensors", tensors, meta)
    loaded = CorpusStats.load(old, verify=False)
    assert not loaded.has("QbarHead") and loaded.has("Qbar") and loaded.has("GbarHead")
    assert not loaded.has("Nonsense")
    assert torch.equal(loaded.Qbar, st.Qbar) and torch.equal(loaded.GbarHead, st.GbarHead)
    assert "QbarHead" not in loaded.parts()
    for read in (lambda s: s.block("QbarHead"), lambda s: s.mul("QbarHead", torch.ones(13, 1)),
                 lambda s: s.tmul("QbarHead", torch.ones(13, 1)),
                 lambda s: s.subset([0]).QbarHead):
        with pytest.raises(BadInputError, match="hold no QbarHead.*rebuild") as e:
            read(loaded)
        assert "\n" not in str(e.value)
