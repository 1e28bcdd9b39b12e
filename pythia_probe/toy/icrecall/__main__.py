"""CLI: fine-tune the IC-recall model once and report accuracy and the attention pattern.

    python -m pythia_probe.toy.icrecall --method pgd --n-train 8        # writes runs/icrecall
    python -m pythia_probe.toy.icrecall --kind pretrained --method pgd --n-train 32 --out runs/x

Every field of TaskConfig, MemoryConfig, TrainConfig and EvalConfig is a flag (underscores become
dashes); the three seeds are --kb-seed, --memory-seed and --seed (training prompts, perturbation).
Invalid values are one-line errors (exit 2). Prints the headline numbers beside the paper's
(relation >= 99.9%, near-perfect answer, the pattern v*, about 8 samples) with the settings.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from pythia_probe.cli import parse_configs, run_main
from pythia_probe.fileio import check_writable
from pythia_probe.toy.icrecall.config import EvalConfig, MemoryConfig, TaskConfig, TrainConfig


@dataclass(frozen=True)
class RunFlags:
    """Where the run goes and how it shows."""

    out: str = "runs/icrecall"
    """Output folder (metrics.parquet, history.parquet, manifest.json); the default is outside
    the committed results."""
    threads: int = 1
    """torch CPU threads."""
    progress: bool = True
    """Show progress bars."""


CONFIGS = (TaskConfig, MemoryConfig, TrainConfig, EvalConfig, RunFlags)


def main(argv: list[str] | None = None) -> int:
    values = parse_configs(CONFIGS, argv, "python -m pythia_probe.toy.icrecall", __doc__)
    task, mem, train, ev, flags = (cls(**v) for cls, v in zip(CONFIGS, values, strict=True))
    check_writable(flags.out)
    import torch  # deferred: --help

    from pythia_probe.results import new_run_id, write_manifest, write_shard  # deferred: --help
    from pythia_probe.toy.icrecall.experiment import (  # deferred: --help
        history_rows,
        metric_rows,
        run_experiment,
    )
    from pythia_probe.toy.icrecall.paper import comparison_lines  # deferred: --help
    torch.set_num_threads(flags.threads)
    started, run_id = datetime.now(timezone.utc), new_run_id()
    out = run_experiment(task, mem, train, ev, progress=flags.progress)
    write_shard(metric_rows(out.metrics, "icrecall_run", train.steps, ev.n_test, run_id=run_id),
                Path(flags.out) / "metrics.parquet")
    write_shard(history_rows(out.result, "icrecall_history", run_id=run_id),
                Path(flags.out) / "history.parquet")
    groups = {"task": task, "memory": mem, "train": train, "eval": ev}
    flat = {f"{g}.{k}": v for g, c in groups.items() for k, v in dataclasses.asdict(c).items()}
    write_manifest(flags.out, flat, argv=sys.argv if argv is None else argv, started=started,
                   run_id=run_id)
    _print(out.metrics)
    print("\n".join(comparison_lines(out.metrics, task, mem, train, ev.n_test)))
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
    raise SystemExit(run_main(main, "python -m pythia_probe.toy.icrecall"))
