"""Freeze the statistics engines' outputs (issue 17: before stats/ was restructured).

Run once, with the code of commit 4d5c57e (the flat stats/ layout, both engines):

    python tests/data/make_stats_baseline.py

It writes tests/data/stats_baseline.safetensors: for every case below and each engine, the
pass-1 counts (token counts, bigram counts, the two fixed-point limbs of the context weights,
all int64, dense V x V layout) and the seven statistics (float64). tests/test_stats_baseline.py
recomputes every case with the current code and compares: pass 1, Bbar and Phibar bit for bit,
the rest to float64 rounding. The inputs are deterministic (seeded generators, the built-in
corpus), so this script documents exactly what was frozen; it uses the old module layout and is
not expected to run against later code.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from pythia_probe.stats.accumulate import CountAccumulator
from safetensors.torch import save_file

from pythia_probe.stats import batch_stats, checkpoint, run, sparse_run
from pythia_probe.stats.job import StatsConfig, compute
from pythia_probe.stats.sequences import SequencePolicy
from pythia_probe.stats.sparse import SparseCountAccumulator
from pythia_probe.testing.shards import encode_ids

sys.path.insert(0, str(Path(__file__).parent))
from baseline_inputs import id_shards, random_tokens  # noqa: E402

OUT = Path(__file__).with_name("stats_baseline.safetensors")
NAMES = ("Bbar", "Phibar", "SigmaB", "PhiBT", "Gbar", "Qbar", "Delta")


def dense_pass1(acc: CountAccumulator) -> dict[str, torch.Tensor]:
    t, _ = acc.state()
    return {k: v.clone() for k, v in t.items()}


def pass1_of_checkpoint(path: Path) -> dict[str, torch.Tensor]:
    tensors, meta = checkpoint.load_state(path)
    state = meta["state"]
    if state["kind"] == "count":
        return {k: tensors[k].clone() for k in ("token_counts", "bigram", "context_hi",
                                                "context_lo")}
    return dense_pass1(SparseCountAccumulator.from_state(tensors, state).to_dense())


def sha(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()


def put(store: dict, key: str, stats, pass1: dict[str, torch.Tensor],
        digests: dict | None = None, full: bool = True) -> None:
    """Every tensor of a case; with ``digests`` (the builtin corpus, d_vocab 401) pass 1 as
    sha256 digests, and at full vocabulary (``full``) Bbar and Phibar too and the float
    statistics as 4,096 sampled entries with their Frobenius norm."""
    store[f"{key}.token_ids"] = stats.token_ids.contiguous()
    for n, v in pass1.items():
        if digests is None:
            store[f"{key}.pass1.{n}"] = v.contiguous()
        else:
            digests[f"{key}.pass1.{n}"] = sha(v)
    if digests is None or not full:
        for n in NAMES:
            store[f"{key}.{n}"] = stats[n].detach().cpu().contiguous()
        return
    for n in ("Bbar", "Phibar"):
        digests[f"{key}.{n}"] = sha(stats[n])
    store[f"{key}.Delta"] = stats.Delta.contiguous()
    V = stats.d_vocab
    g = torch.Generator().manual_seed(11)
    idx = torch.randint(0, V, (2, 4096), generator=g)
    store[f"{key}.sample_index"] = idx
    for n in ("SigmaB", "PhiBT", "Gbar", "Qbar"):
        store[f"{key}.sample.{n}"] = stats[n][idx[0], idx[1]].contiguous()
        store[f"{key}.fro.{n}"] = torch.linalg.norm(stats[n]).reshape(1)


def batch_cases(store: dict) -> None:
    tokens, lengths = random_tokens()
    V, T = 37, 9
    for top_k in (None, 12):
        tag = "full" if top_k is None else f"top{top_k}"
        dense = batch_stats(tokens, V, lengths=lengths, top_k=top_k)
        p1 = dense_pass1(CountAccumulator(V, T).update(tokens, lengths))
        put(store, f"random.dense.{tag}", dense, p1)
        sparse = sparse_run.batch_stats(tokens, V, lengths=lengths, top_k=top_k)
        p1s = dense_pass1(SparseCountAccumulator(V, T).update(tokens, lengths).to_dense())
        put(store, f"random.sparse.{tag}", sparse, p1s)


def builtin_cases(store: dict, tmp: Path, digests: dict) -> None:
    for engine in ("dense", "sparse"):
        for top_k in (None, 20):
            tag = "full" if top_k is None else f"top{top_k}"
            out = tmp / f"builtin-{engine}-{tag}.safetensors"
            cfg = StatsConfig(dataset="builtin", stories=40, stories_per_shard=15, seq_len=16,
                              mode="packed", tokenizer="word:3000", top_k=top_k, engine=engine,
                              out=str(out), progress=False, keep_work=True)
            stats = compute(cfg)
            assert stats.d_vocab == (401 if top_k is None else top_k)
            p1 = pass1_of_checkpoint(Path(str(out) + ".work") / "pass1-rank0-of1.safetensors")
            put(store, f"builtin.{engine}.{tag}", stats, p1, digests, full=top_k is None)


def resume_cases(store: dict, tmp: Path) -> None:
    V, T = 23, 6
    for engine in ("dense", "sparse"):
        work = tmp / f"resume-{engine}"
        spec = run.RunSpec(V, SequencePolicy(T, short="keep"), encode_ids, {"case": "resume"},
                           work, batch_size=4, progress=False, engine=engine)
        try:
            run.compute_stats(id_shards(fail=3), spec, {})
            raise SystemExit("the killed run did not stop")
        except KeyboardInterrupt:
            pass
        resumed = run.compute_stats(id_shards(), spec, {})
        clean = run.compute_stats(id_shards(), run.RunSpec(
            V, SequencePolicy(T, short="keep"), encode_ids, {"case": "resume"},
            tmp / f"clean-{engine}", batch_size=4, progress=False, engine=engine), {})
        for n in NAMES:
            assert torch.equal(resumed[n], clean[n]), (engine, n)
        p1 = pass1_of_checkpoint(work / "pass1-rank0-of1.safetensors")
        put(store, f"resume.{engine}.full", resumed, p1)


def main() -> None:
    torch.set_num_threads(1)
    store: dict[str, torch.Tensor] = {}
    digests: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as d:
        batch_cases(store)
        builtin_cases(store, Path(d), digests)
        resume_cases(store, Path(d))
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip()
    meta = {"commit": commit, "torch": torch.__version__, "python": sys.version.split()[0]}
    save_file(store, str(OUT), {"baseline": json.dumps(meta), "sha256": json.dumps(digests)})
    print(f"wrote {OUT} ({OUT.stat().st_size:,} bytes, {len(store)} tensors)")


if __name__ == "__main__":
    main()
