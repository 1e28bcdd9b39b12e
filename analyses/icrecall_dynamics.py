"""Section C item 3: two-phase dynamics, with curvature at every stall and a 2x2 ablation.

Arms (same seeds, training prompts and perturbation draws): plain GD; large step only (eta0, no
perturbation); perturbation only (eta0 = eta, radius rho_p); PGD (both). Each run: monitor
P(correct relation | confusing prompt) on fresh prompts every log_every steps; final metrics on
n_test fresh prompts. A run has escaped when its final monitored P(correct | confusing) is
>= escape_at (the one-pair state gives ~0.75, uniform attention ~0.07).

Curvature (pythia_probe.toy.icrecall.curvature: exact float64 Hessian of the training loss in
W_PP): at W = 0 and after the large step (per seed), and at the end of every run that did not
escape (a stall): gradient norm, the relation column's effective eigenvalues and eigenvectors,
the loss change at distance rho_p along -/+ the lowest eigenvector, and the label (strict saddle,
one-sided saddle, degenerate plateau, minimum). At each stall also: escapes of ``draws`` random
PGD perturbations of radius rho_p followed by small GD steps. Seeds whose training prompts are
ambiguous on one pair only ("one-sided": attending the other pair is a global minimum of their
training loss) are flagged.

Writes results/icrecall/dynamics.parquet and dynamics.png.

    python analyses/icrecall_dynamics.py            # ~10-15 min on one CPU core
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime, timezone

import torch

from pythia_probe.cli import parse_configs, run_main
from pythia_probe.errors import BadInputError
from pythia_probe.results import make_rows, read_shard, write_manifest
from pythia_probe.toy.icrecall.curvature import LABELS, Escapes, classify_state, perturb_escapes
from pythia_probe.toy.icrecall.escape import ARMS, arm_config
from pythia_probe.toy.icrecall.evaluate import evaluate
from pythia_probe.toy.icrecall.experiment import (
    MODEL,
    EvalConfig,
    build_memory,
    history_rows,
    metric_rows,
    run_experiment,
)
from pythia_probe.toy.icrecall.memory import MemoryConfig
from pythia_probe.toy.icrecall.model import ICRecallModel
from pythia_probe.toy.icrecall.report import (
    OUT,
    key,
    parse_key,
    plot_rows,
    save,
    savefig,
    subplots,
)
from pythia_probe.toy.icrecall.task import Prompts, TaskConfig, make_kb, sample_prompts
from pythia_probe.toy.icrecall.train import TrainConfig, gd_step


@dataclass(frozen=True)
class Config:
    """seeds per arm; steps; n_train: N; escape_at: P(correct | confusing) counted as escaped;
    n_test: final test prompts; n_monitor: prompts for the curves and escape checks; log_every;
    draws: perturbations tried at each stall; stall_steps: GD steps after each."""

    seeds: int = 8
    steps: int = 3000
    n_train: int = 8
    escape_at: float = 0.95
    n_test: int = 5000
    n_monitor: int = 500
    log_every: int = 50
    draws: int = 5
    stall_steps: int = 1500

    def __post_init__(self) -> None:
        if self.seeds < 1 or self.steps < 2 or self.n_train < 1 or not 0 < self.escape_at < 1:
            raise BadInputError(f"invalid dynamics config {self}")


def first_step_at(history: list[dict], metric: str, level: float) -> float:
    """First logged step from which ``metric`` stays >= level to the end (nan if never)."""
    steps = [h["step"] for h in history]
    ok = [h[metric] >= level for h in history]
    for i in range(len(ok)):
        if all(ok[i:]):
            return steps[i]
    return float("nan")


def one_sided(p: Prompts) -> bool:
    """Every ambiguous training prompt is ambiguous on the same pair (or none is)."""
    amb = p.ambiguous
    return bool(amb[:, 0].sum() == 0 or amb[:, 1].sum() == 0)


def state_metrics(model: ICRecallModel, p: Prompts, prefix: str, reach: float) -> dict:
    """Curvature of the relation column at the model's W_PP, flattened for the table."""
    c = classify_state(model, p, reach=reach)
    ev = c["eigenvalues"]
    u = c["eigenvectors"][0][: model.q_rel + 1, model.q_rel]
    out = {f"{prefix}_label_code": float(LABELS.index(c["label"])),
           f"{prefix}_grad_norm": c["grad_norm"], f"{prefix}_loss": c["loss"],
           f"{prefix}_tol": c["tol"], f"{prefix}_escape_radius": c["escape_radius"],
           f"{prefix}_line_minus": c["line_minus"], f"{prefix}_line_plus": c["line_plus"]}
    out.update({f"{prefix}_eig{i + 1}": float(v) for i, v in enumerate(ev)})
    out.update({f"{prefix}_u1_{j}": float(x) for j, x in enumerate(u)})
    return {k: v for k, v in out.items() if v == v and abs(v) != float("inf")}


def seed_states(model: ICRecallModel, p: Prompts, tr: TrainConfig) -> dict:
    """Curvature at W = 0 and after PGD's large step (no perturbation)."""
    with torch.no_grad():
        model.W_PP.zero_()
    out = state_metrics(model, p, "init", tr.rho_p)
    gd_step(model, p, tr.eta0, tr.answer_weight)
    out.update(state_metrics(model, p, "after_large", tr.rho_p))
    return {**out, "one_sided": float(one_sided(p))}


def run(cfg: Config, progress: bool = True):
    task, mem_cfg = TaskConfig(), MemoryConfig()
    kb = make_kb(task)
    memory = build_memory(kb, mem_cfg)[0]
    mon = sample_prompts(kb, cfg.n_monitor, seed=10**6 + 1)

    def score(m: ICRecallModel) -> float:
        return evaluate(m, mon, n_boot=1)["relation_prob_confusing"]

    frames, summary = [], []
    for seed in range(cfg.seeds):
        p = sample_prompts(kb, cfg.n_train, seed=seed)
        states = seed_states(ICRecallModel(kb, memory), p, TrainConfig())
        frames.append(metric_rows(states, "icrecall_dynamics_states", 0, settings=key(seed=seed)))
        for arm in ARMS:
            tr = arm_config(arm, seed, cfg.n_train, cfg.steps, cfg.log_every)
            out = run_experiment(task, mem_cfg, tr, EvalConfig(n_test=cfg.n_test,
                                 n_monitor=cfg.n_monitor), memory=memory, progress=progress)
            h = out.result.history
            summ = {"escape_step": first_step_at(h, "relation_prob_confusing", cfg.escape_at),
                    "escaped": float(h[-1]["relation_prob_confusing"] >= cfg.escape_at),
                    "final_loss": h[-1]["loss"], "one_sided": states["one_sided"], **out.metrics}
            if not summ["escaped"]:
                summ.update(state_metrics(out.model, p, "stall", TrainConfig().rho_p))
                summ["stall_perturb_escapes"] = float(perturb_escapes(
                    out.model, p, score, Escapes(TrainConfig().rho_p, cfg.draws, cfg.stall_steps,
                                                 level=cfg.escape_at, seed=seed)))
                summ["stall_perturb_draws"] = float(cfg.draws)
            k = key(arm=arm, seed=seed)
            frames.append(history_rows(out.result, "icrecall_dynamics", settings=k))
            frames.append(metric_rows(summ, "icrecall_dynamics_summary", cfg.steps, settings=k))
            summary.append((arm, seed, summ))
            _print(arm, seed, summ)
    frames.append(make_rows([{"metric": "escape_level", "value": cfg.escape_at},
                             {"metric": "rho_p", "value": TrainConfig().rho_p}], model=MODEL,
                            analysis="icrecall_dynamics_settings"))
    return frames, summary


def _print(arm: str, seed: int, s: dict) -> None:
    txt = (f"{arm:>12} seed {seed}: P(correct | confusing) {s['relation_prob_confusing']:.4f}, "
           f"escape step {s['escape_step']}")
    if "stall_label_code" in s:
        txt += (f"; stall: {LABELS[int(s['stall_label_code'])]}, l1 {s['stall_eig1']:.2e}, "
                f"|g| {s['stall_grad_norm']:.1e}, perturbation escapes "
                f"{int(s['stall_perturb_escapes'])}/{int(s['stall_perturb_draws'])}")
    print(txt, flush=True)


def figure(df, n_train: int) -> None:
    """Curves per arm and the snapshot rows of PGD seed 0, read back from the table."""
    hist = df[df["analysis"] == "icrecall_dynamics"]
    fig, axes = subplots(2, 2, figsize=(11, 8))
    colors = {"gd": "tab:red", "large_only": "tab:orange", "perturb_only": "tab:green",
              "pgd": "tab:blue"}
    panels = [("loss", "training loss (CoT: relation + answer)"),
              ("relation_prob_confusing", "confusing prompts: P(correct relation)"),
              ("relation_acc_confusing", "confusing prompts: argmax relation accuracy")]
    for settings, g in hist.groupby("settings"):
        kv = parse_key(settings)
        kw = dict(color=colors[kv["arm"]], alpha=0.5, lw=1,
                  label=kv["arm"] if kv["seed"] == "0" else None)
        for ax, (metric, _) in zip(axes.flat, panels, strict=False):
            c = g[g["metric"] == metric].sort_values("step")
            ax.plot(c["step"].astype(float) + 1, c["value"], **kw)
    for ax, (metric, title) in zip(axes.flat, panels, strict=False):
        ax.set(title=title, xlabel="step + 1", xscale="log",
               yscale="log" if metric == "loss" else "linear")
        ax.legend(fontsize=7)
    snap = hist[hist["settings"] == key(arm="pgd", seed=0)]
    gd = hist[hist["settings"] == key(arm="gd", seed=0)]
    names = [f"attn_{x}" for x in ("s1", "a1", "s2", "a2", "s_query", "last")]

    def row(frame, name):
        v = dict(zip(frame["metric"], frame["value"], strict=True))
        return torch.tensor([v[f"snapshot_{name}_{m}"] for m in names])

    rows = {"init": row(snap, "init"), "after large step": row(snap, "after_large_step"),
            "after perturbation": row(snap, "after_perturbation"), "PGD end": row(snap, "end"),
            "GD end": row(gd, "end")}
    plot_rows(axes[1, 1], rows, f"relation-step attention rows (seed 0, N={n_train})")
    savefig(fig, "dynamics")


@dataclass(frozen=True)
class Replot:
    replot: bool = False
    """Only redraw the figure from the table."""


def main(argv: list[str] | None = None) -> int:
    started = datetime.now(timezone.utc)
    values = parse_configs([Config, Replot], argv, "python analyses/icrecall_dynamics.py", __doc__)
    cfg, ns = Config(**values[0]), Replot(**values[1])
    torch.set_num_threads(1)
    if ns.replot:
        figure(read_shard(OUT / "dynamics.parquet"), cfg.n_train)
        return 0
    frames, _ = run(cfg, progress=False)
    figure(read_shard(save(frames, "dynamics")), cfg.n_train)
    write_manifest(OUT / "manifest_dynamics", {**dataclasses.asdict(cfg),
                                               "TrainConfig": dataclasses.asdict(TrainConfig())},
                   argv=argv, started=started)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main, "python analyses/icrecall_dynamics.py"))
