"""``python -m pythia_probe.toy.train``: train the Def. 3.1 model the paper's way and track its
weights against Theorem 4.1 (the trainer: :mod:`pythia_probe.toy.trainer`).

Paper scale (Table 1):  python -m pythia_probe.toy.train --preset paper  (toy/flags.py PRESETS)

Only the flags are read here, so ``--help`` imports no torch; every name of the trainer
(``run``, ``load_run``, ``TrainConfig``, ``make_schedule``, ...) is also
``pythia_probe.toy.train.NAME``, loaded on first use.
"""

from __future__ import annotations

import sys
from dataclasses import asdict

from pythia_probe.cli import parse_config, run_main
from pythia_probe.lazy import forwarding
from pythia_probe.toy.flags import TrainFlags, with_preset


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns a process exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    flags = parse_config(TrainFlags, with_preset(argv), "python -m pythia_probe.toy.train")
    from pythia_probe.toy import trainer  # deferred: --help
    return trainer.command(trainer.TrainConfig(**asdict(flags)), argv)


__getattr__ = forwarding(__name__, "pythia_probe.toy.trainer")


if __name__ == "__main__":
    raise SystemExit(run_main(main, "python -m pythia_probe.toy.train"))
