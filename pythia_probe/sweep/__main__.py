"""``python -m pythia_probe.sweep``: the command line; the only place that knows about ranks."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from pythia_probe.cli import flag, parse_configs, run_main
from pythia_probe.errors import BadInputError
from pythia_probe.fileio import check_writable
from pythia_probe.sweep.flags import SweepFlags

#: --demo writes here (untracked); `--demo --out results/demo` regenerates the committed copy
DEMO_OUT = "runs/demo"
#: the flags --demo honours; any other is refused in one line
DEMO_FLAGS = ("demo", "demo_max_step", "work", "out", "device", "progress", "log_level")


@dataclass(frozen=True)
class DemoFlags:
    """The offline demo instead of a sweep."""

    demo: bool = False
    """Offline demo: train a tiny GPT-NeoX on the built-in corpus, compute its statistics,
    sweep its checkpoints, draw the heat maps (tables in runs/demo/run unless --out). Takes
    only --out, --work, --demo-max-step, --device, --no-progress and --log-level."""
    demo_max_step: int | None = None
    """--demo: training steps (default 1024)."""
    work: str = DEMO_OUT
    """--demo: where the model checkpoints and statistics go."""


def given_flags(argv: list[str]) -> set[str]:
    """Field names of the flags typed in ``argv`` (``--no-x`` counts as ``x``)."""
    names = set()
    for token in argv:
        if token.startswith("--") and len(token) > 2:
            names.add(token[2:].split("=", 1)[0].replace("-", "_").removeprefix("no_"))
    return names


def check_demo_flags(argv: list[str]) -> None:
    """--demo runs a fixed sweep of its own model: refuse flags it would ignore."""
    ignored = sorted(given_flags(argv) - set(DEMO_FLAGS))
    if ignored:
        takes = ", ".join(flag(f) for f in DEMO_FLAGS[1:] if f != "progress")
        raise BadInputError(f"--demo trains and sweeps its own model with fixed settings; it "
                            f"does not take {', '.join(flag(f) for f in ignored)} (it takes "
                            f"{takes}, --no-progress)")


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; the only place that knows about process ranks."""
    argv = sys.argv[1:] if argv is None else list(argv)
    fields, flags = parse_configs([SweepFlags, DemoFlags], argv, "python -m pythia_probe.sweep")
    flags = DemoFlags(**flags)
    from pythia_probe.ranks import from_env  # deferred: --help
    from pythia_probe.sweep.config import SweepConfig  # deferred: --help
    cfg = SweepConfig(**fields)  # validates every flag (and the device) before joining ranks
    if flags.demo:
        check_demo_flags(argv)
        out = fields["out"] or DEMO_OUT
        check_writable(out)
        check_writable(flags.work, "--work")
        ranks = from_env(cfg.device)
        from pythia_probe import demo  # deferred: --help
        dcfg = demo.DemoConfig(**({"max_step": flags.demo_max_step} if flags.demo_max_step
                                  else {}))
        return demo.run_demo(out, dcfg, device=ranks.device,
                             work=flags.work, ranks=ranks, progress=cfg.progress)
    ranks = from_env(cfg.device, array=cfg.shard is None)  # --shard wins over a Slurm array
    parts = cfg.split(ranks.device)
    if not cfg.dry_run:
        check_writable(parts.output.out)
    from pythia_probe.sweep.runner import run  # deferred: --help
    return run(parts, ranks, argv)


if __name__ == "__main__":
    raise SystemExit(run_main(main, "python -m pythia_probe.sweep"))
