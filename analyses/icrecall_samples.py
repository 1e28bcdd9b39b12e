"""Section C item 4: the fine-tuning samples needed as the memory grows, in a regime where n
matters.

Regime. n = |S||R| stored triples (R fixed, S = n / R). The memory is the quadratic AND of spec
B2 (vote = <e_s, h><e_a, h>, no threshold): every stored triple adds interference to every
relation logit, with standard deviation ~ sqrt(S) / d against a pair's vote ~ 1/16, so a
d-dimensional memory keeps about d^2 facts apart (the capacity of a bilinear associative memory,
n ~ d^2). We therefore scale the embedding dimension with n, d = c sqrt(n): the memory holds its n
facts at a fixed margin, and the same constant c is used at every n. The thresholded default
memory does not show this (its threshold removes the interference, so n barely enters), and with
d fixed the memory itself fails as n grows; both are shown by the capacity rows this script writes
(the ideal pairwise row at d = c sqrt(n) and at the fixed d of the smallest n).

Scaling d with n holds the margin fixed by construction, so there n cannot matter much.
``--d-rule fixed`` sizes one memory for the largest n (d = c sqrt(max n) at every n), so the
margin shrinks as n grows and n can matter; it writes samples_fixed_d.parquet. Runs whose every
setting (task, memory, fine-tuning, evaluation) equals a run of an earlier table (``--reuse``,
with its manifest beside it) are copied from it, not rerun: at the largest n the two rules build
the same memory.

Measure. P(correct relation | confusing prompt) at the memory's temperature on n_test fresh
prompts; the smallest N (from Ns) from which every larger N reaches ``target``, per (n, seed).
Only the relation column is trained (answer_weight = 0: the relation loss does not depend on the
answer column, so the relation row's trajectory is the same). Growth law: least-squares slope of
log N* on log n and exponent k of N* ~ (log n)^k, each with a percentile bootstrap 95% interval
(seeds resampled within each n); seeds that never reach the target count as 2 x max(Ns).

Writes results/icrecall/samples.parquet and samples.png.

    python analyses/icrecall_samples.py             # ~40-60 min on one CPU core (n = 1e5 dominates)
    python analyses/icrecall_samples.py --ns 1000,10000 --seeds 2    # quicker
    python analyses/icrecall_samples.py --d-rule fixed --reuse results/icrecall/samples.parquet
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

import pandas as pd
import torch
from tqdm.auto import tqdm

from pythia_probe.cli import parse_configs, run_main
from pythia_probe.errors import BadInputError
from pythia_probe.results import make_rows, read_manifest, read_shard, write_manifest
from pythia_probe.toy.icrecall.experiment import (
    MODEL,
    EvalConfig,
    evaluate_controls,
    metric_rows,
    run_experiment,
)
from pythia_probe.toy.icrecall.growth import growth_fit, smallest_N
from pythia_probe.toy.icrecall.memory import ConstructedMemory, MemoryConfig
from pythia_probe.toy.icrecall.model import ICRecallModel
from pythia_probe.toy.icrecall.report import (
    OUT,
    key,
    outcome_rows,
    parse_key,
    save,
    savefig,
    subplots,
    wide,
)
from pythia_probe.toy.icrecall.task import TaskConfig, make_kb, sample_prompts
from pythia_probe.toy.icrecall.train import TrainConfig

D_RULES = ("scaled", "fixed")


@dataclass(frozen=True)
class Config:
    """ns: stored triples n (comma list; n_subjects = n / n_relations); Ns: fine-tuning sample
    counts; seeds per (n, N); d_scale: c in d = c sqrt(n) (d_rule scaled) or d = c sqrt(max n)
    at every n (d_rule fixed); beta: the quadratic memory's inverse temperature; steps of PGD;
    n_test fresh prompts per run; target P(correct | confusing) of the printed summary (the
    verdict is judged over several, in icrecall_summary.py)."""

    ns: str = "1000,10000,100000"
    Ns: str = "2,4,8,16,32,64,128"
    seeds: int = 5
    n_relations: int = 20
    d_scale: float = 6.0
    d_rule: Literal["scaled", "fixed"] = "scaled"
    beta: float = 300.0
    steps: int = 1000
    n_test: int = 3000
    target: float = 0.99

    def __post_init__(self) -> None:
        for n in self.n_list:
            if n % self.n_relations:
                raise BadInputError(f"each n must be a multiple of n_relations="
                                    f"{self.n_relations}, got {n}")
        if min(self.N_list) < 1 or self.seeds < 1 or self.steps < 1 or not 0 < self.target <= 1:
            raise BadInputError(f"invalid samples config {self}")
        if self.d_rule not in D_RULES:
            raise BadInputError(f"--d-rule must be one of {D_RULES}, got {self.d_rule!r}")

    @property
    def n_list(self) -> list[int]:
        return [int(x) for x in self.ns.split(",")]

    @property
    def N_list(self) -> list[int]:
        return [int(x) for x in self.Ns.split(",")]

    @property
    def table(self) -> str:
        return "samples" if self.d_rule == "scaled" else "samples_fixed_d"

    def d_model(self, n: int) -> int:
        base = max(self.n_list) if self.d_rule == "fixed" else n
        return int(round(self.d_scale * math.sqrt(base)))

    def memory(self, n: int, d: int | None = None) -> MemoryConfig:
        return MemoryConfig(vote="product", threshold=0.0, smooth=0.0, beta=self.beta,
                            d_model=self.d_model(n) if d is None else d)

    def task(self, n: int) -> TaskConfig:
        return TaskConfig(n_subjects=n // self.n_relations, n_relations=self.n_relations)

    def run_configs(self, n: int, N: int, seed: int) -> tuple:
        """Every setting of one run: (task, memory, fine-tuning, evaluation)."""
        return (self.task(n), self.memory(n),
                TrainConfig(n_train=N, steps=self.steps, seed=seed, answer_weight=0.0),
                EvalConfig(n_test=self.n_test, n_monitor=0))


def capacity_rows(cfg: Config) -> pd.DataFrame:
    """The ideal, uniform and stuck rows at the rule's d; for d_rule scaled also at the fixed d
    of the smallest n."""
    frames, d0 = [], cfg.d_model(min(cfg.n_list))
    for n in cfg.n_list:
        kb = make_kb(cfg.task(n))
        test = sample_prompts(kb, cfg.n_test, seed=10**6)
        ds = [(cfg.d_rule, cfg.d_model(n))] + ([("fixed", d0)] if cfg.d_rule == "scaled" else [])
        for scaling, d in ds:
            model = ICRecallModel(kb, ConstructedMemory(kb, cfg.memory(n, d)))
            for state, m in evaluate_controls(model, test, rows=None).items():
                m = {**m, "d_model": d}
                frames.append(metric_rows(m, "icrecall_samples_capacity", 0, int(m["n_all"]),
                                          settings=key(n=n, d=scaling, state=state)))
                if state == "ideal":
                    print(f"capacity n={n} d={d} ({scaling}): ideal row P(correct | confusing) "
                          f"{m['relation_prob_confusing']:.4f}", flush=True)
    return pd.concat(frames, ignore_index=True)


def reusable(cfg: Config, path: str) -> dict[tuple[int, int, int], pd.DataFrame]:
    """(n, N, seed) -> the rows of an earlier table's run whose every setting equals the run
    ``cfg`` would make (compared field by field from the table's manifest, never by name)."""
    if not path:
        return {}
    table = Path(path)
    saved = read_manifest(table.parent / f"manifest_{table.stem}")["config"]
    names = {f.name for f in dataclasses.fields(Config)}
    old = Config(**{k: v for k, v in saved.items() if k in names})
    df = read_shard(table)
    df = df[df["analysis"] == "icrecall_samples"]
    out = {}
    for settings, rows in df.groupby("settings"):
        kv = parse_key(settings)
        n, N, seed = int(kv["n"]), int(kv["N"]), int(kv["seed"])
        if (n in cfg.n_list and N in cfg.N_list and seed < cfg.seeds
                and old.run_configs(n, N, seed) == cfg.run_configs(n, N, seed)):
            out[(n, N, seed)] = rows
    return out


@dataclass(frozen=True)
class Flags:
    replot: bool = False
    """Only recompute smallest N and the fit and redraw from the table."""
    reuse: str = ""
    """An earlier samples table (its manifest folder beside it) whose identical runs are copied."""


def main(argv: list[str] | None = None) -> int:
    started = datetime.now(timezone.utc)
    values = parse_configs([Config, Flags], argv, "python analyses/icrecall_samples.py", __doc__)
    cfg, ns = Config(**values[0]), Flags(**values[1])
    torch.set_num_threads(1)
    if ns.replot:
        old = read_shard(OUT / f"{cfg.table}.parquet")
        keep = old["analysis"].isin(["icrecall_samples", "icrecall_samples_capacity"])
        return _finish([old[keep]], cfg, argv, manifest=False)
    frames = [capacity_rows(cfg)]
    copied = reusable(cfg, ns.reuse)
    runs = [(n, N, s) for n in cfg.n_list for N in cfg.N_list for s in range(cfg.seeds)]
    memory, at = None, None
    for n, N, seed in tqdm(runs, desc="icrecall samples"):
        if (n, N, seed) in copied:
            frames.append(copied[(n, N, seed)])
            continue
        task, mem, tr, ev = cfg.run_configs(n, N, seed)
        if at != n:  # keep one n in memory
            kb = make_kb(task)
            memory, at = ConstructedMemory(kb, mem), n
        out = run_experiment(task, mem, tr, ev, memory=memory)
        frames.append(outcome_rows(out, "icrecall_samples", cfg.steps, n=n, N=N, seed=seed))
    print(f"{len(copied)} of {len(runs)} runs copied from {ns.reuse or '-'} (identical settings)")
    return _finish(frames, cfg, argv, started=started)


def _finish(frames, cfg: Config, argv, manifest: bool = True, started=None) -> int:
    """Smallest-N rows, the growth fit, the table, the figure and (after a run) the manifest."""
    df = pd.concat(frames, ignore_index=True)
    w = wide(df[df["analysis"] == "icrecall_samples"])
    w[["n", "N", "seed"]] = w[["n", "N", "seed"]].astype(int)
    best = smallest_N(w, cfg.target)
    fit = growth_fit(best, 2.0 * max(cfg.N_list))
    best_rows = [{"metric": "reached_target", "value": float(v == v), "settings": key(n=n, seed=s)}
                 for (n, s), v in best.items()]
    best_rows += [{"metric": "smallest_N_at_target", "value": v, "settings": key(n=n, seed=s)}
                  for (n, s), v in best.items() if v == v]  # absent: never reached
    frames = [df, make_rows(best_rows, model=MODEL, analysis="icrecall_samples_smallest_N"),
              make_rows([{"metric": k, "value": v} for k, v in fit.items()], model=MODEL,
                        analysis="icrecall_samples_fit"),
              make_rows([{"metric": "target", "value": cfg.target},
                         {"metric": "d_scale", "value": cfg.d_scale},
                         {"metric": "d_fixed", "value": float(cfg.d_rule == "fixed")},
                         {"metric": "max_N", "value": float(max(cfg.N_list))}],
                        model=MODEL, analysis="icrecall_samples_settings")]
    save(frames, cfg.table)
    _figure(w, best, cfg)
    if manifest:
        write_manifest(OUT / f"manifest_{cfg.table}", {**dataclasses.asdict(cfg),
                                                       "TrainConfig": dataclasses.asdict(
                                                           TrainConfig(answer_weight=0.0))},
                       argv=argv, started=started)
    for (n, s), v in sorted(best.items()):
        print(f"n={n:>7} seed {s}: smallest N with P(correct | confusing) >= {cfg.target}: {v}")
    print(f"slope of log median N* on log n {fit['loglog_slope']:.3f} "
          f"[{fit['loglog_slope_lo']:.3f}, {fit['loglog_slope_hi']:.3f}]; polylog exponent "
          f"{fit['polylog_slope']:.2f} [{fit['polylog_slope_lo']:.2f}, "
          f"{fit['polylog_slope_hi']:.2f}] (bootstrap over seeds)")
    return 0


def _figure(w, best, cfg: Config) -> None:
    fig, axes = subplots(1, 2, figsize=(11, 4))
    for n, g in w.groupby("n"):
        m = g.groupby("N")["relation_prob_confusing"].agg(["median", "min", "max"])
        err = [m["median"] - m["min"], m["max"] - m["median"]]
        axes[0].errorbar(m.index, m["median"], yerr=err, marker="o", capsize=3,
                         label=f"n={n} (d={cfg.d_model(n)})")
    axes[0].set(xscale="log", xlabel="fine-tuning samples N", ylabel="P(correct | confusing)",
                title="median over seeds (bars: min-max)")
    axes[0].set_xticks(cfg.N_list, [str(N) for N in cfg.N_list])
    axes[0].minorticks_off()
    axes[0].axhline(cfg.target, color="gray", ls="--")
    axes[0].legend(fontsize=8)
    ns = sorted({n for n, _ in best})
    cap = 2 * max(cfg.N_list)
    for s in range(cfg.seeds):
        ys = [best.get((n, s), float("nan")) for n in ns]
        axes[1].plot(ns, [cap if math.isnan(y) else y for y in ys], "o-", alpha=0.6,
                     label=f"seed {s}")
    axes[1].axhline(cap, color="gray", ls=":", label="never (plotted at 2 x max N)")
    rule = (f"d = {cfg.d_scale:g} sqrt(n)" if cfg.d_rule == "scaled"
            else f"fixed d = {cfg.d_model(max(cfg.n_list))}")
    axes[1].set(xscale="log", yscale="log", xlabel="stored triples n",
                ylabel=f"smallest N (all larger N reach {cfg.target})",
                title=f"sample complexity, {rule}")
    axes[1].legend(fontsize=7)
    savefig(fig, cfg.table)


if __name__ == "__main__":
    raise SystemExit(run_main(main, "python analyses/icrecall_samples.py"))
