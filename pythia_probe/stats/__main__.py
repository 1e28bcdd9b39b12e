"""``python -m pythia_probe.stats compute|top``: corpus statistics, and their top lists.

  python -m pythia_probe.stats compute --dataset builtin --docs 2000 --seq-len 64 \\
      --tokenizer word:500 --out stats.safetensors
  python -m pythia_probe.stats top --stats stats.safetensors --rows red,happy,fish --k 5
"""

from __future__ import annotations

from dataclasses import asdict

from pythia_probe.cli import parse_subcommand, run_main
from pythia_probe.fileio import check_writable
from pythia_probe.stats.config import StatsFlags, TopFlags

#: the flags of each subcommand (light: ``--help`` imports no torch); main validates them
COMMANDS = {"compute": StatsFlags, "top": TopFlags}


def main(argv: list[str] | None = None) -> int:
    command, flags = parse_subcommand(COMMANDS, argv, "python -m pythia_probe.stats", __doc__)
    if command == "top":
        from pythia_probe.stats import top  # deferred: --help
        print(top.render(top.TopConfig(**asdict(flags))))
        return 0
    from pythia_probe.ranks import from_env  # deferred: --help
    from pythia_probe.stats.job import StatsConfig, compute  # deferred: --help
    cfg = StatsConfig(**asdict(flags))
    check_writable(cfg.out, is_file=True)
    stats = compute(cfg, from_env(cfg.device))
    if stats is not None:
        c = stats.meta["counts"]
        print(f"wrote {cfg.out}: stats_id {stats.stats_id}, d_vocab {stats.d_vocab}, "
              f"T {stats.T}, {c['docs']} docs, {c['sequences']} sequences, "
              f"{c['positions']} positions, engine {stats.meta['engine']['resolved']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main, "python -m pythia_probe.stats"))
