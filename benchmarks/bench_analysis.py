"""Per-checkpoint analysis cost: factored cosines vs the materialised computation.

    python benchmarks/bench_analysis.py                 # |V| = 8192, d = 512, 1 thread
    python benchmarks/bench_analysis.py --pythia --layers 2 --threads 2   # Pythia-1.4B step
    python benchmarks/bench_analysis.py --vocab 16384   # ~4x memory, ~8x time for the baseline

One "checkpoint" = one layer's attention mapping (A_tok = E_pre mean_h(W_Q^h W_K^h^T) E_pre^T vs
Qbar) plus one embedding row (E_post vs PhiBT), float64, on random inputs.

Once per statistics (own processes, timed, not part of the per-checkpoint peak): ``factored``
computes each dense target's vectors (D, m, ||cov||, the chance terms; the target as its own
single factor, :func:`pythia_probe.analysis.factored.prepare_target`) and caches them;
``materialised`` writes cov(rownorm(T)) of both (V x V each).

Per checkpoint, each method in a FRESH spawned process so its peak RSS (ru_maxrss = VmHWM) is
its own: ``factored`` reads both statistics and their cached vectors and scores through
T^T (D X) - 1 (m^T X); ``materialised`` reads its two cached covariances and forms A_tok, its
covariance and cov(E_post). Printed: the cosines and their relative differences,
per-checkpoint seconds, peak RSS in total, above the bare interpreter (torch imported) and
beyond the model inputs every method holds, and the ratios, all measured in this run.

Memory plan of pythia-1.4b (V = 50277, d_model = 2048, 24 layers, 16 heads x 128, 1.41e9
parameters) with its targets held dense, float32: printed at the end, computed by
:func:`pythia_probe.planner.step.memory_plan` (the sweep's ``--dry-run`` prints the same for
any model and statistics), never typed in here.
Flags: :class:`BenchConfig` (the commands' config-dataclass idiom).
"""

from __future__ import annotations

import multiprocessing as mp
import resource
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from pythia_probe.analysis.attention import attention_factors
from pythia_probe.analysis.basis import Basis
from pythia_probe.analysis.cosine import (
    cosines,
    covariance,
    frobenius_cosine,
    row_normalise,
    tall,
)
from pythia_probe.analysis.factored import FactoredTarget, Parts, dense_parts
from pythia_probe.analysis.factored_cache import cached_vectors
from pythia_probe.cli import parse_configs, run_main

TARGETS = ("Qbar", "PhiBT")
MIB = 2**20


def _rss_mib() -> float:
    """Peak resident set of this process so far (ru_maxrss = VmHWM, in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _rand(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _target_inputs(V: int) -> dict[str, torch.Tensor]:
    return {"Qbar": _rand(1, V, V), "PhiBT": _rand(2, V, V)}


def _model_inputs(V: int, d: int, H: int):
    """One checkpoint: E_pre, E_post [V, d], W_Q, W_K [H, d, d/H] (shared by every method)."""
    return (_rand(3, V, d), _rand(4, V, d), _rand(5, H, d, d // H) / d**0.5,
            _rand(6, H, d, d // H) / d**0.5)


def _load(path: Path, name: str) -> torch.Tensor:
    """A tensor of a safetensors file (one copy in RAM)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return f.get_tensor(name)


# ---- once per statistics (each in its own process) --------------------------------------------
def prep_factored(args) -> dict:
    from safetensors.torch import save_file

    V, d, H, chunk, work = args
    t0 = time.perf_counter()
    raw = _target_inputs(V)
    for name, T in raw.items():
        cached_vectors(name, lambda T=T: dense_parts(T), work / "cache", "bench", chunk)
    out = {"s": time.perf_counter() - t0, "peak_mib": _rss_mib()}
    save_file(raw, work / "raw.safetensors")
    return out


def prep_materialised(args) -> dict:
    from safetensors.torch import save_file

    V, d, H, chunk, work = args
    t0 = time.perf_counter()
    covs = {n: covariance(row_normalise(T)) for n, T in _target_inputs(V).items()}
    save_file(covs, work / "covariances.safetensors")
    return {"s": time.perf_counter() - t0, "peak_mib": _rss_mib()}


# ---- one checkpoint (each in a fresh process) -------------------------------------------------
def _score(targets: dict, V: int, d: int, H: int, chunk: int) -> tuple[float, float]:
    E_pre, E_post, W_Q, W_K = _model_inputs(V, d, H)
    att = cosines([attention_factors(Basis(E_pre), W_Q, W_K)[0]], targets["Qbar"], chunk)[0]
    return att, cosines([tall(E_post)], targets["PhiBT"], chunk)[0]


def step_factored(args) -> dict:
    """Both statistics resident, each its own single factor, their vectors from the cache."""
    V, d, H, chunk, work = args
    base, t0 = _rss_mib(), time.perf_counter()
    th = {}
    for n in TARGETS:
        p = dense_parts(_load(work / "raw.safetensors", n))
        vec = cached_vectors(n, lambda: AssertionError("not cached"), work / "cache", "bench")
        th[n] = FactoredTarget(n, Parts(p, torch.float64, "cpu", {n}), vec)
    att, emb = _score(th, V, d, H, chunk)
    return _result(att, emb, base, t0, 0.0)


def step_materialised(args) -> dict:
    """Literal: cached target covariances (V x V each) + A_tok, its covariance, cov(E_post)."""
    V, d, H, chunk, work = args
    base, t0 = _rss_mib(), time.perf_counter()
    covs = {n: _load(work / "covariances.safetensors", n) for n in TARGETS}
    E_pre, E_post, W_Q, W_K = _model_inputs(V, d, H)
    A_emb = torch.stack([W_Q[h] @ W_K[h].T for h in range(H)]).mean(0)
    A_tok = E_pre @ A_emb @ E_pre.T
    att = frobenius_cosine(covariance(A_tok), covs["Qbar"])
    del A_tok
    emb = frobenius_cosine(covariance(E_post), covs["PhiBT"])
    return _result(att, emb, base, t0, 0.0)


def _result(att: float, emb: float, base: float, t0: float, prep_s: float) -> dict:
    return {"attention": att, "embedding": emb, "s": time.perf_counter() - t0,
            "peak_mib": _rss_mib(), "base_mib": base, "prep_s": prep_s}


def _run(fn, args, threads: int) -> dict:
    """``fn(args)`` in a fresh spawned process, so its peak RSS is its own."""
    ctx = mp.get_context("spawn")
    with ctx.Pool(1, initializer=torch.set_num_threads, initargs=(threads,)) as pool:
        return pool.apply(fn, (args,))


def _report(res: dict, model_mib: float) -> None:
    for name, r in res.items():
        above = r["peak_mib"] - r["base_mib"]
        print(f"{name:>13}: attention {r['attention']:.12f}  embedding {r['embedding']:.12f}  "
              f"per-checkpoint {r['s']:.2f} s  peak RSS {r['peak_mib']:.0f} MiB total, "
              f"{above:.0f} above the interpreter ({r['base_mib']:.0f}), "
              f"{above - model_mib:.0f} beyond the model inputs")
    m, r = res["materialised"], res["factored"]
    for key in ("attention", "embedding"):
        print(f"relative difference {key} factored vs materialised: "
              f"{abs(r[key] - m[key]) / abs(m[key]):.2e}")
    _ratios("factored", r, m, model_mib)


def _ratios(name: str, r: dict, m: dict, model_mib: float) -> None:
    above_r, above_m = r["peak_mib"] - r["base_mib"], m["peak_mib"] - m["base_mib"]
    beyond = (above_m - model_mib) / max(above_r - model_mib, 1)
    print(f"materialised / {name}: peak RSS {m['peak_mib'] / r['peak_mib']:.2f}x total, "
          f"{above_m / above_r:.2f}x above the interpreter, {beyond:.1f}x beyond the model "
          f"inputs; per-checkpoint time {m['s'] / r['s']:.2f}x")


@dataclass(frozen=True)
class BenchConfig:
    """Per-checkpoint analysis cost: factored cosines vs the materialised computation."""

    vocab: int = 8192
    """|V|: statistic rows (one V x V float64 matrix is 8 V^2 bytes)."""
    d_model: int = 512
    """Model width."""
    n_heads: int = 8
    """Attention heads (d_model / n_heads per head)."""
    chunk: int = 1024
    """Vocabulary columns per block of a target."""
    threads: int = 1
    """torch threads in each measured process."""
    work: str | None = None
    """Folder for the caches (default: a temporary folder)."""
    pythia: bool = False
    """Instead: one sweep step at Pythia-1.4B shapes, full vocabulary (factored) vs top-5,000
    (dense) vs a TransformerLens-style dense procedure (benchmarks/bench_step.py)."""
    layers: int = 24
    """--pythia: layers of the random Pythia-1.4B-shaped checkpoint (fewer on a shared CPU)."""
    docs: int = 2000
    """--pythia: Zipf documents the sparse parts are counted from."""
    dense_full: bool = False
    """--pythia: also run the dense procedure at the full vocabulary (10 GB per matrix)."""
    plan_nnz: int = 0
    """--pythia: also the plan's full step at nnz(W) = nnz(Qbar) = this (e.g. a real file's
    part_counts), nnz(C) scaled with W, at the rates measured in the run."""
    skip_dense_tl: bool = False
    """--pythia: skip the TransformerLens-style procedure (e.g. a --docs scaling run)."""
    repeats: int = 1
    """--pythia: run the full and top-5,000 steps this many times, alternated; the best of each."""
    parts_ab: bool = False
    """--pythia: instead, the factored parts before / after (products, Grams, moments) at the
    full step's shapes, alternated in one process."""


def main(argv: list[str] | None = None) -> int:
    (fields,) = parse_configs([BenchConfig], argv, "python benchmarks/bench_analysis.py")
    a = BenchConfig(**fields)
    if a.pythia and a.parts_ab:
        from bench_step import run_parts_ab

        run_parts_ab(a.docs, a.threads)
        return 0
    if a.pythia:
        from bench_step import run_pythia

        run_pythia(a.layers, a.docs, a.threads, 4096, a.dense_full, not a.skip_dense_tl,
                   a.plan_nnz, a.repeats)
        return 0
    V, d = a.vocab, a.d_model
    with tempfile.TemporaryDirectory(dir=a.work) as tmp:
        args = (V, d, a.n_heads, a.chunk, Path(tmp))
        print(f"|V|={V} d_model={d} n_heads={a.n_heads} chunk={a.chunk} threads={a.threads} "
              f"float64; one V x V matrix = {V**2 * 8 / MIB:.0f} MiB")
        prep = {"factored": _run(prep_factored, args, a.threads),
                "materialised": _run(prep_materialised, args, a.threads)}
        for name, r in prep.items():
            print(f"per statistics, {name}: {r['s']:.2f} s, peak RSS {r['peak_mib']:.0f} MiB")
        res = {"factored": _run(step_factored, args, a.threads),
               "materialised": _run(step_materialised, args, a.threads)}
    model_mib = (2 * V * d + 2 * d * d) * 8 / MIB
    print(f"model inputs every method holds (E_pre, E_post, W_Q, W_K): {model_mib:.0f} MiB")
    _report(res, model_mib)
    return 0


def print_pythia_plan() -> None:
    """The computed plan for pythia-1.4b with dense targets (config values of the model)."""
    from pythia_probe.analysis import get_analyses
    from pythia_probe.planner.step import StepShape, memory_plan

    V, d, L, H, d_mlp, v_model = 50277, 2048, 24, 16, 8192, 50304
    n_params = 2 * v_model * d + L * (4 * d * d + 2 * d * d_mlp + 9 * d + d_mlp)
    for analyses in (["embedding", "attention"], ["embedding", "attention", "unembedding"]):
        plan = memory_plan(StepShape(V, d, L, H, d_mlp, n_params), get_analyses(analyses),
                           mode="dense")
        print(f"pythia-1.4b, V={V}, float32 on the GPU, analyses {','.join(analyses)}:")
        print("\n".join("  " + line for line in plan.lines()))


if __name__ == "__main__":
    raise SystemExit(run_main(main, "bench_analysis"))
