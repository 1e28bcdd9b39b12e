"""Section C item 4: accuracy against the number N of fine-tuning samples, for n = |S||R| stored
triples over two orders of magnitude, several seeds; the smallest N reaching the target accuracy.

Writes results/icrecall/samples.parquet and results/icrecall/samples.png.

    python analyses/icrecall_samples.py             # ~10 min on one CPU core (n = 1e5 dominates)
    python analyses/icrecall_samples.py --ns 1000,10000 --seeds 2    # quicker
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import matplotlib.pyplot as plt
import pandas as pd
import torch
from tqdm.auto import tqdm

from pythia_probe.results import make_rows, read_shard, write_manifest
from pythia_probe.toy.icrecall.experiment import MODEL, EvalConfig, build_memory, run_experiment
from pythia_probe.toy.icrecall.memory import MemoryConfig
from pythia_probe.toy.icrecall.report import (
    OUT,
    config_dict,
    config_from,
    config_parser,
    key,
    outcome_rows,
    save,
    savefig,
    wide,
)
from pythia_probe.toy.icrecall.task import TaskConfig, make_kb
from pythia_probe.toy.icrecall.train import TrainConfig


@dataclass(frozen=True)
class Config:
    """ns: stored triples n (comma list; n_subjects = n / n_relations); Ns: fine-tuning sample
    counts; seeds per (n, N); steps of PGD; n_test fresh prompts per run; target accuracy."""

    ns: str = "1000,10000,100000"
    Ns: str = "2,4,8,16,32,64"
    seeds: int = 3
    n_relations: int = 20
    steps: int = 300
    n_test: int = 2000
    target: float = 0.99

    def __post_init__(self) -> None:
        for n in self.n_list:
            if n % self.n_relations:
                raise ValueError(f"each n must be a multiple of n_relations={self.n_relations}, "
                                 f"got {n}")
        if min(self.N_list) < 1 or self.seeds < 1 or self.steps < 1 or not 0 < self.target <= 1:
            raise ValueError(f"invalid samples config {self}")

    @property
    def n_list(self) -> list[int]:
        return [int(x) for x in self.ns.split(",")]

    @property
    def N_list(self) -> list[int]:
        return [int(x) for x in self.Ns.split(",")]


def smallest_N(w, target: float, metric: str = "relation_acc") -> dict[tuple[int, int], float]:
    """(n, seed) -> smallest N from which every run with N' >= N reaches ``target`` (nan if the
    largest N does not)."""
    out = {}
    for (n, seed), g in w.groupby(["n", "seed"]):
        g = g.sort_values("N")
        ok = (g[metric] >= target).tolist()
        Ns = g["N"].tolist()
        out[(int(n), int(seed))] = next((float(Ns[i]) for i in range(len(ok)) if all(ok[i:])),
                                        float("nan"))
    return out


def main(argv: list[str] | None = None) -> int:
    p = config_parser(Config, __doc__)
    p.add_argument("--replot", action="store_true",
                   help="recompute smallest N and redraw from results/icrecall/samples.parquet")
    ns = p.parse_args(argv)
    cfg = config_from(Config, ns)
    torch.set_num_threads(1)
    if ns.replot:
        old = read_shard(OUT / "samples.parquet")
        frames = [old[old["analysis"] == "icrecall_samples"]]
        return _finish(frames, cfg, argv, manifest=False)
    mem_cfg, frames = MemoryConfig(), []
    runs = [(n, N, s) for n in cfg.n_list for N in cfg.N_list for s in range(cfg.seeds)]
    memories = {}
    for n, N, seed in tqdm(runs, desc="icrecall samples"):
        task = TaskConfig(n_subjects=n // cfg.n_relations, n_relations=cfg.n_relations)
        if n not in memories:
            memories = {n: build_memory(make_kb(task), mem_cfg)[0]}  # keep one n in memory
        tr = TrainConfig(n_train=N, steps=cfg.steps, seed=seed)
        out = run_experiment(task, mem_cfg, tr, EvalConfig(n_test=cfg.n_test, n_monitor=0),
                             memory=memories[n])
        frames.append(outcome_rows(out, "icrecall_samples", cfg.steps, n=n, N=N, seed=seed))
    return _finish(frames, cfg, argv)


def _finish(frames, cfg: Config, argv, manifest: bool = True) -> int:
    """Smallest-N rows, the table, the figure and (after a real run) the manifest."""
    w = wide(pd.concat(frames))
    w[["n", "N", "seed"]] = w[["n", "N", "seed"]].astype(int)
    best = smallest_N(w, cfg.target)
    frames.append(make_rows([{"metric": "smallest_N_at_target", "value": v,
                              "run_id": key(n=n, seed=s)} for (n, s), v in best.items()],
                            model=MODEL, analysis="icrecall_samples_smallest_N"))
    frames.append(make_rows([{"metric": "target", "value": cfg.target}], model=MODEL,
                            analysis="icrecall_samples_settings"))
    save(frames, "samples")
    _figure(w, best, cfg)
    if manifest:
        write_manifest(OUT / "manifest_samples", {**dataclasses.asdict(cfg),
                                                  **config_dict(MemoryConfig(), TrainConfig())},
                       argv=argv)
    for (n, s), v in sorted(best.items()):
        print(f"n={n:>7} seed {s}: smallest N from which relation_acc >= {cfg.target}: {v}")
    return 0


def _figure(w, best, cfg: Config) -> None:
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for n, g in w.groupby("n"):
        m = g.groupby("N")[["relation_acc", "answer_acc"]].agg(["mean", "min"])
        axes[0].errorbar(m.index, m[("relation_acc", "mean")],
                         yerr=[m[("relation_acc", "mean")] - m[("relation_acc", "min")],
                               0 * m[("relation_acc", "mean")]],
                         marker="o", capsize=3, label=f"n={n}")
        axes[1].plot(m.index, m[("answer_acc", "mean")], marker="o", label=f"n={n}")
    for ax, t in zip(axes[:2], ("relation accuracy", "answer accuracy (two-step)"), strict=True):
        ax.set(xscale="log", xlabel="fine-tuning samples N", title=f"{t}: mean (bar to min)")
        ax.set_xticks(cfg.N_list, [str(N) for N in cfg.N_list])
        ax.minorticks_off()
        ax.axhline(cfg.target, color="gray", ls="--")
        ax.legend()
    ns = sorted({n for n, _ in best})
    for s in range(cfg.seeds):
        axes[2].plot([math.log(n) for n in ns], [best[(n, s)] for n in ns], "o-", alpha=0.6,
                     label=f"seed {s}")
    axes[2].set(xlabel="log n", ylabel=f"smallest N (all larger N reach {cfg.target})",
                yscale="log", title="sample complexity vs log n")
    axes[2].legend()
    savefig(fig, "samples")


if __name__ == "__main__":
    raise SystemExit(main())
