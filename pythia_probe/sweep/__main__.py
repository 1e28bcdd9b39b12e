"""``python -m pythia_probe.sweep``: the command line; the only place that knows about ranks."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from pythia_probe import demo
from pythia_probe.cli import parse_configs, run_main
from pythia_probe.ranks import from_env
from pythia_probe.sweep.config import SweepConfig
from pythia_probe.sweep.runner import run

#: --demo writes here (untracked); `--demo --out results/demo` regenerates the committed copy
DEMO_OUT = "runs/demo"


@dataclass(frozen=True)
class DemoFlags:
    """The offline demo instead of a sweep."""

    demo: bool = False
    """Offline demo: train a tiny GPT-NeoX on the built-in corpus, compute its statistics,
    sweep its checkpoints, draw the heat maps (tables in runs/demo/run unless --out)."""
    demo_max_step: int | None = None
    """--demo: training steps (default 1024)."""
    work: str = DEMO_OUT
    """--demo: where the model checkpoints and statistics go."""


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; the only place that knows about process ranks."""
    argv = sys.argv[1:] if argv is None else list(argv)
    fields, flags = parse_configs([SweepConfig, DemoFlags], argv, "python -m pythia_probe.sweep")
    flags = DemoFlags(**flags)
    if flags.demo:
        cfg = demo.DemoConfig(**({"max_step": flags.demo_max_step} if flags.demo_max_step
                                 else {}))
        return demo.run_demo(fields["out"] or DEMO_OUT, cfg, device=fields["device"],
                             work=flags.work)
    ranks = from_env(SweepConfig(**fields).device)  # validates every flag before joining
    cfg = SweepConfig(**{**fields, "device": ranks.device}, rank=ranks.rank,
                      world_size=ranks.world)
    return run(cfg, argv, ranks)


if __name__ == "__main__":
    raise SystemExit(run_main(main, "python -m pythia_probe.sweep"))
