"""CLI: fine-tune the IC-recall model once and report accuracy and the attention pattern.

    python -m pythia_probe.toy.icrecall --method pgd --n-train 8 --out results/icrecall/cli
    python -m pythia_probe.toy.icrecall --kind pretrained --method pgd --n-train 32

Every field of TaskConfig, MemoryConfig, TrainConfig and EvalConfig is a flag (underscores become
dashes); the three seeds are --kb-seed, --memory-seed and --seed (training prompts, perturbation).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch

from pythia_probe.results import new_run_id, write_manifest, write_shard
from pythia_probe.toy.icrecall.experiment import (
    EvalConfig,
    history_rows,
    metric_rows,
    run_experiment,
)
from pythia_probe.toy.icrecall.memory import MemoryConfig
from pythia_probe.toy.icrecall.task import TaskConfig
from pythia_probe.toy.icrecall.train import TrainConfig

GROUPS = {"task": (TaskConfig, {"seed": "kb_seed"}),
          "memory": (MemoryConfig, {"seed": "memory_seed"}),
          "train": (TrainConfig, {}), "eval": (EvalConfig, {})}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pythia_probe.toy.icrecall", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    for group, (cls, rename) in GROUPS.items():
        g = p.add_argument_group(group, cls.__doc__)
        for f in dataclasses.fields(cls):
            name = rename.get(f.name, f.name)
            kind = float if f.default is None else type(f.default)  # beta: None = by kind
            g.add_argument("--" + name.replace("_", "-"), dest=name, type=kind,
                           default=f.default, help=f"default {f.default!r}")
    p.add_argument("--out", default="results/icrecall/cli", help="output folder")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    return p


def configs(ns: argparse.Namespace) -> dict[str, object]:
    """Build the four frozen configs from parsed arguments (validation errors propagate)."""
    out = {}
    for group, (cls, rename) in GROUPS.items():
        kw = {f.name: getattr(ns, rename.get(f.name, f.name)) for f in dataclasses.fields(cls)}
        out[group] = cls(**kw)
    return out


def main(argv: list[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    try:
        cfg = configs(ns)
    except ValueError as e:  # BadInputError and argparse-valid but invalid values
        print(f"error: {e}", file=sys.stderr)
        return 2
    torch.set_num_threads(ns.threads)
    started, run_id = datetime.now(timezone.utc), new_run_id()
    out = run_experiment(cfg["task"], cfg["memory"], cfg["train"], cfg["eval"],
                         progress=not ns.no_progress)
    steps = cfg["train"].steps
    n_test = cfg["eval"].n_test
    write_shard(metric_rows(out.metrics, "icrecall_run", steps, n_test, run_id=run_id),
                Path(ns.out) / "metrics.parquet")
    write_shard(history_rows(out.result, "icrecall_history", run_id=run_id),
                Path(ns.out) / "history.parquet")
    flat = {f"{g}.{k}": v for g, c in cfg.items() for k, v in dataclasses.asdict(c).items()}
    write_manifest(ns.out, flat, argv=sys.argv if argv is None else argv, started=started,
                   run_id=run_id)
    _print(out.metrics)
    return 0


def _print(m: dict[str, float]) -> None:
    keys = ["relation_prob_confusing", "relation_sampled", "relation_sampled_confusing",
            "answer_sampled", "relation_acc", "relation_acc_confusing", "answer_acc",
            "pair_gap_max", "offpair_mass", "pattern_dist"]
    row = [f"attn_{x}{i}" for i in (1, 2) for x in "sa"] + ["attn_s_query", "attn_last"]
    print("relation-step attention row:", " ".join(f"{m[k]:.3f}" for k in row if k in m))
    for k in keys:
        if k in m:
            print(f"{k:>26s}: {m[k]:.5f}")
    print(f"{'n_test (confusing)':>26s}: {int(m['n_all'])} ({int(m['n_confusing'])})")
    print("relation_prob_confusing = P(correct relation | confusing prompt) at the memory's "
          "temperature; *_sampled: two-step decoding sampled at that temperature; *_acc: argmax")


if __name__ == "__main__":
    from pythia_probe.cli import run_main

    raise SystemExit(run_main(main, "python -m pythia_probe.toy.icrecall"))
