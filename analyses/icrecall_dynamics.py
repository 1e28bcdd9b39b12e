"""Section C item 3: two-phase dynamics, plain GD versus PGD (Algorithm 1).

Writes results/icrecall/dynamics.parquet (history rows per method and seed; snapshot rows;
summary rows: steps to escape, plateau length, final loss, and a saddle check at the GD plateau)
and results/icrecall/dynamics.png.

    python analyses/icrecall_dynamics.py            # ~2-4 min on one CPU core
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import matplotlib.pyplot as plt
import torch

from pythia_probe.results import make_rows, read_shard, write_manifest
from pythia_probe.toy.icrecall.experiment import (
    MODEL,
    EvalConfig,
    history_rows,
    metric_rows,
    run_experiment,
)
from pythia_probe.toy.icrecall.memory import MemoryConfig
from pythia_probe.toy.icrecall.report import (
    OUT,
    config_from,
    config_parser,
    key,
    parse_key,
    plot_rows,
    save,
    savefig,
)
from pythia_probe.toy.icrecall.task import TaskConfig, sample_prompts
from pythia_probe.toy.icrecall.train import TrainConfig


@dataclass(frozen=True)
class Config:
    """seeds: fine-tuning seeds; steps: gradient steps for both methods; n_train: N;
    escape_at: relation_prob_confusing level counted as escaped; n_test: final test prompts."""

    seeds: int = 5
    steps: int = 3000
    n_train: int = 8
    escape_at: float = 0.95
    n_test: int = 5000

    def __post_init__(self) -> None:
        if self.seeds < 1 or self.steps < 2 or self.n_train < 1 or not 0 < self.escape_at < 1:
            raise ValueError(f"invalid dynamics config {self}")


def first_step_at(history: list[dict], metric: str, level: float) -> float:
    """First logged step from which ``metric`` stays >= level to the end (nan if never)."""
    steps = [h["step"] for h in history]
    ok = [h[metric] >= level for h in history]
    for i in range(len(ok)):
        if all(ok[i:]):
            return steps[i]
    return float("nan")


def saddle_check(out, n_train: int, seed: int, eps: float = 0.005) -> dict[str, float]:
    """At the final W of a run: gradient norm, and the training loss along the straight path (in
    attention-row space, other rows fixed) from the final relation row to the balanced pairwise
    row ((1-2 eps)/4 on each pair token, eps on s_query and '?'). A path with no rise (barrier
    <= 0) that ends lower means the end state is not a local minimum."""
    model, kb = out.model, out.kb
    p = sample_prompts(kb, n_train, seed=seed)
    model.zero_grad()
    base = model.loss(p)["loss"]
    base.backward()
    res = {"check_grad_norm": float(model.W_PP.grad.norm()), "check_loss": float(base.detach())}
    q = model.q_rel
    W0 = model.W_PP.detach().clone()
    v0 = model.attention_row(q).detach()
    target = torch.full_like(v0, (1 - 2 * eps) / 4)
    target[-2:] = eps
    losses = []
    with torch.no_grad():
        for lam in torch.linspace(0, 1, 21).tolist():
            model.W_PP[: q + 1, q] = torch.log((1 - lam) * v0 + lam * target)
            losses.append(float(model.loss(p)["loss"]))
        model.W_PP.copy_(W0)
    res["check_path_barrier"] = max(losses) - losses[0]
    res["check_path_end_minus_start"] = losses[-1] - losses[0]
    return res


def run(cfg: Config, progress: bool = True):
    task, mem = TaskConfig(), MemoryConfig()
    frames, curves, snaps, summary = [], {}, {}, []
    for method in ("gd", "pgd"):
        for seed in range(cfg.seeds):
            tr = TrainConfig(method=method, n_train=cfg.n_train, steps=cfg.steps, seed=seed)
            out = run_experiment(task, mem, tr, EvalConfig(n_test=cfg.n_test), progress=progress)
            k = key(method=method, seed=seed)
            frames.append(history_rows(out.result, "icrecall_dynamics", run_id=k))
            summ = {"escape_step": first_step_at(out.result.history, "relation_prob_confusing",
                                                 cfg.escape_at),
                    "final_loss": out.result.history[-1]["loss"], **out.metrics,
                    **saddle_check(out, cfg.n_train, seed)}
            frames.append(metric_rows(summ, "icrecall_dynamics_summary", cfg.steps, run_id=k))
            summary.append((method, seed, summ))
            curves[(method, seed)] = out.result.history
            snaps[(method, seed)] = out.result.snapshots
    frames.append(make_rows([{"metric": "escape_level", "value": cfg.escape_at}], model=MODEL,
                            analysis="icrecall_dynamics_settings"))
    return frames, curves, snaps, summary


def figure(df, n_train: int) -> None:
    """Curves and snapshot rows, read back from the dynamics table."""
    hist = df[df["analysis"] == "icrecall_dynamics"]
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    colors = {"gd": "tab:red", "pgd": "tab:blue"}
    panels = [("loss", "training loss (CoT: relation + answer)"),
              ("relation_prob_confusing", "confusing prompts: P(correct relation)"),
              ("relation_acc_confusing", "confusing prompts: argmax relation accuracy")]
    for run_id, g in hist.groupby("run_id"):
        kv = parse_key(run_id)
        kw = dict(color=colors[kv["method"]], alpha=0.7,
                  label=kv["method"].upper() if kv["seed"] == "0" else None)
        for ax, (metric, _) in zip(axes.flat, panels, strict=False):
            c = g[g["metric"] == metric].sort_values("step")
            ax.plot(c["step"].astype(float) + 1, c["value"], **kw)
    for ax, (metric, title) in zip(axes.flat, panels, strict=False):
        ax.set(title=title, xlabel="step + 1", xscale="log", yscale="log" if metric == "loss"
               else "linear")
        ax.legend()
    snap = hist[hist["run_id"] == key(method="pgd", seed=0)]
    gd = hist[hist["run_id"] == key(method="gd", seed=0)]
    names = [f"attn_{x}" for x in ("s1", "a1", "s2", "a2", "s_query", "last")]

    def row(frame, name):
        v = dict(zip(frame["metric"], frame["value"], strict=True))
        return torch.tensor([v[f"snapshot_{name}_{m}"] for m in names])

    rows = {"init": row(snap, "init"), "after large step": row(snap, "after_large_step"),
            "after perturbation": row(snap, "after_perturbation"), "PGD end": row(snap, "end"),
            "GD end": row(gd, "end")}
    plot_rows(axes[1, 1], rows, f"relation-step attention rows (seed 0, N={n_train})")
    savefig(fig, "dynamics")


def main(argv: list[str] | None = None) -> int:
    p = config_parser(Config, __doc__)
    p.add_argument("--replot", action="store_true", help="redraw the figure from the table")
    ns = p.parse_args(argv)
    cfg = config_from(Config, ns)
    torch.set_num_threads(1)
    if ns.replot:
        figure(read_shard(OUT / "dynamics.parquet"), cfg.n_train)
        return 0
    frames, curves, snaps, summary = run(cfg)
    figure(read_shard(save(frames, "dynamics")), cfg.n_train)
    write_manifest(OUT / "manifest_dynamics", dataclasses.asdict(cfg), argv=argv)
    names = ["attn_s1", "attn_a1", "attn_s2", "attn_a2", "attn_s_query", "attn_last"]
    for method, seed, s in summary:
        print(f"{method:>3} seed {seed}: escape step {s['escape_step']}, final loss "
              f"{s['final_loss']:.2e}, P(correct | confusing) {s['relation_prob_confusing']:.4f}, "
              "pattern " + " ".join(f"{s[k]:.2f}" for k in names))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
