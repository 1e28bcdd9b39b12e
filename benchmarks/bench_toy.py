"""Toy-model training speed: the fast model vs a straightforward dense one, and FLOP/s.

Both implement Def. 3.1 with the same weights; the dense baseline multiplies dense one-hot
matrices in every layer (the way the equations are written). Prints training tokens/s of each,
their ratio, the fast model's achieved matmul FLOP/s, and that as a fraction of this machine's
dense float32 matmul FLOP/s (2048^2 x 2048^2) measured in the same run. Then the trainer's
subnormal flush: a step from the zero-initialised model after 3 SGD steps at lr 0.03 (where
the weights' tiny products are subnormal floats), with and without flushing them to zero. Calls
are interleaved and the fastest of --reps rounds is kept, so load from other processes biases
neither side.

    python benchmarks/bench_toy.py --vocab 509 --seq-len 64 --layers 3 --batch 128
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pythia_probe.cli import parse_config, run_main
from pythia_probe.toy.model import (
    AttnOnlyTransformer,
    ToyConfig,
    choose_mode,
    positional_bias,
    train_flops,
)


def dense_logits(model: AttnOnlyTransformer, tokens: torch.Tensor) -> torch.Tensor:
    """Def. 3.1 literally: dense one-hot X and dense matmuls in every layer."""
    h = F.one_hot(tokens, model.cfg.d_vocab).to(model.W_O.dtype)
    bias = positional_bias(model.P, tokens.shape[1])
    for layer in range(model.cfg.n_layers):
        logits = h @ model.W[layer] @ h.transpose(1, 2) + bias[layer]
        h = h + torch.softmax(logits, dim=-1) @ h @ model.V[layer]
    return h @ model.W_O


def train_step(model: AttnOnlyTransformer, seqs: torch.Tensor, forward, lr: float = 0.01) -> float:
    logits = forward(seqs[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), seqs[:, 1:].reshape(-1))
    model.zero_grad(set_to_none=True)
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(p.grad, alpha=-lr)
    return float(loss.detach())


def best_seconds(fns: dict, reps: int) -> dict[str, float]:
    """Min wall time per call of each fn, calls interleaved (fair under shared-machine load)."""
    for fn in fns.values():
        fn()  # warm-up
    best = {name: float("inf") for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def random_weights(model: AttnOnlyTransformer) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.05)


@dataclass(frozen=True)
class BenchConfig:
    """Model shape and timing rounds."""

    vocab: int = 509
    """|V|."""
    seq_len: int = 64
    """T."""
    layers: int = 3
    """L."""
    batch: int = 128
    """Sequences per step."""
    reps: int = 5
    """Interleaved rounds; the minimum time is kept."""
    threads: int = 0
    """torch threads (0 = torch's default)."""


def subnormal_ratio(a: BenchConfig) -> tuple[float, float]:
    """Seconds of one SGD step (lr 0.03) after 3 from zero, without and with the flush."""
    from pythia_probe.toy.train import sgd_step, subnormals_flushed

    cfg = ToyConfig(a.vocab, a.seq_len, a.layers)
    seqs = torch.randint(0, a.vocab, (a.batch, a.seq_len + 1),
                         generator=torch.Generator().manual_seed(1))
    model = AttnOnlyTransformer(cfg)
    params = list(model.parameters())
    for _ in range(3):
        sgd_step(model, params, seqs, 0.03)
    saved = [p.detach().clone() for p in params]

    def step(flush: bool) -> None:
        with torch.no_grad():
            for p, s in zip(params, saved, strict=True):
                p.copy_(s)
        if flush:
            with subnormals_flushed(torch.device("cpu")):
                sgd_step(model, params, seqs, 0.03)
        else:
            sgd_step(model, params, seqs, 0.03)

    best = best_seconds({"plain": lambda: step(False), "flushed": lambda: step(True)},
                        max(1, a.reps // 2))
    return best["plain"], best["flushed"]


def main(argv: list[str] | None = None) -> int:
    a = parse_config(BenchConfig, argv, "python benchmarks/bench_toy.py")
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    cfg = ToyConfig(a.vocab, a.seq_len, a.layers)
    models = {m: AttnOnlyTransformer(cfg, mode=m) for m in ("dense", "paths")}
    for m in models.values():
        torch.manual_seed(0)
        random_weights(m)
    base = models["dense"]
    seqs = torch.randint(0, a.vocab, (a.batch, a.seq_len + 1))
    with torch.no_grad():
        ref = dense_logits(base, seqs[:, :-1])
        diff = max(float((m(seqs[:, :-1]) - ref).abs().max()) for m in models.values())
    tokens = a.batch * a.seq_len
    a_mat, b_mat = torch.randn(2048, 2048), torch.randn(2048, 2048)
    fns = {f"fast ({k} mode)": (lambda m=m: train_step(m, seqs, m)) for k, m in models.items()}
    fns["baseline (dense one-hot)"] = lambda: train_step(base, seqs,
                                                         lambda x: dense_logits(base, x))
    best = best_seconds({**fns, "matmul": lambda: a_mat @ b_mat}, a.reps)
    peak = 2 * 2048**3 / best.pop("matmul")
    auto = choose_mode(cfg, a.batch, a.seq_len)
    print(f"config: |V|={a.vocab} T={a.seq_len} L={a.layers} batch={a.batch} float32 "
          f"threads={torch.get_num_threads()}  max |fast - baseline| logits = {diff:.2e}; "
          f"mode='auto' picks {auto!r}; dense 2048^2 matmul {peak / 1e9:.1f} GFLOP/s")
    t_base = best["baseline (dense one-hot)"]
    for name, t in best.items():
        mode = name[6:11] if name.startswith("fast") else None
        line = f"{name:26s} {tokens / t:10.0f} tokens/s  {t_base / t:5.2f}x baseline"
        if mode:
            flops = train_flops(cfg, a.batch, a.seq_len, mode)
            line += (f"  {flops / tokens / 1e6:6.1f} MFLOP/token  {flops / t / 1e9:6.1f} GFLOP/s"
                     f" = {flops / t / peak:.1%} of matmul")
        print(line)
    plain, flushed = subnormal_ratio(a)
    print(f"SGD step after 3 steps at lr 0.03: {plain:.3f} s with subnormal floats, "
          f"{flushed:.3f} s flushed to zero = {plain / flushed:.1f}x (the trainer flushes on CPU)")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main, "python benchmarks/bench_toy.py"))
