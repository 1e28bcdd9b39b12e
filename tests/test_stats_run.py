"""Shard driver: sequence policy, kill-and-resume, several processes, CLI, planted relations."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pythia_probe.stats import CorpusStats, batch_stats
from pythia_probe.stats import driver as run
from pythia_probe.stats.pass1 import Windows
from pythia_probe.stats.sequences import SequencePolicy, Sequencer, batches
from pythia_probe.testing.dist import stats_in_processes
from pythia_probe.testing.shards import IdShard, encode_ids

NAMES = ("Bbar", "Phibar", "SigmaB", "PhiBT", "Gbar", "Qbar", "Delta")


FakeShard, encode = IdShard, encode_ids


def make_shards(n_shards: int = 5, docs: int = 6, V: int = 11, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    shards = []
    for s in range(n_shards):
        texts = []
        for _ in range(docs):
            n = int(torch.randint(3, 14, (1,), generator=g))
            texts.append(" ".join(map(str, torch.randint(0, V, (n,), generator=g).tolist())))
        shards.append(FakeShard(f"shard{s}", tuple(texts)))
    return shards


def spec(tmp: Path, V: int = 11, T: int = 6, **kw) -> run.RunSpec:
    policy = kw.pop("policy", SequencePolicy(T))
    return run.RunSpec(V, policy, encode, {"test": 1}, tmp, progress=False, batch_size=3, **kw)


def tensors(stats: CorpusStats) -> dict[str, torch.Tensor]:
    return {n: stats[n] for n in NAMES}


def test_driver_equals_batch_stats_on_the_same_windows(tmp_path):
    shards = make_shards()
    stats = run.compute_stats(shards, spec(tmp_path), {})
    seq = Sequencer(SequencePolicy(6), 11)
    rows = [w for s in shards for w in seq.windows(encode(s.documents()))]
    tokens = torch.tensor(rows)
    ref = batch_stats(tokens, 11)
    for n in NAMES:
        torch.testing.assert_close(stats[n], ref[n], rtol=1e-12, atol=1e-15)
    skipped = sum(e["skipped"].get("docs_short", 0) for e in stats.meta["ledger"])
    assert stats.meta["counts"]["docs"] == 30 and len(rows) + skipped == 30
    assert stats.meta["counts"]["docs_short"] == skipped > 0


@settings(max_examples=8, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 6), st.integers(1, 5))
def test_any_shard_split_and_batch_size_gives_identical_counts(tmp_path_factory, seed, k, bs):
    docs = [t for s in make_shards(3, 5, seed=seed) for t in s.texts]
    cuts = sorted(torch.randperm(len(docs) - 1, generator=torch.Generator().manual_seed(seed))
                  [: k - 1].add(1).tolist())
    edges = [0, *cuts, len(docs)]
    shards = [FakeShard(f"p{i}", tuple(docs[a:b]))
              for i, (a, b) in enumerate(zip(edges, edges[1:], strict=False))]
    work = tmp_path_factory.mktemp("split")
    got = run.compute_stats(shards, run.RunSpec(11, SequencePolicy(6), encode, {}, work,
                                                batch_size=bs, progress=False), {})
    seq = Sequencer(SequencePolicy(6), 11)
    ref = batch_stats(torch.tensor(list(seq.windows(encode(docs)))), 11)
    for n in ("Bbar", "Phibar", "SigmaB", "Gbar"):  # integer state underneath: bit identical
        assert torch.equal(got[n], ref[n]), n
    for n in ("Qbar", "Delta", "PhiBT"):
        torch.testing.assert_close(got[n], ref[n], rtol=1e-12, atol=1e-18)


def test_kill_between_shards_and_resume_is_bit_identical(tmp_path):
    shards = make_shards()
    clean = run.compute_stats(shards, spec(tmp_path / "clean"), {})
    broken = list(shards)
    broken[3] = FakeShard(shards[3].name, shards[3].texts, fail=True)
    with pytest.raises(KeyboardInterrupt):
        run.compute_stats(broken, spec(tmp_path / "resumed"), {})
    resumed = run.compute_stats(shards, spec(tmp_path / "resumed"), {})
    names = [e["shard"] for e in resumed.meta["ledger"]]
    assert names == [s.name for s in shards]  # each shard exactly once
    assert resumed.stats_id == clean.stats_id
    for n in NAMES:
        assert torch.equal(resumed[n], clean[n]), n


def test_kill_in_second_pass_and_resume_is_bit_identical(tmp_path, monkeypatch):
    shards = make_shards()
    clean = run.compute_stats(shards, spec(tmp_path / "clean"), {})
    real, calls = Windows.load, []

    def dying(*a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt("killed in pass 2")
        return real(*a, **k)

    monkeypatch.setattr(Windows, "load", dying)
    with pytest.raises(KeyboardInterrupt):
        run.compute_stats(shards, spec(tmp_path / "r"), {})
    monkeypatch.setattr(Windows, "load", real)
    resumed = run.compute_stats(shards, spec(tmp_path / "r"), {})
    for n in NAMES:
        assert torch.equal(resumed[n], clean[n]), n


def test_resume_refuses_another_configuration(tmp_path):
    from pythia_probe.errors import MismatchError

    run.compute_stats(make_shards(), spec(tmp_path), {})
    other = run.RunSpec(11, SequencePolicy(6), encode, {"test": 2}, tmp_path, progress=False)
    with pytest.raises(MismatchError, match="another run: test was 1, now 2"):
        run.compute_stats(make_shards(), other, {})


def test_docs_limit_and_empty_shards(tmp_path):
    shards = [FakeShard("empty", ()), *make_shards(3)]
    stats = run.compute_stats(shards, spec(tmp_path, max_docs=8), {})
    led = {e["shard"]: e for e in stats.meta["ledger"]}
    assert led["empty"]["skipped"]["empty_shard"] == 1
    assert stats.meta["counts"]["docs"] == 8 and "shard2" not in led
    assert led["shard1"]["docs"] == 2


def test_sequence_policy_packed_keep_short_and_oov():
    p = SequencePolicy(3, mode="packed", eos=9)
    seq = Sequencer(p, 10)
    out = list(seq.windows([[1, 2, 3], [4, 5], [], [1, 12], [6]]))
    assert out == [[1, 2, 3, 9], [4, 5, 9, 6]] and seq.skipped == {
        "docs_empty": 1, "docs_oov": 1, "packed_remainder": 1}
    keep = Sequencer(SequencePolicy(3, short="keep"), 10)
    assert list(keep.windows([[1], [1, 2], [1, 2, 3, 4, 5]])) == [[1, 2], [1, 2, 3, 4]]
    assert keep.skipped == {"docs_short": 1}
    tokens, lengths = next(batches([[1, 2], [1, 2, 3, 4]], 3, 8))
    assert tokens.tolist() == [[1, 2, 0, 0], [1, 2, 3, 4]] and lengths.tolist() == [2, 4]
    with pytest.raises(ValueError, match="outside the vocabulary"):
        list(Sequencer(SequencePolicy(3, oov="error"), 10).windows([[1, 10]]))
    with pytest.raises(ValueError, match="mode must be one of"):
        SequencePolicy(3, mode="sliding")


def _job(work: str):
    return make_shards(), spec(Path(work), max_docs=25)


def test_two_processes_equal_one(tmp_path):
    single = run.compute_stats(make_shards(), spec(tmp_path / "one", max_docs=25), {})
    out = tmp_path / "two.safetensors"
    stats_in_processes(partial(_job, str(tmp_path / "two")), out)
    two = CorpusStats.load(out)
    assert two.meta["ledger"] == single.meta["ledger"] and two.stats_id == single.stats_id
    for n in ("Bbar", "Phibar", "SigmaB", "Gbar"):  # exact integer counts underneath
        assert torch.equal(two[n], single[n]), n
    for n in ("Qbar", "Delta", "PhiBT"):
        torch.testing.assert_close(two[n], single[n], rtol=1e-12, atol=1e-18)
