"""Today's statistics equal the frozen baseline (issue 17: the restructuring changes no number).

tests/data/stats_baseline.safetensors was written by tests/data/make_stats_baseline.py with the
code before stats/ was restructured (commit 4d5c57e), for both engines: random ragged windows
with absent ids (full vocabulary and top-12), the built-in corpus with the word tokenizer
(d_vocab 401, full and top-20, several shards) and id shards killed in pass 1 and resumed.
Here every case is recomputed with the current code.

Promise and tolerance: pass-1 counts (token counts, bigram counts, both fixed-point limbs of
the context weights) and Bbar, Phibar bit for bit; SigmaB, PhiBT, Gbar, Qbar and Delta within
1e-12 x the largest entry of the frozen tensor (float64 rounding: the two engines differ by
<= 3.3e-15 of it on these cases).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from data.baseline_inputs import id_shards, random_tokens
from safetensors import safe_open

from pythia_probe.stats import (
    CountAccumulator,
    SequencePolicy,
    SparseCountAccumulator,
    batch_stats,
    checkpoint,
    compute_stats,
)
from pythia_probe.stats.driver import RunSpec
from pythia_probe.stats.job import StatsConfig, compute
from pythia_probe.testing.counts import as_dense
from pythia_probe.testing.shards import encode_ids

BASELINE = Path(__file__).parent / "data" / "stats_baseline.safetensors"
EXACT = ("Bbar", "Phibar")
FLOAT = ("SigmaB", "PhiBT", "Gbar", "Qbar", "Delta")
RTOL = 1e-12
ENGINES = ("dense", "sparse")

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def base():
    with safe_open(str(BASELINE), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        digests = json.loads(f.metadata()["sha256"])
    return tensors, digests


def sha(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()


def close(new: torch.Tensor, old: torch.Tensor, what: str) -> None:
    assert new.shape == old.shape, what
    scale = float(old.abs().max())
    err = float((new.double() - old).abs().max())
    assert err <= RTOL * scale, f"{what}: {err:.3g} > {RTOL} x {scale:.3g}"


# -- the current code, one adapter per kind of case -------------------------------------------
def dense_state(acc: CountAccumulator) -> dict[str, torch.Tensor]:
    return acc.state()[0]


def pass1_of_batch(engine: str, tokens, lengths, V: int) -> dict[str, torch.Tensor]:
    T = tokens.shape[1] - 1
    if engine == "dense":
        return dense_state(CountAccumulator(V, T).update(tokens, lengths))
    return dense_state(as_dense(SparseCountAccumulator(V, T).update(tokens, lengths)))


def stats_of_batch(engine: str, tokens, lengths, V: int, top_k):
    return batch_stats(tokens, V, lengths=lengths, top_k=top_k, engine=engine)


def pass1_of_work(work: Path) -> dict[str, torch.Tensor]:
    tensors, meta = checkpoint.load_state(work / "pass1-rank0-of1.safetensors")
    if meta["state"]["kind"] == "count":
        return tensors
    return dense_state(as_dense(SparseCountAccumulator.from_state(tensors, meta["state"])))


def builtin(engine: str, top_k, tmp: Path):
    out = tmp / f"b-{engine}-{top_k}.safetensors"
    cfg = StatsConfig(dataset="builtin", stories=40, stories_per_shard=15, seq_len=16,
                      mode="packed", tokenizer="word:3000", top_k=top_k, engine=engine,
                      out=str(out), progress=False, keep_work=True)
    return compute(cfg), pass1_of_work(Path(str(out) + ".work"))


def resumed(engine: str, tmp: Path):
    spec = RunSpec(23, SequencePolicy(6, short="keep"), encode_ids, {"case": "resume"},
                   tmp / engine, batch_size=4, progress=False, engine=engine)
    with pytest.raises(KeyboardInterrupt):
        compute_stats(id_shards(fail=3), spec, {})
    return compute_stats(id_shards(), spec, {}), pass1_of_work(tmp / engine)


# -- the comparisons ----------------------------------------------------------------------------
def check_all(key: str, stats, pass1: dict, base) -> None:
    tensors, _ = base
    assert torch.equal(stats.token_ids, tensors[f"{key}.token_ids"]), key
    for n, v in pass1.items():
        assert torch.equal(v, tensors[f"{key}.pass1.{n}"]), f"{key} pass 1 {n}"
    for n in EXACT:
        assert torch.equal(stats[n], tensors[f"{key}.{n}"]), f"{key} {n}"
    for n in FLOAT:
        close(stats[n], tensors[f"{key}.{n}"], f"{key} {n}")


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("top_k", [None, 12])
def test_random_windows_with_absent_ids(engine, top_k, base):
    tokens, lengths = random_tokens()
    key = f"random.{engine}.{'full' if top_k is None else f'top{top_k}'}"
    stats = stats_of_batch(engine, tokens, lengths, 37, top_k)
    check_all(key, stats, pass1_of_batch(engine, tokens, lengths, 37), base)


@pytest.mark.parametrize("engine", ENGINES)
def test_shards_killed_in_pass1_and_resumed(engine, base, tmp_path):
    stats, pass1 = resumed(engine, tmp_path)
    check_all(f"resume.{engine}.full", stats, pass1, base)


@pytest.mark.parametrize("engine", ENGINES)
def test_builtin_corpus_top_k(engine, base, tmp_path):
    tensors, digests = base
    key = f"builtin.{engine}.top20"
    stats, pass1 = builtin(engine, 20, tmp_path)
    for n, v in pass1.items():
        assert sha(v) == digests[f"{key}.pass1.{n}"], n
    assert torch.equal(stats.token_ids, tensors[f"{key}.token_ids"])
    for n in EXACT:
        assert torch.equal(stats[n], tensors[f"{key}.{n}"]), n
    for n in FLOAT:
        close(stats[n], tensors[f"{key}.{n}"], f"{key} {n}")


@pytest.mark.parametrize("engine", ENGINES)
def test_builtin_corpus_full_vocabulary(engine, base, tmp_path):
    tensors, digests = base
    key = f"builtin.{engine}.full"
    stats, pass1 = builtin(engine, None, tmp_path)
    for n, v in pass1.items():
        assert sha(v) == digests[f"{key}.pass1.{n}"], n
    for n in EXACT:
        assert sha(stats[n]) == digests[f"{key}.{n}"], n
    close(stats.Delta, tensors[f"{key}.Delta"], f"{key} Delta")
    idx = tensors[f"{key}.sample_index"]
    for n in ("SigmaB", "PhiBT", "Gbar", "Qbar"):
        M = stats[n]
        close(M[idx[0], idx[1]], tensors[f"{key}.sample.{n}"], f"{key} {n}")
        fro = float(tensors[f"{key}.fro.{n}"])
        assert abs(float(torch.linalg.norm(M)) - fro) <= RTOL * fro, n
