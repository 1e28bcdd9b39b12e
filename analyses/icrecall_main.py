"""Section C items 1 and 2: the converged pattern and the accuracies on fresh prompts.

Default design (constructed andprod memory, n = 2000 triples, N = 8 fine-tuning prompts, PGD),
several seeds, each evaluated on n_test fresh prompts with true two-step decoding (argmax, and
sampled at the memory's temperature) and P(correct relation | confusing prompt); plain GD for
comparison. Also the reference rows (uniform, stuck one-pair GD state, one pair, ideal) on the
same memory and prompts: the measures a verdict uses must fail the first three. Writes
results/icrecall/main.parquet, controls.parquet and pattern.png.

    python analyses/icrecall_main.py                # ~5 min on one CPU core
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime, timezone

import torch

from pythia_probe.cli import parse_config, run_main
from pythia_probe.errors import BadInputError
from pythia_probe.results import write_manifest
from pythia_probe.toy.icrecall.experiment import (
    EvalConfig,
    evaluate_controls,
    metric_rows,
    run_experiment,
)
from pythia_probe.toy.icrecall.memory import MemoryConfig
from pythia_probe.toy.icrecall.report import (
    OUT,
    config_dict,
    key,
    outcome_rows,
    plot_rows,
    save,
    savefig,
    subplots,
)
from pythia_probe.toy.icrecall.task import TaskConfig, sample_prompts
from pythia_probe.toy.icrecall.train import TrainConfig


@dataclass(frozen=True)
class Config:
    """seeds per method; n_test fresh prompts per run (>= 20000 to certify 99.9%); n_train: N."""

    seeds: int = 5
    n_test: int = 20000
    n_train: int = 8
    methods: str = "pgd,gd"

    def __post_init__(self) -> None:
        if self.seeds < 1 or self.n_test < 1 or self.n_train < 1:
            raise BadInputError(f"seeds, n_test, n_train must be >= 1: {self}")
        bad = set(self.methods.split(",")) - {"pgd", "gd"}
        if bad:
            raise BadInputError(f"unknown methods {sorted(bad)}; valid: pgd, gd")


def main(argv: list[str] | None = None) -> int:
    started = datetime.now(timezone.utc)
    cfg = parse_config(Config, argv, "python analyses/icrecall_main.py")
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
            _print(f"{method} seed {seed}", m)
    save(frames, "main")
    save(controls(out.model, cfg.n_test), "controls")
    fig, ax = subplots(figsize=(9, 4))
    plot_rows(ax, rows, f"converged relation-step rows, N={cfg.n_train} "
              "(paper: v* = (a, a, 1/2-a, 1/2-a, 0, 0))")
    savefig(fig, "pattern")
    write_manifest(OUT / "manifest_main", {**dataclasses.asdict(cfg),
                                           **config_dict(task, mem, TrainConfig())},
                   argv=argv, started=started)
    return 0


def _print(name: str, m: dict) -> None:
    print(f"{name}: P(correct | confusing) {m['relation_prob_confusing']:.4f}, sampled relation "
          f"{m['relation_sampled']:.5f}, answer {m['answer_sampled']:.5f} (argmax "
          f"{m['relation_acc']:.5f}, {m['answer_acc']:.5f}), gap {m['pair_gap_max']:.3f}, "
          f"off-pair {m['offpair_mass']:.3f}", flush=True)


def controls(model, n_test: int, memory: str = "constructed") -> list:
    """Rows of the reference attention states on the model's memory (the test prompts of
    EvalConfig's default seed)."""
    test = sample_prompts(model.kb, n_test, seed=EvalConfig().test_seed)
    frames = []
    for state, m in evaluate_controls(model, test, seed=EvalConfig().test_seed).items():
        frames.append(metric_rows(m, "icrecall_controls", 0, int(m["n_all"]),
                                  settings=key(memory=memory, state=state)))
        _print(f"control {state}", m)
    return frames


if __name__ == "__main__":
    raise SystemExit(run_main(main, "python analyses/icrecall_main.py"))
