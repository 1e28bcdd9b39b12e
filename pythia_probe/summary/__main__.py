"""``python -m pythia_probe.summary --results RUN`` (see :mod:`pythia_probe.summary`)."""

from pythia_probe.cli import run_main
from pythia_probe.summary import main

if __name__ == "__main__":
    raise SystemExit(run_main(main, "python -m pythia_probe.summary"))
