"""What ``chance_sd`` costs, how the ``above_chance`` test is calibrated, and what the
Spearman-Brown ceiling corrects (issue 26 item 3). Every number printed is measured or computed
in the run.

    python benchmarks/bench_chance.py                  # |V| = 4096, d = 256, 8 heads, 1 thread
    python benchmarks/bench_chance.py --vocab 8192 --d-model 512 --dtype float32
    python benchmarks/bench_chance.py --draws 2000     # tighter calibration rates
    python benchmarks/bench_chance.py --parts cost     # one part (cost, calibration,
                                                       # spearman_brown)

1. Cost. One layer's cells (``attention`` head mean + every head, ``attention_lnfold`` the same,
   ``embedding`` cos_pre/cos_attn/cos_post) on random weights against two dense targets: the
   seconds of the pass of each basis over its target (``fill_target_grams``), of the cells'
   r-space algebra with value and chance (``_score``), and of the row pass ``chance_sd`` adds
   (``ModelCovariance.null_terms``, once per factor however many target sets it is scored against),
   with the row pass's multiply-adds beside the target pass's. Then the same multiply-adds for
   pythia-1.4b's shapes (computed, not timed).
2. Calibration. Random weights (a Gaussian residual stream, or random W_Q W_K on one) against
   the statistics of a 60-document Markov corpus at V = 64 with G = 5 document groups: the
   share flagged ``above_chance`` with the jackknife se (the sweep's default) and with
   chance_sd alone (--no-intervals), and the z statistic's mean, SD and skewness.
3. Spearman-Brown. Markov text with a known transition matrix: the split-half cosine r, its
   correction 2 r / (1 + r), what the true statistic and an independent corpus of the same size
   score against the full corpus's (means over --corpora corpora).
Flags: :class:`BenchConfig`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch

from pythia_probe.analysis.attention import attention_factors
from pythia_probe.analysis.basis import Basis, fill_target_grams
from pythia_probe.analysis.cosine import _score, prepare_target, product, scores, tall
from pythia_probe.analysis.intervals import Z_ABOVE, ceiling, jackknife_se, spearman_brown
from pythia_probe.cli import parse_configs, run_main
from pythia_probe.stats.reference import reference_stats
from pythia_probe.testing import markov


@dataclass(frozen=True)
class BenchConfig:
    """What chance_sd costs, the above_chance test's calibration, the Spearman-Brown ceiling."""

    vocab: int = 4096
    """|V| of the cost measurement (two dense V x V targets are held)."""
    d_model: int = 256
    """Model width of the cost measurement."""
    n_heads: int = 8
    """Attention heads (d_model / n_heads per head)."""
    dtype: str = "float64"
    """Compute dtype of the cost measurement: float64 or float32."""
    threads: int = 1
    """torch threads."""
    draws: int = 800
    """Random weights per calibration configuration."""
    corpora: int = 6
    """Corpora of the Spearman-Brown check."""
    parts: str = "cost,calibration,spearman_brown"
    """Which measurements to run (comma-separated)."""


def _layer(V: int, d: int, H: int, dt: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    streams = {k: Basis(r(V, d) + 0.5 * r(1, d), dt) for k in ("pre", "attn", "post")}
    W_Q, W_K = r(H, d, d // H) / d ** 0.5, r(H, d, d // H) / d ** 0.5
    attn = (attention_factors(streams["pre"], W_Q, W_K, range(H))
            + attention_factors(streams["pre"], W_Q, W_K, range(H), 1 + 0.1 * r(d)))
    return streams, attn, [tall(b) for b in streams.values()]


def _row_pass_macs(V: int, width: int, rank: int, tall_: bool) -> int:
    """Multiply-adds of one factor's row pass (cosine._row_terms)."""
    if tall_:
        return V * (width - 1)
    return V * min(rank * (width + rank) + rank, width * width + width)


def cost(a: BenchConfig) -> None:
    V, d, H = a.vocab, a.d_model, a.n_heads
    dt = getattr(torch, a.dtype)
    g = torch.Generator().manual_seed(9)
    Qbar, PhiBT = (prepare_target(n, torch.rand(V, V, generator=g, dtype=torch.float64)
                                  + torch.rand(V, generator=g, dtype=torch.float64), dtype=dt)
                   for n in ("Qbar", "PhiBT"))
    streams, attn, emb = _layer(V, d, H, dt)
    t = {}
    t0 = time.perf_counter()
    fill_target_grams([streams["pre"]], Qbar)
    fill_target_grams(list(streams.values()), PhiBT)
    t["target pass (3 + 1 bases)"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for f in attn + emb:
        f.null_terms  # noqa: B018 - the row pass, memoised on the factor
    t["chance_sd row pass"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    got = [_score(f, Qbar) for f in attn] + [_score(f, PhiBT) for f in emb]
    t["value + chance + chance_sd per cell"] = time.perf_counter() - t0
    n = len(got)
    print(f"cost: |V|={V} d_model={d} heads={H} {a.dtype}, {a.threads} thread(s); one layer: "
          f"{n} cells (attention and attention_lnfold: mean + {H} heads each; embedding 3)")
    for k, s in t.items():
        print(f"  {k}: {s:.3f} s")
    share = t["chance_sd row pass"] / (t["target pass (3 + 1 bases)"]
                                        + t["value + chance + chance_sd per cell"])
    print(f"  the row pass is {100 * share:.1f}% of the rest of the layer's scoring, once per "
          "step (each further target set, e.g. the G = 10 left-out ones, adds only scalars)")
    _macs(V, d, H, "  this run's shapes")
    _macs(50277, 2048, 16, "  pythia-1.4b, full vocabulary")
    _macs(5000, 2048, 16, "  pythia-1.4b, top-5,000")


def _macs(V: int, d: int, H: int, label: str) -> None:
    w = d + 1
    row = (2 * (_row_pass_macs(V, w, d, False) + H * _row_pass_macs(V, w, d // H, False))
           + 3 * _row_pass_macs(V, w, d, True))
    dense = 4 * V * V * w  # 4 bases through a dense V x V target (top-k statistics)
    fwd = V * 12 * d * d  # the layer's single-token forward pass (attention + MLP, 4d MLP)
    step = fwd + 11 * dense  # with intervals from G = 10 groups: 11 target sets
    print(f"{label}: row pass {row:.3g} multiply-adds per layer = {100 * row / dense:.1f}% of "
          f"the 4 bases' dense target passes ({dense:.3g}), {100 * row / fwd:.0f}% of the "
          f"layer's forward pass ({fwd:.3g}), {100 * row / step:.1f}% of the layer's step "
          "with intervals (forward + 11 target sets)")


def _markov_corpus(V: int, N: int, T: int, seed: int = 0) -> torch.Tensor:
    """As tests/test_analysis_chance_sd.py draws its corpus."""
    P, _ = markov.chain(V, sharpness=2.0, seed=seed)
    return markov.sample(P, torch.full((V,), 1.0 / V, dtype=torch.float64), N, T, seed)


def _random_factor(kind: str, V: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    E = torch.randn(V, 16, generator=g, dtype=torch.float64)
    if kind == "stream":
        return tall(E)
    W_Q, W_K = (torch.randn(16, 8, generator=g, dtype=torch.float64) for _ in range(2))
    return product(E @ W_Q, E @ W_K)


def calibration(a: BenchConfig) -> None:
    V, N, G, n = 64, 60, 5, a.draws
    tokens = _markov_corpus(V, N, 24)
    slack = 2.326 * math.sqrt(0.05 * 0.95 / n)
    print(f"calibration: V={V}, {N} Markov documents of 25 tokens, G={G} groups, {n} random "
          f"weights per line; a true 5% rate stays below {100 * (0.05 + slack):.1f}% in 99% "
          "of runs")
    for name in ("PhiBT", "Qbar"):
        full = prepare_target(name, reference_stats(tokens, V)[name])
        left = [prepare_target(name, reference_stats(tokens[np.arange(N) % G != g], V)[name])
                for g in range(G)]
        for kind in ("stream", "attention"):
            z_sd, z_both = [], []
            for i in range(n):
                f = _random_factor(kind, V, 1000 + i)
                s = scores([f], full)[0]
                se = jackknife_se([scores([f], t)[0].value for t in left])
                z_sd.append((s.value - s.chance) / s.chance_sd)
                z_both.append((s.value - s.chance) / math.hypot(s.chance_sd, se))
            z, zb = np.array(z_sd), np.array(z_both)
            skew = float(((z - z.mean()) ** 3).mean() / z.std() ** 3)
            print(f"  {name} vs random {kind}: flagged with se {100 * (zb > Z_ABOVE).mean():.1f}%,"
                  f" with chance_sd alone {100 * (z > Z_ABOVE).mean():.1f}% (z: mean "
                  f"{z.mean():+.3f}, SD {z.std():.3f}, skewness {skew:+.2f}; chance_sd alone "
                  f"at z > 2: {100 * (z > 2).mean():.1f}%, z > 2.326: "
                  f"{100 * (z > 2.326).mean():.1f}%)")


def spearman_brown_check(a: BenchConfig) -> None:
    V, T, N = 30, 16, 300
    P, pi = markov.chain(V)
    true = prepare_target("Bbar", markov.true_bbar(P, pi))
    rows = []
    for seed in range(a.corpora):
        tokens = markov.sample(P, pi, N, T, seed)
        full = prepare_target("Bbar", markov.bbar(tokens, V))
        r = ceiling(*(prepare_target("Bbar", markov.bbar(h, V)) for h in (tokens[:N // 2],
                                                                         tokens[N // 2:])))
        other = prepare_target("Bbar", markov.bbar(markov.sample(P, pi, N, T, 100 + seed), V))
        rows.append((r, spearman_brown(r), ceiling(true, full), ceiling(other, full)))
    r, sb, to_true, to_other = np.array(rows).mean(axis=0)
    print(f"Spearman-Brown: Bbar of {a.corpora} Markov corpora (V={V}, {N} documents of "
          f"{T + 1} tokens), means: split half r {r:.4f}, 2r/(1+r) {sb:.4f}, sqrt of that "
          f"{math.sqrt(sb):.4f}; the true Bbar scores {to_true:.4f} against the full corpus's, "
          f"an independent corpus of the same size {to_other:.4f}")


def main(argv: list[str] | None = None) -> int:
    (fields,) = parse_configs([BenchConfig], argv, "python benchmarks/bench_chance.py")
    a = BenchConfig(**fields)
    torch.set_num_threads(a.threads)
    runs = {"cost": cost, "calibration": calibration, "spearman_brown": spearman_brown_check}
    for part in a.parts.split(","):
        if part not in runs:
            raise ValueError(f"--parts: no part {part!r}; valid: {', '.join(runs)}")
        runs[part](a)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main, "bench_chance"))
