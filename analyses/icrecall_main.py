"""Section C items 1 and 2: the converged pattern and the accuracies on fresh prompts.

Default design (constructed andprod memory, n = 2000 triples, N = 8 fine-tuning prompts, PGD),
several seeds, each evaluated on n_test fresh prompts with true two-step decoding; plain GD for
comparison. Writes results/icrecall/main.parquet and results/icrecall/pattern.png.

    python analyses/icrecall_main.py                # ~2 min on one CPU core
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import matplotlib.pyplot as plt
import torch

from pythia_probe.results import write_manifest
from pythia_probe.toy.icrecall.experiment import EvalConfig, run_experiment
from pythia_probe.toy.icrecall.memory import MemoryConfig
from pythia_probe.toy.icrecall.report import (
    OUT,
    config_dict,
    config_from,
    config_parser,
    outcome_rows,
    plot_rows,
    save,
    savefig,
)
from pythia_probe.toy.icrecall.task import TaskConfig
from pythia_probe.toy.icrecall.train import TrainConfig


@dataclass(frozen=True)
class Config:
    """seeds per method; n_test fresh prompts per run (>= 20000 to certify 99.9%); n_train: N."""

    seeds: int = 3
    n_test: int = 20000
    n_train: int = 8
    methods: str = "pgd,gd"

    def __post_init__(self) -> None:
        if self.seeds < 1 or self.n_test < 1 or self.n_train < 1:
            raise ValueError(f"seeds, n_test, n_train must be >= 1: {self}")
        bad = set(self.methods.split(",")) - {"pgd", "gd"}
        if bad:
            raise ValueError(f"unknown methods {sorted(bad)}; valid: pgd, gd")


def main(argv: list[str] | None = None) -> int:
    p = config_parser(Config, __doc__)
    cfg = config_from(Config, p.parse_args(argv))
    torch.set_num_threads(1)
    task, mem = TaskConfig(), MemoryConfig()
    frames, rows = [], {}
    for method in cfg.methods.split(","):
        for seed in range(cfg.seeds):
            tr = TrainConfig(method=method, n_train=cfg.n_train, seed=seed)
            out = run_experiment(task, mem, tr, EvalConfig(n_test=cfg.n_test, n_monitor=0))
            frames.append(outcome_rows(out, "icrecall_main", tr.steps, method=method, seed=seed,
                                       n_train=cfg.n_train))
            row = out.model.attention_row(out.model.q_rel).detach()
            rows[f"{method.upper()} seed {seed}"] = row
            m = out.metrics
            print(f"{method} seed {seed}: relation {m['relation_acc']:.5f} (confusing "
                  f"{m['relation_acc_confusing']:.5f}), answer {m['answer_acc']:.5f}, "
                  f"gap {m['pair_gap_max']:.3f}, off-pair {m['offpair_mass']:.3f}")
    save(frames, "main")
    fig, ax = plt.subplots(figsize=(9, 4))
    plot_rows(ax, rows, f"converged relation-step rows, N={cfg.n_train} "
              "(paper: v* = (a, a, 1/2-a, 1/2-a, 0, 0))")
    savefig(fig, "pattern")
    write_manifest(OUT / "manifest_main", {**dataclasses.asdict(cfg),
                                           **config_dict(task, mem, TrainConfig())}, argv=argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
