"""What a newcomer waits for: every command's no-flag run (its offline built-in default), the
README's timed examples, and ``--help`` of every command; wall seconds and peak memory of each.

    python benchmarks/bench_defaults.py                        # every default, every --help
    python benchmarks/bench_defaults.py --runs toy,stats,help  # a subset
    python benchmarks/bench_defaults.py --runs suite           # the whole test suite

Each run is a fresh subprocess in an empty temporary folder (so defaults such as ``runs/toy``
land there), offline (HF_HUB_OFFLINE=1), importing this checkout. Peak memory is the child's
maximum resident set and its CPU seconds (user + system) come from ``os.wait4``: on a shared
machine wall time grows with the load printed beside it, CPU seconds much less.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from pythia_probe.cli import parse_configs, run_main
from pythia_probe.errors import BadInputError

PROG = "python benchmarks/bench_defaults.py"
ROOT = Path(__file__).resolve().parents[1]

#: name -> the command line after ``python``
RUNS = {
    "toy": ["-m", "pythia_probe.toy.train"],
    "stats": ["-m", "pythia_probe.stats", "compute"],
    "corpus": ["-m", "pythia_probe.corpus", "inspect"],
    "icrecall": ["-m", "pythia_probe.toy.icrecall"],
    "icrecall-readme": ["-m", "pythia_probe.toy.icrecall", "--method", "pgd", "--n-train", "8"],
    "demo": ["-m", "pythia_probe.sweep", "--demo"],
    "suite": ["-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(ROOT),
              str(ROOT / "tests")],
}
#: modules whose ``--help`` is timed
HELP = ("sweep", "stats", "corpus", "toy.train", "toy.icrecall", "plots", "summary",
        "hub.revisions")


@dataclass(frozen=True)
class BenchConfig:
    """Wall time and peak memory of every command's default run and of every --help."""

    runs: tuple[str, ...] = (*(r for r in RUNS if r != "suite"), "help")
    """Which to measure: any of toy, stats, corpus, icrecall, icrecall-readme, demo, help,
    suite."""


def measure(args: list[str]) -> tuple[float, float, float, int]:
    """(wall seconds, CPU seconds, peak resident MB, exit code) of ``python ARGS`` in a fresh
    folder."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    with tempfile.TemporaryDirectory(prefix="bench-defaults-") as cwd:
        t0 = time.perf_counter()
        child = subprocess.Popen([sys.executable, *args], cwd=cwd, env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - t0
    cpu = usage.ru_utime + usage.ru_stime
    return wall, cpu, usage.ru_maxrss / 1024, os.waitstatus_to_exitcode(status)


def load() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def bench(cfg: BenchConfig) -> int:
    print(f"{os.cpu_count()} CPUs; before: {load()}")
    for name in cfg.runs:
        cases = ({f"{m} --help": ["-m", f"pythia_probe.{m}", "--help"] for m in HELP}
                 if name == "help" else {name: RUNS[name]})
        for label, args in cases.items():
            wall, cpu, peak, rc = measure(args)
            print(f"{label:<24} {wall:8.1f} s wall {cpu:8.1f} s CPU  peak {peak:6.0f} MB  "
                  f"exit {rc}  ({load()})", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    [fields] = parse_configs([BenchConfig], argv, PROG, __doc__)
    unknown = set(fields["runs"]) - {*RUNS, "help"}
    if unknown:
        raise BadInputError(f"--runs {','.join(sorted(unknown))}: valid: "
                            f"{', '.join([*RUNS, 'help'])}")
    return bench(BenchConfig(**fields))


if __name__ == "__main__":
    raise SystemExit(run_main(main, PROG))
