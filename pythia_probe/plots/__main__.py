"""``python -m pythia_probe.plots RESULTS`` (see :mod:`pythia_probe.plots.run`)."""

from pythia_probe.cli import run_main
from pythia_probe.plots.run import main

if __name__ == "__main__":
    raise SystemExit(run_main(main, "python -m pythia_probe.plots"))
