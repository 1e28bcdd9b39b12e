"""The memory designs tried for the saddle (spec B2's untested ideas and ours), GD vs PGD.

For each design: several seeds of plain GD and PGD (N = 8, n = 2000), recording the final
P(correct relation | confusing prompt) on fresh prompts (0.5-0.75 = one pair only: the confused
state), the escape step, the final training loss and the final pattern. Writes
results/icrecall/design.parquet and design.csv.

    python analyses/icrecall_design.py              # ~3-5 min on one CPU core
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from pythia_probe.results import read_shard, write_manifest
from pythia_probe.toy.icrecall.experiment import EvalConfig, metric_rows, run_experiment
from pythia_probe.toy.icrecall.memory import MemoryConfig
from pythia_probe.toy.icrecall.report import OUT, config_from, config_parser, key, save, wide
from pythia_probe.toy.icrecall.task import TaskConfig
from pythia_probe.toy.icrecall.train import TrainConfig

DESIGNS = {  # name -> MemoryConfig overrides (B2's baseline, B2's two untested ideas, ours)
    "product_b30": dict(vote="product", threshold=0.0, smooth=0.0, beta=30.0),
    "product_b100": dict(vote="product", threshold=0.0, smooth=0.0, beta=100.0),
    "min_sqrt_b30": dict(vote="minpow", threshold=0.03, power=0.5, smooth=0.0, beta=30.0),
    "min_and_t0.18": dict(vote="minpow", threshold=0.18, smooth=0.0, beta=150.0),
    "min_and_t0.18_soft": dict(vote="minpow", threshold=0.18, smooth=0.005, beta=150.0),
    "andprod_default": {},
}


@dataclass(frozen=True)
class Config:
    """seeds per (design, method); steps; n_train N; n_test fresh prompts; escape level."""

    seeds: int = 3
    steps: int = 1000
    n_train: int = 8
    n_test: int = 2000
    escape_at: float = 0.95


def _escape(history: list[dict], level: float) -> float:
    for i, h in enumerate(history):
        if all(x["relation_prob_confusing"] >= level for x in history[i:]):
            return h["step"]
    return float("nan")


def main(argv: list[str] | None = None) -> int:
    p = config_parser(Config, __doc__)
    cfg = config_from(Config, p.parse_args(argv))
    torch.set_num_threads(1)
    frames = []
    for name, over in DESIGNS.items():
        mem = dataclasses.replace(MemoryConfig(), **over)
        for method in ("gd", "pgd"):
            for seed in range(cfg.seeds):
                tr = TrainConfig(method=method, n_train=cfg.n_train, steps=cfg.steps, seed=seed,
                                 log_every=20)
                out = run_experiment(TaskConfig(), mem, tr,
                                     EvalConfig(n_test=cfg.n_test, n_monitor=500))
                m = {**out.metrics, "escape_step": _escape(out.result.history, cfg.escape_at)}
                frames.append(metric_rows(m, "icrecall_design", cfg.steps,
                                          run_id=key(design=name, method=method, seed=seed)))
                row = " ".join(f"{m[k]:.2f}" for k in ("attn_s1", "attn_a1", "attn_s2",
                                                         "attn_a2", "attn_s_query", "attn_last"))
                print(f"{name:>20} {method:>3} seed {seed}: P(correct | confusing) "
                      f"{m['relation_prob_confusing']:.3f}, argmax "
                      f"{m['relation_acc_confusing']:.4f}, escape {m['escape_step']}, "
                      f"loss {m['final_train_loss']:.1e}, row {row}", flush=True)
    path = save(frames, "design")
    cols = ["design", "method", "seed", "relation_prob_confusing", "relation_acc_confusing",
            "escape_step", "final_train_loss", "attn_s1", "attn_a1", "attn_s2", "attn_a2",
            "attn_s_query", "attn_last"]
    wide(read_shard(path))[cols].round(4).to_csv(OUT / "design.csv", index=False)
    write_manifest(OUT / "manifest_design", {**dataclasses.asdict(cfg), "designs": DESIGNS},
                   argv=argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
