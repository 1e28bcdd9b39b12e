"""The sparse engine at the full vocabulary vs the top-5,000 setting, and vs the dense engine:
peak memory, throughput and file size, measured in the same run.

(a) The paper's Pythia setting: d_vocab 50,277, T = 128, a synthetic Zipf token stream of
    --docs documents x 129 tokens (default 100,000: the paper's recipe; exponent 1.08: 787 such
    documents hold ~15,300 distinct ids, as 787 OpenWebText documents hold 15,281). The sparse
    engine end to end at the full vocabulary (factored statistics: targets peak host memory
    <= 12 GB, time <= the top-5,000 run's, the file a small fraction of the 3 V x V float64
    outputs, 61 GB, that dense statistics take) and at top-K = 5,000 (the authors'
    find_top_tokens default, and the baseline), both with --groups G document groups (default
    10, as ``stats compute``: then through ``batch_stats``, one phase; --groups 0: phase by
    phase through the engine interface). The dense engine's plan is printed (it cannot run on
    this machine).
(c) With --driver instead of (a): the full vocabulary as ``stats compute`` runs it: 20 shards of
    ids through the driver, with token caches and pass-1 / pass-2 checkpoints in a work folder,
    with --groups G document groups (default 10, as the command) and, unless
    --no-compare-groups, without groups in the same run (the baseline).
(b) With --dense: at the largest vocabulary where the dense engine fits this machine
    (plan.dense_peak within the --engine auto budget, in multiples of 1,024; or --dense-vocab),
    both engines over the same Zipf stream (--docs-b documents), same K: tokens/s end to end
    and per phase, the ratio sparse / dense (target >= 1), and the two results compared (Bbar
    and Phibar bit for bit, the rest relative to each statistic's largest entry).

Each measurement runs in its own child process; its peak resident memory is the kernel's
high-water mark VmHWM (/proc/self/status; ru_maxrss is inherited across fork and exec on
Linux, so a child would report the parent's peak). Both engines run with --threads torch
threads (the sparse SpMM uses as many). Rates are tokens per wall-clock second and per CPU
second of the child (every thread counted). This VM backs memory lazily: touching memory the
guest has not used lately costs ~1-2 s/GB (freed pages go back to the host after a while),
later touches ~0.08 s/GB. Both engines pay that in proportion to the memory they touch; the
parent first touches --warm-gb and frees it, which spares mostly the first child.

  nice -n 10 python benchmarks/bench_stats_sparse.py [--docs 100000] [--groups 0] [--dense]
  nice -n 10 python benchmarks/bench_stats_sparse.py --driver [--no-compare-groups] [--docs N]
  python benchmarks/bench_stats_sparse.py --quick      # 5,000 documents, small (b)
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from pythia_probe.cli import parse_configs, run_main
from pythia_probe.errors import BadInputError
from pythia_probe.planner import statistics as plan
from pythia_probe.ranks import Ranks
from pythia_probe.stats import CorpusStats, SequencePolicy, top_k_ids
from pythia_probe.stats.driver import ENGINES, RunSpec, batch_stats, compute_stats
from pythia_probe.stats.groups import DEFAULT_GROUPS
from pythia_probe.stats.pass1 import Windows
from pythia_probe.testing.shards import IdShard, encode_ids

PYTHIA_VOCAB, T, K, ZIPF, BATCH = 50277, 128, 5000, 1.08, 256
GB = 1e9


def zipf_tokens(n_docs: int, d_vocab: int, seed: int = 0) -> torch.Tensor:
    """[n_docs, T+1] ids drawn i.i.d. from Zipf(ZIPF) over d_vocab ids (ranks shuffled)."""
    rank = np.arange(1, d_vocab + 1, dtype=np.float64)
    p = rank ** -ZIPF
    rng = np.random.default_rng(seed)
    ids = rng.permutation(d_vocab)[rng.choice(d_vocab, size=n_docs * (T + 1), p=p / p.sum())]
    return torch.from_numpy(ids.astype(np.int64)).view(n_docs, T + 1)


class Clock:
    """Wall and CPU seconds per named phase."""

    def __init__(self) -> None:
        self.phases: dict[str, tuple[float, float]] = {}
        self._t = (time.perf_counter(), time.process_time())

    def lap(self, name: str) -> None:
        now = (time.perf_counter(), time.process_time())
        self.phases[name] = (now[0] - self._t[0], now[1] - self._t[1])
        self._t = now


def run_engine(name: str, tokens: torch.Tensor, d_vocab: int, k: int | None,
               clock: Clock, groups: int = 0) -> tuple:
    """Both passes with engine ``name`` through the engine interface, phase by phase (with
    ``groups``: through batch_stats, one phase)."""
    if groups:
        stats = batch_stats(tokens, d_vocab, top_k=k, engine=name, groups=groups)
        clock.lap(f"both passes, {groups} groups (batch_stats)")
        f = stats.store.factors
        return stats, {"context_pairs": len(f.context), "bigrams": f.bigram_keys.size}
    eng = ENGINES[name]
    acc = eng.counter(d_vocab, T, "cpu")
    for i in range(0, tokens.shape[0], BATCH):
        acc.update(tokens[i:i + BATCH])
    info = {}
    if name == "sparse":
        acc.flush()
        info = {"context_pairs": len(acc.context), "bigrams": len(acc.bigram),
                "pass1_bytes": acc.nbytes, "tile_width": plan.tile_width(d_vocab)}
    clock.lap("pass 1")
    spec = RunSpec(d_vocab, SequencePolicy(T), None, {}, None, top_k=k, batch_size=BATCH,
                   progress=False, engine=name)
    d = Ranks(device="cpu")
    fp = eng.first_pass(acc, spec, d)
    ids = None if k is None else top_k_ids(fp.token_counts, k)
    clock.lap("first pass" + (" (V^3 compositions)" if name == "dense" else ""))
    Q, D, _ = eng.second_pass(fp, Windows.of_batch(tokens, None), ids, spec, d)
    clock.lap("pass 2" + (" (Gbar tiles)" if name == "sparse" else ""))
    stats = eng.assemble(fp, Q, D, {"T": T, "policy": {"kind": "bench"}}, ids, spec)
    clock.lap("outputs")
    return stats, info


def run_driver(tokens: torch.Tensor, d_vocab: int, k: int | None, clock: Clock,
               work: str, groups: int = 0) -> tuple:
    """The command's path: id shards (20 of them) through compute_stats with a work folder
    (token caches, pass-1 and pass-2 checkpoints), the sparse engine."""
    texts = [" ".join(map(str, row)) for row in tokens.tolist()]
    step = -(-len(texts) // 20)
    shards = [IdShard(f"zipf{i}", tuple(texts[i * step:(i + 1) * step])) for i in range(20)]
    clock.lap("shards")
    spec = RunSpec(d_vocab, SequencePolicy(T), encode_ids, {"bench": 1}, Path(work), top_k=k,
                   batch_size=BATCH, progress=False, engine="sparse", groups=groups)
    stats = compute_stats(shards, spec, {})
    clock.lap("compute_stats (both passes, checkpoints)")
    f = stats.store.factors
    return stats, {"context_pairs": len(f.context), "bigrams": f.bigram_keys.size}


def child(spec: dict) -> None:
    """One measurement; prints one JSON line (phases, peak RSS) and saves the statistics."""
    torch.set_num_threads(spec["threads"])
    tokens = zipf_tokens(spec["docs"], spec["d_vocab"], spec["seed"])
    clock = Clock()
    if spec.get("work"):
        stats, info = run_driver(tokens, spec["d_vocab"], spec["k"], clock, spec["work"],
                                 spec.get("groups", 0))
    else:
        stats, info = run_engine(spec["engine"], tokens, spec["d_vocab"], spec["k"], clock,
                                 spec.get("groups", 0))
    if spec.get("out"):
        stats.save(spec["out"])
        clock.lap("save")
        info["file_bytes"] = Path(spec["out"]).stat().st_size
    info["qbar_pairs"] = getattr(stats.store, "qbar", None) and stats.store.qbar.nnz
    parts = getattr(stats.store, "groups", [])
    info["group_pairs"] = [sum(len(g.context) for g in parts),
                           sum(g.qbar.nnz for g in parts)]
    rss = peak_rss()
    print(json.dumps({"phases": clock.phases, "rss": rss, "tokens": tokens.numel(), **info}))


def peak_rss() -> int:
    """This process's own peak resident bytes (VmHWM; ru_maxrss where /proc is missing)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def measure(tree: str | None = None, **spec) -> dict:
    """Run ``child(spec)`` in a fresh interpreter and return its JSON result; ``tree``: the
    child of another checkout of this project (its own benchmarks/bench_stats_sparse.py and
    package first on the path)."""
    script, env = Path(__file__), None
    if tree is not None:
        script = Path(tree) / "benchmarks" / Path(__file__).name
        env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve())}
    cmd = [sys.executable, str(script), "--child", json.dumps(spec)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def describe(name: str, r: dict) -> str:
    wall = sum(w for w, _ in r["phases"].values())
    cpu = sum(c for _, c in r["phases"].values())
    phases = ", ".join(f"{k} {w:.1f} s" for k, (w, _) in r["phases"].items())
    return (f"{name}: {r['tokens'] / wall:,.0f} tok/s wall ({wall:.1f} s), "
            f"{r['tokens'] / cpu:,.0f} tok/CPU-s ({cpu:.1f} CPU-s), peak RSS "
            f"{r['rss'] / GB:.2f} GB; {phases}")


def rates(r: dict, skip: tuple[str, ...] = ()) -> tuple[float, float]:
    """Tokens per wall second and per CPU second over the phases not in ``skip``."""
    phases = [v for k, v in r["phases"].items() if k not in skip]
    return r["tokens"] / sum(w for w, _ in phases), r["tokens"] / sum(c for _, c in phases)


def largest_dense_vocab(budget: float, k: int) -> int:
    """The largest multiple of 1,024 whose dense plan fits ``budget`` bytes."""
    V = 1024
    while plan.dense_peak(V + 1024, k) <= budget:
        V += 1024
    return V


def compare(a_path: Path, b_path: Path) -> str:
    """Bbar/Phibar bit for bit; max |diff| of the other statistics relative to their natural
    scale (tests/test_stats*.py: V max|Bbar|^2, V max|Bbar| max|Phibar|, V max|SigmaB|
    max|Phibar|, 2 max|Gbar| for Qbar and Delta; here over the K x K blocks)."""
    a, b = CorpusStats.load(a_path), CorpusStats.load(b_path)
    exact = all(torch.equal(a[n], b[n]) for n in ("Bbar", "Phibar"))
    m = {n: float(b[n].abs().max()) for n in ("Bbar", "Phibar", "SigmaB", "Gbar")}
    V = b.meta["full_d_vocab"]
    scale = {"SigmaB": V * m["Bbar"] ** 2, "PhiBT": V * m["Bbar"] * m["Phibar"],
             "Gbar": V * m["SigmaB"] * m["Phibar"], "Qbar": 2 * m["Gbar"], "Delta": 2 * m["Gbar"]}
    rel = {n: float((a[n] - b[n]).abs().max()) / s for n, s in scale.items()}
    own = {n: float((a[n] - b[n]).abs().max() / b[n].abs().max()) for n in ("Qbar", "Delta")}
    return (f"Bbar, Phibar bit-identical: {exact}; stats_id equal: {a.stats_id == b.stats_id}; "
            "max |diff| / natural scale: " + ", ".join(f"{n} {v:.1e}" for n, v in rel.items())
            + "; / own max: " + ", ".join(f"{n} {v:.1e}" for n, v in own.items()))


def warm(gb: float) -> None:
    """Touch ``gb`` GB once (see the module docstring) and free it."""
    if gb > 0:
        t0 = time.perf_counter()
        np.ones(int(gb * GB), dtype=np.int8)
        print(f"warmed {gb:.1f} GB of memory in {time.perf_counter() - t0:.1f} s")


PROG = "python benchmarks/bench_stats_sparse.py"


@dataclass(frozen=True)
class BenchConfig:
    """Full-vocabulary statistics with the sparse engine, against top-K and dense in one run."""

    docs: int = 100_000
    """(a): Zipf documents."""
    dense: bool = False
    """Also run (b), sparse vs dense."""
    driver: bool = False
    """(c): the full vocabulary through the driver (shards, work folder)."""
    groups: int = DEFAULT_GROUPS
    """(a), (c): document groups kept (CorpusStats.subset; the command's default)."""
    compare_groups: bool = True
    """(c): also without groups in the same run (the baseline)."""
    docs_b: int | None = None
    """(b): documents (default --docs)."""
    dense_vocab: int | None = None
    """(b): vocabulary (default: the largest where the dense engine fits)."""
    threads: int = 2
    """Torch threads of each measured run."""
    warm_gb: float | None = None
    """Memory to touch first (default: the auto budget)."""
    quick: bool = False
    """5,000 documents, (b) at 4,096."""
    baseline_tree: str | None = None
    """(a): also the top-K build of another checkout of this project, built in place, on the
    same Zipf stream in the same run (its own child; no groups): the issue's baseline
    "top-5,000 today" is the tree it was filed against, git worktree add DIR 4d5c57e, then
    python setup.py build_ext --inplace in DIR."""
    child: str | None = None
    """Internal: the JSON settings of one measurement, run in a child process."""

    def __post_init__(self):
        for name in ("docs", "threads"):
            if getattr(self, name) < 1:
                raise BadInputError(f"--{name} must be >= 1, got {getattr(self, name)}")
        if self.groups < 0 or (self.docs_b is not None and self.docs_b < 1) or \
                (self.dense_vocab is not None and self.dense_vocab < 2):
            raise BadInputError("--groups must be >= 0, --docs-b >= 1, --dense-vocab >= 2")


def main(argv: list[str] | None = None) -> int:
    [fields] = parse_configs([BenchConfig], argv, PROG, __doc__)
    a = BenchConfig(**fields)
    if a.child:
        child(json.loads(a.child))
        return 0
    sys.stdout.reconfigure(line_buffering=True)  # progress visible when logged to a file
    if a.quick:
        a = replace(a, docs=5000, docs_b=5000, dense_vocab=a.dense_vocab or 4096)
    budget, how = plan.memory_budget("cpu")
    warm(budget / GB if a.warm_gb is None else a.warm_gb)
    common = {"threads": a.threads, "seed": 0}
    if a.driver:
        through_driver(a, common)
    else:
        full_vocab(a, budget, how, common)
    if a.dense:
        dense_vs_sparse(a, budget, common)
    return 0


def full_vocab(a, budget: float, how: str, common: dict) -> None:
    """(a): full vocabulary and top-K with the sparse engine, side by side."""
    dense_out = 3 * 8 * PYTHIA_VOCAB ** 2
    print(f"(a) d_vocab {PYTHIA_VOCAB:,}, T {T}, {a.docs:,} Zipf({ZIPF}) documents, "
          f"{a.groups} document groups; auto "
          f"budget {budget / GB:.1f} GB ({how}); dense plan "
          f"{plan.dense_peak(PYTHIA_VOCAB, None) / GB:.1f} GB peak: does not fit")
    res = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, k in (("full vocabulary", None), (f"top-{K:,}", K)):
            out = Path(tmp) / f"{k}.safetensors"
            res[name] = r = measure(engine="sparse", d_vocab=PYTHIA_VOCAB, docs=a.docs, k=k,
                                    out=str(out), groups=a.groups, **common)
            print("    " + describe(f"sparse, {name}", r))
            print(f"      file {r['file_bytes'] / GB:.2f} GB ({r['file_bytes'] / dense_out:.1%} "
                  f"of the {dense_out / GB:.1f} GB of 3 V x V float64 outputs); Qbar pairs "
                  f"{r['qbar_pairs']:,}; distinct (target, context) pairs "
                  f"{r['context_pairs']:,}, bigrams {r['bigrams']:,}; peak RSS / 12 GB target "
                  f"= {r['rss'] / 12e9:.2f}")
        if a.baseline_tree:
            res["baseline"] = r = measure(tree=a.baseline_tree, engine="sparse",
                                          d_vocab=PYTHIA_VOCAB, docs=a.docs, k=K, **common)
            print("    " + describe(f"sparse, top-{K:,}, the tree at {a.baseline_tree}", r))
    (fw, fc), (tw, tc) = rates(res["full vocabulary"]), rates(res[f"top-{K:,}"])
    print(f"    full vocabulary / top-{K:,} tokens/s: {fw / tw:.2f}x wall, {fc / tc:.2f}x CPU "
          "(target >= 1)")
    if a.baseline_tree:
        # the baseline's child writes no file: the save phase is left out of both sides
        (fw, fc), (bw, bc) = rates(res["full vocabulary"], ("save",)), rates(res["baseline"])
        print(f"    full vocabulary / top-{K:,} of {a.baseline_tree} tokens/s (without the "
              f"file's write): {fw / bw:.2f}x wall, {fc / bc:.2f}x CPU (target >= 1)"
              + ("" if a.groups == 0 else f"; the full vocabulary keeps {a.groups} document "
                 "groups and the baseline none: --groups 0 compares like with like"))


def through_driver(a, common: dict) -> None:
    """(c): the full vocabulary as the command runs it (shards, token caches, checkpoints);
    with --groups G also without groups, the baseline, in the same run."""
    res = {}
    for G in sorted({0, a.groups} if a.compare_groups else {a.groups}):
        with tempfile.TemporaryDirectory() as tmp:
            res[G] = r = measure(engine="sparse", d_vocab=PYTHIA_VOCAB, docs=a.docs, k=None,
                                 out=str(Path(tmp) / "full.safetensors"),
                                 work=str(Path(tmp) / "work"), groups=G, **common)
        share = r["file_bytes"] / (3 * 8 * PYTHIA_VOCAB ** 2)
        print(f"(c) {a.docs:,} documents, {G} document groups; "
              + describe("the driver, full vocabulary", r))
        print(f"    file {r['file_bytes'] / GB:.2f} GB ({share:.1%} of the 3 V x V float64 "
              f"outputs); Qbar pairs {r['qbar_pairs']:,}; distinct (target, context) pairs "
              f"{r['context_pairs']:,}, bigrams {r['bigrams']:,}; the groups' (target, "
              f"context) pairs {r['group_pairs'][0]:,}, Qbar pairs {r['group_pairs'][1]:,}; "
              f"peak RSS / 12 GB target = {r['rss'] / 12e9:.2f}")
    if a.groups and 0 in res:
        g, n = res[a.groups], res[0]
        (w0, c0), (wg, cg) = rates(n), rates(g)
        print(f"    {a.groups} groups / none: peak RSS {g['rss'] / n['rss']:.2f}x, file "
              f"{g['file_bytes'] / n['file_bytes']:.2f}x, time {w0 / wg:.2f}x wall, "
              f"{c0 / cg:.2f}x CPU")


def dense_vs_sparse(a, budget: float, common: dict) -> None:
    """(b): both engines at the largest vocabulary where the dense one fits."""
    V = a.dense_vocab or largest_dense_vocab(budget, K)
    docs_b = a.docs_b or a.docs
    print(f"(b) largest vocabulary where the dense engine fits: {V:,} (dense plan "
          f"{plan.dense_peak(V, K) / GB:.1f} GB), {docs_b:,} documents, K {K:,}")
    with tempfile.TemporaryDirectory() as tmp:
        out = {e: Path(tmp) / f"{e}.safetensors" for e in ("dense", "sparse")}
        res = {e: measure(engine=e, d_vocab=V, docs=docs_b, out=str(out[e]),
                          **dict(common, k=min(K, V))) for e in ("dense", "sparse")}
        for e, r in res.items():
            print("    " + describe(e, r))
        (sw, sc), (dw, dc) = rates(res["sparse"]), rates(res["dense"])
        print(f"    sparse / dense tokens/s: {sw / dw:.2f}x wall, {sc / dc:.2f}x CPU "
              "(target >= 1)")
        print("    " + compare(out["sparse"], out["dense"]))


if __name__ == "__main__":
    raise SystemExit(run_main(main, PROG))
