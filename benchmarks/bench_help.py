"""How long ``--help`` of every command takes (issue 30: under 2 s on a 2-core machine), beside
what importing torch alone takes on the same machine in the same run.

    python benchmarks/bench_help.py                 # 5 runs of each, medians
    python benchmarks/bench_help.py --repeats 9

Each run is a fresh interpreter (``python -m MODULE --help``, this checkout first on the path);
the median wall seconds of each command is printed with its ratio to the baseline, the median
of ``python -c "import torch"``: on a loaded machine both grow, the ratio much less. The
commands' imports are checked by tests/test_cli.py (no torch, pandas, ... on any --help), not
their times: nothing here is asserted.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from pythia_probe.cli import parse_config, run_main
from pythia_probe.errors import BadInputError

PROG = "python benchmarks/bench_help.py"
ROOT = Path(__file__).resolve().parents[1]

#: command -> the command line after ``python`` (the modules of pythia_probe.__main__.COMMANDS)
COMMANDS = {
    "pythia-probe": ["-m", "pythia_probe", "--help"],
    "sweep": ["-m", "pythia_probe.sweep", "--help"],
    "stats": ["-m", "pythia_probe.stats", "compute", "--help"],
    "corpus": ["-m", "pythia_probe.corpus", "inspect", "--help"],
    "toy.train": ["-m", "pythia_probe.toy.train", "--help"],
    "icrecall": ["-m", "pythia_probe.toy.icrecall", "--help"],
    "plots": ["-m", "pythia_probe.plots", "--help"],
    "summary": ["-m", "pythia_probe.summary", "--help"],
    "revisions": ["-m", "pythia_probe.hub.revisions", "--help"],
}
BASELINE = ["-c", "import torch"]


@dataclass(frozen=True)
class HelpBenchConfig:
    """Median wall seconds of every command's --help, and its ratio to `import torch`."""

    repeats: int = 5
    """Fresh interpreters per command (and for the baseline)."""

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise BadInputError(f"--repeats must be >= 1, got {self.repeats}")


def wall(args: list[str]) -> float:
    """Wall seconds of ``python ARGS`` (it must exit 0)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, *args], env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def median(args: list[str], repeats: int) -> float:
    return statistics.median(wall(args) for _ in range(repeats))


def load() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def bench(cfg: HelpBenchConfig) -> int:
    print(f"{os.cpu_count()} CPUs, {cfg.repeats} runs each; before: {load()}")
    base = median(BASELINE, cfg.repeats)
    print(f"{'import torch (baseline)':<24} {base:6.2f} s", flush=True)
    for name, args in COMMANDS.items():
        t = median(args, cfg.repeats)
        print(f"{name + ' --help':<24} {t:6.2f} s  {t / base:5.2f} x baseline", flush=True)
    print(f"after: {load()}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return bench(parse_config(HelpBenchConfig, argv, PROG))


if __name__ == "__main__":
    raise SystemExit(run_main(main, PROG))
