"""Section C item 3, judged on paired seeds: time to escape the confused state for plain GD, PGD
and each of PGD's ingredients alone, with runs long enough to tell "slower" from "stuck".

Default design (constructed andprod memory, n = 2000 triples, N = 8 training prompts): for each
seed and arm (pythia_probe.toy.icrecall.escape.ARMS: gd, large_only, perturb_only, pgd; the same
training prompts per seed), train until P(correct relation | confusing prompt) on fresh confusing
prompts holds >= level for ``confirm`` steps, or until max_steps (censored). Seeds 0-7 are the
seeds of analyses/icrecall_dynamics.py (same prompts, same perturbation draws), whose curvature
at the stalls they extend. Writes results/icrecall/escape.parquet (one row set per (arm, seed):
escape_step, censored, steps_run, final P(conf), one_sided).

    python analyses/icrecall_escape.py          # ~15-25 min on one CPU core (GD's stalls dominate)
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from datetime import datetime, timezone

import torch
from icrecall_dynamics import one_sided

from pythia_probe.cli import parse_configs, run_main
from pythia_probe.errors import BadInputError
from pythia_probe.results import make_rows, read_manifest, read_shard, write_manifest
from pythia_probe.toy.icrecall.escape import (
    ARMS,
    EscapeConfig,
    arm_config,
    confusing_monitor,
    run_escape,
)
from pythia_probe.toy.icrecall.experiment import MODEL, build_memory, metric_rows
from pythia_probe.toy.icrecall.memory import MemoryConfig
from pythia_probe.toy.icrecall.model import ICRecallModel
from pythia_probe.toy.icrecall.report import OUT, key, parse_key, save
from pythia_probe.toy.icrecall.task import TaskConfig, make_kb, sample_prompts
from pythia_probe.toy.icrecall.train import TrainConfig


@dataclass(frozen=True)
class Config:
    """seeds per arm (first_seed, first_seed + 1, ...); n_train: N; arms (comma list of gd,
    large_only, perturb_only, pgd); monitor_seed: the fresh confusing prompts of the check;
    append: add these seeds to an existing escape.parquet made with the same settings (its other
    seeds kept)."""

    seeds: int = 8
    first_seed: int = 0
    n_train: int = 8
    arms: str = ",".join(ARMS)
    monitor_seed: int = 10**6 + 1
    append: bool = False

    def __post_init__(self) -> None:
        bad = set(self.arm_list) - set(ARMS)
        if self.seeds < 1 or self.n_train < 1 or bad:
            raise BadInputError(f"need seeds >= 1, n_train >= 1 and arms among {list(ARMS)}; "
                                f"got {self}")

    @property
    def arm_list(self) -> list[str]:
        return self.arms.split(",")


def run(cfg: Config, esc: EscapeConfig) -> list:
    task, mem_cfg = TaskConfig(), MemoryConfig()
    kb = make_kb(task)
    memory = build_memory(kb, mem_cfg)[0]
    monitor = confusing_monitor(kb, esc.n_monitor, cfg.monitor_seed)
    frames = []
    for seed in range(cfg.first_seed, cfg.first_seed + cfg.seeds):
        p = sample_prompts(kb, cfg.n_train, seed=seed)
        for arm in cfg.arm_list:
            t0 = time.perf_counter()
            tr = arm_config(arm, seed, cfg.n_train, esc.max_steps, esc.check_every)
            torch.manual_seed(seed)
            e = run_escape(ICRecallModel(kb, memory), p, tr, esc, monitor)
            m = {"escape_step": e.step, "censored": float(e.censored),
                 "steps_run": float(e.steps_run), "final_relation_prob_confusing": e.final,
                 "one_sided": float(one_sided(p)), "seconds": time.perf_counter() - t0}
            frames.append(metric_rows(m, "icrecall_escape", e.steps_run,
                                      settings=key(arm=arm, seed=seed)))
            shown = "censored" if e.censored else f"{e.step:.0f}"
            print(f"{arm:>12} seed {seed}: escape step {shown} (ran {e.steps_run}, final "
                  f"P(conf) {e.final:.4f}, {m['seconds']:.0f} s)", flush=True)
    settings = [{"metric": f.name, "value": float(getattr(esc, f.name))}
                for f in dataclasses.fields(esc)]
    frames.append(make_rows(settings, model=MODEL, analysis="icrecall_escape_settings"))
    return frames


def earlier(cfg: Config, esc: EscapeConfig) -> list:
    """The rows of escape.parquet for seeds this run does not make, if it was made with the same
    escape settings and the same fine-tuning defaults (else refused)."""
    df = read_shard(OUT / "escape.parquet")
    st = df[df["analysis"] == "icrecall_escape_settings"].set_index("metric")["value"].to_dict()
    want = {f.name: float(getattr(esc, f.name)) for f in dataclasses.fields(esc)}
    old = read_manifest(OUT / "manifest_escape")["config"]
    same = st == want and old.get("TrainConfig") == dataclasses.asdict(TrainConfig()) and all(
        old.get(k) == getattr(cfg, k) for k in ("n_train", "monitor_seed"))
    if not same:
        raise BadInputError(f"--append: {OUT / 'escape.parquet'} was made with other settings "
                            f"({st}, {old}); rerun every seed instead")
    keep = df[df["analysis"] == "icrecall_escape"]
    mine = range(cfg.first_seed, cfg.first_seed + cfg.seeds)
    seeds = keep["settings"].map(lambda s: int(parse_key(s)["seed"]))
    return [keep[~seeds.isin(list(mine))]]


def main(argv: list[str] | None = None) -> int:
    started = datetime.now(timezone.utc)
    values = parse_configs([Config, EscapeConfig], argv, "python analyses/icrecall_escape.py",
                           __doc__)
    cfg, esc = Config(**values[0]), EscapeConfig(**values[1])
    torch.set_num_threads(1)
    old = earlier(cfg, esc) if cfg.append else []
    table = read_shard(save(old + run(cfg, esc), "escape"))
    rows = table[table["analysis"] == "icrecall_escape"]
    seeds = sorted({int(parse_key(s)["seed"]) for s in rows["settings"]})
    write_manifest(OUT / "manifest_escape", {**dataclasses.asdict(cfg), **dataclasses.asdict(esc),
                                             "TrainConfig": dataclasses.asdict(TrainConfig())},
                   argv=argv, started=started, extra={"seeds_in_table": seeds})
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main, "python analyses/icrecall_escape.py"))
