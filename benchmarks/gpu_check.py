"""The GPU check: one script, one table, for the day a GPU is lent (under 8 minutes on one).

    python benchmarks/gpu_check.py                       # on a CUDA machine: the full sizes
    python benchmarks/gpu_check.py --small --device cpu  # what the test suite runs

Three checks, each measured in this run:
1. kernels: both statistics passes on a random corpus on ``--device`` against the CPU (pass-1
   counts must be equal bit for bit, float statistics to float64 rounding);
2. statistics at d_vocab 50,277 (Pythia's tokenizer) on a synthetic Zipf token stream with the
   engine ``--engine auto`` picks: tokens/s and peak memory beside the engine's own plan;
3. one sweep step at full vocabulary on a Pythia-1.4B-shaped random checkpoint (embedding,
   attention_lnfold and attention, every head, targets resident): seconds and peak memory
   beside :func:`pythia_probe.planner.step.memory_plan`;
4. the same step through factored targets (the sparse parts of a Zipf stream, nothing V x V):
   seconds against the plan's expected seconds at rates measured in the run, peak memory against
   the plan, and (small vocabularies) every value against the dense targets'.
``--out`` also writes the table as markdown (for the README). Flags: :class:`GpuCheckConfig`
(the commands' config-dataclass idiom, ``--help`` lists them with their defaults).
"""

from __future__ import annotations

import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from pythia_probe.analysis import combined_needs, get_analyses
from pythia_probe.analysis.cosine import prepare_target
from pythia_probe.analysis.factored import FactoredTarget, Parts, _columns, target_vectors
from pythia_probe.arch import NeoXConfig, NeoXWeights
from pythia_probe.cli import parse_configs, run_main
from pythia_probe.errors import OutOfRangeError
from pythia_probe.fileio import write_text
from pythia_probe.planner.rates import measure
from pythia_probe.planner.step import StepShape, memory_plan
from pythia_probe.ranks import check_device
from pythia_probe.stats import batch_stats
from pythia_probe.stats import driver as run
from pythia_probe.stats.sequences import SequencePolicy
from pythia_probe.sweep.config import ScoringConfig
from pythia_probe.sweep.scoring import Scorer

ANALYSES = ("embedding", "attention_lnfold", "attention")
PYTHIA_1_4B = dict(d_vocab=50304, d_model=2048, n_layers=24, n_heads=16, d_mlp=8192,
                   rotary_dim=32)


@dataclass(frozen=True)
class GpuCheckConfig:
    """The GPU check: kernels, statistics at d_vocab 50,277 and one full-vocabulary sweep step,
    measured on --device, printed as one table."""

    device: str = "cuda"
    """The device checked (cuda, cuda:N; cpu for the test suite's run)."""
    small: bool = False
    """Tiny sizes (the test suite's run)."""
    out: str | None = None
    """Also write the table (markdown) to this file."""


@dataclass(frozen=True)
class Sizes:
    kernel_vocab: int = 4096  # random corpus for the kernel comparison
    kernel_seqs: int = 256
    kernel_T: int = 128
    stats_vocab: int = 50277
    stats_docs: int = 20000
    stats_T: int = 128
    model: tuple = tuple(PYTHIA_1_4B.items())
    sweep_vocab: int = 50277
    factored_docs: int = 2000  # Zipf documents of 129 tokens the factored step's parts count
    dense_check_vocab: int = 4096  # the factored step checked against dense targets up to here


SMALL = Sizes(kernel_vocab=300, kernel_seqs=24, kernel_T=16, stats_vocab=2000, stats_docs=200,
              stats_T=32, model=tuple(dict(d_vocab=320, d_model=32, n_layers=2, n_heads=4,
                                           d_mlp=64, rotary_dim=4).items()), sweep_vocab=300,
              factored_docs=40)


class Meter:
    """Peak memory of a block on the device (CUDA allocator) or the host (peak RSS growth)."""

    def __init__(self, device: str) -> None:
        self.cuda = torch.device(device).type == "cuda"

    def __enter__(self) -> Meter:
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated() - self.base
        else:
            self.peak = float("nan")  # the host's RSS also holds the interpreter: not comparable
        self.seconds = time.perf_counter() - self.t0


def zipf_tokens(n: int, T: int, V: int, seed: int = 0) -> torch.Tensor:
    """[n, T+1] ids drawn from a Zipf(1) law over V ids (a natural-text-like frequency profile)."""
    g = torch.Generator().manual_seed(seed)
    p = 1.0 / torch.arange(1, V + 1, dtype=torch.float64)
    return torch.multinomial(p / p.sum(), n * (T + 1), replacement=True, generator=g).view(n, -1)


def check_kernels(s: Sizes, device: str) -> list[dict]:
    """Both passes on ``device`` against the CPU on one random corpus."""
    tokens = zipf_tokens(s.kernel_seqs, s.kernel_T, s.kernel_vocab, seed=1)
    ref = batch_stats(tokens, s.kernel_vocab, device="cpu")
    with Meter(device) as m:
        got = batch_stats(tokens, s.kernel_vocab, device=device)
    counts_equal = torch.equal(ref.token_counts.cpu(), got.token_counts.cpu())
    rows = [{"check": "kernels: token counts equal", "measured": str(counts_equal),
             "reference": "True", "ok": counts_equal}]
    for name, limit in (("Bbar", 0.0), ("Phibar", 0.0), ("Qbar", 1e-9), ("Delta", 1e-9)):
        a, b = ref[name].double().cpu(), got[name].double().cpu()
        err = float((a - b).abs().max() / a.abs().max().clamp_min(1e-300))
        rows.append({"check": f"kernels: {name} max rel. difference", "measured": f"{err:.1e}",
                     "reference": "0 (pass 1 exact)" if limit == 0 else f"<= {limit:.0e}",
                     "ok": err <= limit})
    rows.append({"check": "kernels: both passes", "measured": f"{m.seconds:.2f} s",
                 "reference": f"{tokens.numel():,} tokens", "ok": True})
    return rows


@dataclass(frozen=True)
class TokenShard:
    """A shard whose documents are already token ids (the synthetic stream needs no text)."""

    name: str
    rows: torch.Tensor

    def documents(self):
        yield from self.rows.tolist()

    def fingerprint(self) -> dict:
        return {"name": self.name}


def check_statistics(s: Sizes, device: str, work: Path) -> list[dict]:
    """Both passes at d_vocab 50,277 on a Zipf stream, the engine --engine auto picks: tokens/s
    and peak memory beside the engine's plan."""
    tokens = zipf_tokens(s.stats_docs, s.stats_T, s.stats_vocab, seed=3)
    shards = [TokenShard(f"zipf{i}", part) for i, part in enumerate(tokens.split(2000))]
    spec = run.RunSpec(s.stats_vocab, SequencePolicy(s.stats_T), lambda docs: iter(docs),
                       {"check": "gpu"}, work, device=device, progress=False)
    with Meter(device) as m:
        stats = run.compute_stats(shards, spec, {})
    engine = stats.meta["engine"]
    planned = engine["plan"]["dense_peak_bytes"] if engine["resolved"] == "dense" else float(
        engine["plan"]["sparse"]["fixed_bytes"])
    ratio = m.peak / planned
    return [{"check": f"statistics: d_vocab {s.stats_vocab:,}, engine {engine['resolved']}",
             "measured": f"{tokens.numel() / m.seconds:,.0f} tokens/s",
             "reference": f"{tokens.numel():,} tokens in {m.seconds:.1f} s", "ok": True},
            {"check": "statistics: peak memory / planned", "measured": _gb(m.peak),
             "reference": f"{_gb(planned)} (ratio {ratio:.2f})", "ok": not ratio > 1.25}]


def random_weights(cfg: NeoXConfig, device: str, seed: int = 0) -> NeoXWeights:
    """A random GPT-NeoX checkpoint of ``cfg``'s shapes, made on ``device`` (HF names)."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    hf = GPTNeoXConfig(vocab_size=cfg.d_vocab, hidden_size=cfg.d_model,
                       num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
                       intermediate_size=cfg.d_mlp, rotary_pct=cfg.rotary_dim / cfg.d_head,
                       use_parallel_residual=True, tie_word_embeddings=False)
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in GPTNeoXForCausalLM(hf).state_dict().items()}
    g = torch.Generator(device=device).manual_seed(seed)
    sd = {("embed_out.weight" if k == "lm_head.weight" else k):
          torch.randn(shape, generator=g, device=device).mul_(0.02) for k, shape in shapes.items()}
    return NeoXWeights(sd, NeoXConfig.from_hf(hf))


def check_sweep_step(s: Sizes, device: str) -> list[dict]:
    """One full-vocabulary sweep step, targets resident: seconds and peak vs the plan."""
    shape = dict(s.model)
    cfg = NeoXConfig(**shape)
    V = s.sweep_vocab
    weights = random_weights(cfg, device)
    g = torch.Generator(device=device).manual_seed(2)
    targets = {n: prepare_target(n, torch.randn(V, V, generator=g, device=device),
                                 dtype=torch.float32, device=device) for n in ("PhiBT", "Qbar")}
    analyses = get_analyses(list(ANALYSES))
    scorer = Scorer(analyses, combined_needs(analyses), targets, torch.arange(V), "check", {},
                    None, ScoringConfig(ANALYSES, device=device))
    n_params = sum(t.numel() for t in weights.sd.values())
    plan = memory_plan(StepShape(V, cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.d_mlp,
                                 n_params), analyses, mode="dense")
    with Meter(device) as m:
        try:
            rows, ok = scorer.rows({}, weights), True  # every value range-checked on the way
        except OutOfRangeError:
            rows, ok = [], False
    planned = plan.total - plan.targets - plan.weights  # both already resident before the step
    ratio = m.peak / planned if planned else float("nan")
    return [{"check": "sweep step: rows, every value in [-1, 1]", "measured": str(len(rows)),
             "reference": f"{cfg.n_layers} layers", "ok": ok},
            {"check": "sweep step: seconds", "measured": f"{m.seconds:.1f} s",
             "reference": f"{plan.flops_per_step:.2e} flops planned", "ok": True},
            {"check": "sweep step: peak memory / planned", "measured": _gb(m.peak),
             "reference": f"{_gb(planned)} (ratio {ratio:.2f})",
             "ok": not ratio > 1.25}]


def check_factored_step(s: Sizes, device: str) -> list[dict]:
    """One full-vocabulary sweep step through factored targets (the statistics' sparse parts
    of a Zipf stream, bench_step.zipf_parts): its vectors once (host, float64), the step on
    ``device`` (float32): seconds against the plan at rates measured now, peak memory against
    the plan, and at a small vocabulary every value against the dense targets'."""
    from bench_step import zipf_parts

    cfg, V = NeoXConfig(**dict(s.model)), s.sweep_vocab
    weights = random_weights(cfg, device)
    parts = zipf_parts(s.factored_docs, V=V)
    t0 = time.perf_counter()
    vectors = {n: target_vectors(n, parts) for n in ("PhiBT", "Qbar")}
    once = time.perf_counter() - t0
    P = Parts(parts, torch.float32, device, set(vectors))
    targets = {n: FactoredTarget(n, P, v) for n, v in vectors.items()}
    analyses = get_analyses(list(ANALYSES))
    scorer = Scorer(analyses, combined_needs(analyses), targets, torch.arange(V), "check", {},
                    None, ScoringConfig(ANALYSES, device=device))
    nnz = {"C": parts["C"].nnz, "W": parts["W"].nnz, "Qbar": parts["Qbar"].nnz}
    n_params = sum(t.numel() for t in weights.sd.values())
    plan = memory_plan(StepShape(V, cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.d_mlp,
                                 n_params), analyses, mode="factored", nnz=nnz)
    rates = measure(device, torch.float32)
    with Meter(device) as m:
        try:
            rows, ok = scorer.rows({}, weights), True
        except OutOfRangeError:
            rows, ok = [], False
    planned = plan.total - plan.weights
    ratio = m.peak / planned if planned else float("nan")
    out = [{"check": "factored step: rows, every value in [-1, 1]", "measured": str(len(rows)),
            "reference": f"V {V:,}, nnz {nnz}", "ok": ok},
           {"check": "factored step: seconds", "measured": f"{m.seconds:.1f} s",
            "reference": f"planned {plan.seconds(rates):.1f} s; vectors once {once:.1f} s",
            "ok": True},
           {"check": "factored step: peak memory / planned", "measured": _gb(m.peak),
            "reference": f"{_gb(planned)} (ratio {ratio:.2f})", "ok": not ratio > 1.25}]
    if V <= s.dense_check_vocab and ok:
        dense = {n: prepare_target(n, torch.from_numpy(_columns(n, parts, np.arange(V))),
                                   dtype=torch.float32, device=device) for n in vectors}
        ref = Scorer(analyses, combined_needs(analyses), dense, torch.arange(V), "check", {},
                     None, ScoringConfig(ANALYSES, device=device)).rows({}, weights)
        diff = max(abs(a["value"] - b["value"]) for a, b in zip(rows, ref, strict=True))
        out.append({"check": "factored step vs dense targets: max abs. difference",
                    "measured": f"{diff:.1e}", "reference": "<= 1e-4 (float32)",
                    "ok": diff <= 1e-4})
    return out


def _gb(x: float) -> str:
    return "n/a (host)" if x != x else f"{x / 1e9:.2f} GB"


def table(rows: list[dict]) -> str:
    lines = ["| check | measured | reference | ok |", "|---|---|---|---|"]
    lines += [f"| {r['check']} | {r['measured']} | {r['reference']} | "
              f"{'yes' if r['ok'] else 'NO'} |" for r in rows]
    return "\n".join(lines)


def run_checks(sizes: Sizes, device: str, work: Path) -> list[dict]:
    return (check_kernels(sizes, device) + check_statistics(sizes, device, work)
            + check_sweep_step(sizes, device) + check_factored_step(sizes, device))


def main(argv: list[str] | None = None) -> int:
    (fields,) = parse_configs([GpuCheckConfig], argv, "python benchmarks/gpu_check.py",
                              description=__doc__)
    a = GpuCheckConfig(**fields)
    check_device(a.device)  # one line on a machine without it, before any work
    sizes = SMALL if a.small else Sizes()
    header = (f"torch {torch.__version__}, device {a.device}"
              + (f" ({torch.cuda.get_device_name(a.device)})" if a.device.startswith("cuda")
                 else ""))
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as work:
        rows = run_checks(sizes, a.device, Path(work))
    text = f"{header}\n\n{table(rows)}\n"
    print(text)
    if a.out:
        write_text(a.out, text)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(run_main(main, "gpu_check"))
