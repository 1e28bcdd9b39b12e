"""Per-checkpoint analysis cost: factored covariance cosines vs the materialised computation.

    python benchmarks/bench_analysis.py                 # |V| = 8192, d = 512, 1 thread
    python benchmarks/bench_analysis.py --vocab 16384   # ~4x memory, ~8x time for the baseline

One "checkpoint" = one layer's attention mapping (A_tok = E_pre mean_h(W_Q^h W_K^h^T) E_pre^T vs
Qbar) plus one embedding row (E_post vs PhiBT), float64, on random inputs. Each method runs in
its own fresh process (spawn) so its peak RSS (ru_maxrss) is its own. Both prepare the theory
once per statistics (materialised: cov(rownorm(T)), V x V; factored: row scales, row means and
||cov||, no V x V copy) and then score the checkpoint. Printed: the cosines of both methods and
their relative difference, per-statistics and per-checkpoint seconds, peak RSS (total and above
the bare interpreter), and the ratios, all measured in this run.

Memory plan, full-vocabulary pythia-1.4b on one 80 GB GPU (V = 50277 statistic ids, d_model =
2048, 24 layers, 16 heads x 128, 1.41e9 parameters), float32 on the GPU, float64 r x r sums.
This script prints it at the end, computed by :func:`pythia_probe.analysis.plan.memory_plan`
(the sweep's ``--dry-run`` prints the same for any model). Not measured: no GPU was lent.

- theory matrices, resident for the whole sweep, one V x V each, no covariance copy (C_T is
  rebuilt per column chunk from T, row scales and row means): PhiBT + Qbar = 20.2 GB
  (+ Bbar 10.1 GB with ``unembedding``; Bbar^T is a view of it).
- single-token residual streams (pre, attn, post x 24 layers x V x d, float32): 29.7 GB.
- one checkpoint's weights in float32: 5.7 GB.
- one layer's factors (F, G for the head-mean and the 16 heads, float64 copies for the norms)
  and one V x 4096 column chunk: 5.0 GB.
- peak 60.5 GB (70.7 GB with ``unembedding``): fits in 80 GB. The materialised computation
  would hold A_tok, its centred copy, its covariance and the two cached theory covariances,
  >= 5 V x V = 50 GB per layer on top, and cost V^3 = 1.3e14 flops per matrix.
- host RAM: the statistics file in float64 (Bbar, Phibar, Qbar, SigmaB, Gbar: 5 x 20.2 GB)
  plus PhiBT (20.2 GB, composed on the GPU by ``compose.phi_bt`` if the file lacks it):
  ~120 GB of host memory for full vocabulary; a top-k file needs (k / V)^2 of that.
Compute: ~1.2e15 flops per checkpoint (embedding + attention with all heads), a few seconds to
tens of seconds on an H100-class GPU; theory norms 5e14 flops once per run.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import time

import torch

from pythia_probe.analysis.attention import attention_factors
from pythia_probe.analysis.cosine import (
    cosines,
    covariance,
    frobenius_cosine,
    prepare_theory,
    row_normalise,
    tall,
)


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _inputs(V: int, d: int, H: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    return r(V, V), r(V, V), r(V, d), r(V, d), r(H, d, d // H) / d**0.5, r(H, d, d // H) / d**0.5


def _factored(args) -> dict:
    V, d, H, chunk, seed = args
    base = _rss_mb()
    Qbar, PhiBT, E_pre, E_post, W_Q, W_K = _inputs(V, d, H, seed)
    t0 = time.perf_counter()
    thQ = prepare_theory("Qbar", Qbar, chunk=chunk)
    thP = prepare_theory("PhiBT", PhiBT, chunk=chunk)
    t1 = time.perf_counter()
    att = cosines([attention_factors(E_pre, W_Q, W_K, torch.float64)], thQ, chunk)[0]
    emb = cosines([tall(E_post)], thP, chunk)[0]
    t2 = time.perf_counter()
    return {"attention": att, "embedding": emb, "prep_s": t1 - t0, "step_s": t2 - t1,
            "peak_mb": _rss_mb(), "base_mb": base}


def _materialised(args) -> dict:
    V, d, H, chunk, seed = args
    base = _rss_mb()
    Qbar, PhiBT, E_pre, E_post, W_Q, W_K = _inputs(V, d, H, seed)
    t0 = time.perf_counter()
    covQ = covariance(row_normalise(Qbar))
    del Qbar
    covP = covariance(row_normalise(PhiBT))
    del PhiBT
    t1 = time.perf_counter()
    A_emb = torch.stack([W_Q[h] @ W_K[h].T for h in range(H)]).mean(0)
    A_tok = E_pre @ A_emb @ E_pre.T
    att = frobenius_cosine(covariance(A_tok), covQ)
    del A_tok
    emb = frobenius_cosine(covariance(E_post), covP)
    t2 = time.perf_counter()
    return {"attention": att, "embedding": emb, "prep_s": t1 - t0, "step_s": t2 - t1,
            "peak_mb": _rss_mb(), "base_mb": base}


def _run(fn, args, threads: int) -> dict:
    ctx = mp.get_context("spawn")
    with ctx.Pool(1, initializer=torch.set_num_threads, initargs=(threads,)) as pool:
        return pool.apply(fn, (args,))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--n-heads", type=int, default=8)
    p.add_argument("--chunk", type=int, default=1024)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    args = (a.vocab, a.d_model, a.n_heads, a.chunk, 0)
    print(f"|V|={a.vocab} d_model={a.d_model} n_heads={a.n_heads} chunk={a.chunk} "
          f"threads={a.threads} float64; V x V matrix = {a.vocab**2 * 8 / 2**20:.0f} MiB")
    res = {"factored": _run(_factored, args, a.threads),
           "materialised": _run(_materialised, args, a.threads)}
    for name, r in res.items():
        print(f"{name:>13}: attention {r['attention']:.12f}  embedding {r['embedding']:.12f}  "
              f"prep {r['prep_s']:.2f} s  per-checkpoint {r['step_s']:.2f} s  "
              f"peak RSS {r['peak_mb']:.0f} MiB ({r['peak_mb'] - r['base_mb']:.0f} above "
              "interpreter)")
    f, m = res["factored"], res["materialised"]
    inputs_mb = (2 * a.vocab**2 + 2 * a.vocab * a.d_model + 2 * a.d_model**2) * 8 / 2**20
    print(f"inputs both methods hold (2 theory matrices + E_pre, E_post, W_Q, W_K): "
          f"{inputs_mb:.0f} MiB")
    work = {k: r["peak_mb"] - r["base_mb"] - inputs_mb for k, r in res.items()}
    print(f"working memory beyond the inputs: factored {work['factored']:.0f} MiB, "
          f"materialised {work['materialised']:.0f} MiB, ratio "
          f"{work['materialised'] / max(work['factored'], 1):.1f}x")
    for key in ("attention", "embedding"):
        print(f"relative difference {key}: {abs(f[key] - m[key]) / abs(m[key]):.2e}")
    print(f"peak memory ratio materialised/factored: {m['peak_mb'] / f['peak_mb']:.2f}x total, "
          f"{(m['peak_mb'] - m['base_mb']) / (f['peak_mb'] - f['base_mb']):.2f}x above "
          "interpreter")
    print(f"per-checkpoint time ratio materialised/factored: {m['step_s'] / f['step_s']:.2f}x; "
          f"per-statistics prep ratio: {m['prep_s'] / f['prep_s']:.2f}x")
    print_pythia_plan()
    return 0


def print_pythia_plan() -> None:
    """The computed plan for full-vocabulary pythia-1.4b (config values of the model)."""
    from pythia_probe.analysis.plan import memory_plan

    V, d, L, H, d_mlp, v_model = 50277, 2048, 24, 16, 8192, 50304
    n_params = 2 * v_model * d + L * (4 * d * d + 2 * d * d_mlp + 9 * d + d_mlp)
    for analyses in (["embedding", "attention"], ["embedding", "attention", "unembedding"]):
        plan = memory_plan(V, d, L, H, n_params, analyses)
        print(f"pythia-1.4b, V={V}, float32 on the GPU, analyses {','.join(analyses)}:")
        print("\n".join("  " + line for line in plan.lines()))


if __name__ == "__main__":
    raise SystemExit(main())
