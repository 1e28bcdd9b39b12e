"""The search for a memory in which plain GD stalls at a strict saddle that PGD's perturbation
escapes (issue #12 item 2), including spec B2's designs.

For each memory design: plain GD and PGD from W = 0 on the same N training prompts, several
seeds; final P(correct relation | confusing prompt) on fresh prompts (escaped: >= escape_at).
At every GD stall: the exact Hessian in W_PP and its label (curvature.py: strict saddle,
one-sided saddle, degenerate plateau, minimum), and how many of ``draws`` random PGD
perturbations of radius rho_p (then small GD steps) escape it. Seeds with one-sided training
prompts (see icrecall_dynamics.py) are flagged. Writes results/icrecall/saddle.parquet and
saddle.csv.

    python analyses/icrecall_saddle.py              # ~20-30 min on one CPU core
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime, timezone

import torch
from icrecall_dynamics import one_sided, state_metrics

from pythia_probe.cli import parse_configs, run_main
from pythia_probe.errors import BadInputError
from pythia_probe.results import read_shard, write_manifest
from pythia_probe.toy.icrecall import report
from pythia_probe.toy.icrecall.curvature import LABELS, Escapes, label_from_row, perturb_escapes
from pythia_probe.toy.icrecall.evaluate import evaluate
from pythia_probe.toy.icrecall.experiment import (
    EvalConfig,
    build_memory,
    metric_rows,
    run_experiment,
)
from pythia_probe.toy.icrecall.memory import MemoryConfig
from pythia_probe.toy.icrecall.report import OUT, key, save, wide
from pythia_probe.toy.icrecall.task import TaskConfig, make_kb, sample_prompts
from pythia_probe.toy.icrecall.train import TrainConfig

NO_DEAD = dict(threshold=0.0, smooth=0.0)
DESIGNS = {  # name -> MemoryConfig overrides; which have dead units at the one-pair state
    "andprod_default": {},  # threshold 0.035 between uniform (1/36) and pairwise (1/16) read-outs
    "andprod_beta200": dict(beta=200.0),
    "andprod_beta800": dict(beta=800.0),
    "andprod_smooth0.01": dict(smooth=0.01),  # softplus slope at the stall ~0.15, not ~1e-3
    "andprod_t0.025": dict(threshold=0.025, smooth=0.005),  # below the uniform read-out
    "product_beta30": dict(vote="product", beta=30.0, **NO_DEAD),  # spec B2's baseline
    "product_beta100": dict(vote="product", beta=100.0, **NO_DEAD),
    "product_beta300": dict(vote="product", beta=300.0, **NO_DEAD),
    "minsqrt_smooth": dict(vote="minpow", threshold=0.1, power=0.5, smooth=0.01, beta=100.0),
    "min_and_t0.18_hard": dict(vote="minpow", threshold=0.18, smooth=0.0, beta=150.0),  # B2 idea
}


@dataclass(frozen=True)
class Config:
    """designs (comma list of DESIGNS names, or 'all'); seeds per (design, method); steps;
    n_train N; n_test fresh prompts; escape_at: P(correct | confusing) counted as escaped;
    draws: perturbations tried at each GD stall; stall_steps: GD steps after each."""

    designs: str = "all"
    seeds: int = 8
    steps: int = 3000
    n_train: int = 8
    n_test: int = 2000
    escape_at: float = 0.95
    draws: int = 5
    stall_steps: int = 1500

    def __post_init__(self) -> None:
        bad = set(self.names) - set(DESIGNS)
        if bad or self.seeds < 1 or self.steps < 1 or not 0 < self.escape_at < 1:
            raise BadInputError(f"invalid saddle config {self} (unknown designs: {sorted(bad)})")

    @property
    def names(self) -> list[str]:
        return list(DESIGNS) if self.designs == "all" else self.designs.split(",")


def run_design(name: str, cfg: Config) -> list:
    """GD and PGD runs of one design; curvature and perturbation escapes at each GD stall."""
    task = TaskConfig()
    mem_cfg = dataclasses.replace(MemoryConfig(), **DESIGNS[name])
    kb = make_kb(task)
    memory = build_memory(kb, mem_cfg)[0]
    mon = sample_prompts(kb, 500, seed=10**6 + 1)

    def score(m) -> float:
        return evaluate(m, mon, n_boot=1)["relation_prob_confusing"]

    frames = []
    for seed in range(cfg.seeds):
        p = sample_prompts(kb, cfg.n_train, seed=seed)
        for method in ("gd", "pgd"):
            tr = TrainConfig(method=method, n_train=cfg.n_train, steps=cfg.steps, seed=seed)
            out = run_experiment(task, mem_cfg, tr, EvalConfig(n_test=cfg.n_test, n_monitor=0),
                                 memory=memory)
            m = {**out.metrics, "one_sided": float(one_sided(p)),
                 "escaped": float(out.metrics["relation_prob_confusing"] >= cfg.escape_at)}
            if method == "gd" and not m["escaped"]:
                m.update(state_metrics(out.model, p, "stall", tr.rho_p))
                m["stall_perturb_escapes"] = float(perturb_escapes(
                    out.model, p, score, Escapes(tr.rho_p, cfg.draws, cfg.stall_steps,
                                                 level=cfg.escape_at, seed=seed)))
                m["stall_perturb_draws"] = float(cfg.draws)
            frames.append(metric_rows(m, "icrecall_saddle", cfg.steps,
                                      settings=key(design=name, method=method, seed=seed)))
            _print(name, method, seed, m)
    return frames


def _print(name: str, method: str, seed: int, m: dict) -> None:
    txt = f"{name:>20} {method:>3} seed {seed}: P(correct | confusing) " \
          f"{m['relation_prob_confusing']:.3f}"
    if "stall_label_code" in m:
        txt += (f"; stall {LABELS[int(m['stall_label_code'])]}, l1 {m['stall_eig1']:.1e}, "
                f"|g| {m['stall_grad_norm']:.1e}, perturbation escapes "
                f"{int(m['stall_perturb_escapes'])}/{int(m['stall_perturb_draws'])}")
    print(txt, flush=True)


COLUMNS = ["design", "method", "seed", "one_sided", "relation_prob_confusing", "relation_sampled",
           "relation_acc", "stall_eig1", "stall_grad_norm",
           "stall_escape_radius", "stall_line_minus", "stall_line_plus", "stall_perturb_escapes",
           "attn_s1", "attn_a1", "attn_s2", "attn_a2", "attn_s_query", "attn_last"]


def write_csv(path) -> None:
    """saddle.csv next to the table: one row per run, the stall's label recomputed from its
    stored curvature (curvature.label_from_row)."""
    w = wide(read_shard(path))
    w["stall_label"] = [label_from_row(r, "stall", TrainConfig().rho_p)
                        if r.get("stall_eig1") == r.get("stall_eig1") else ""
                        for _, r in w.iterrows()]
    cols = [c for c in COLUMNS if c in w.columns] + ["stall_label"]
    report.write_csv(path.parent / "saddle.csv", w[cols].round(6))


@dataclass(frozen=True)
class CsvOnly:
    csv_only: bool = False
    """Only rewrite saddle.csv from the table."""


def main(argv: list[str] | None = None) -> int:
    started = datetime.now(timezone.utc)
    values = parse_configs([Config, CsvOnly], argv, "python analyses/icrecall_saddle.py", __doc__)
    cfg, ns = Config(**values[0]), CsvOnly(**values[1])
    torch.set_num_threads(1)
    if ns.csv_only:
        write_csv(OUT / "saddle.parquet")
        return 0
    frames = [f for name in cfg.names for f in run_design(name, cfg)]
    write_csv(save(frames, "saddle"))
    write_manifest(OUT / "manifest_saddle", {**dataclasses.asdict(cfg), "designs": DESIGNS},
                   argv=argv, started=started)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main, "python analyses/icrecall_saddle.py"))
