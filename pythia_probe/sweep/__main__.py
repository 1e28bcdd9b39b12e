"""``python -m pythia_probe.sweep``."""

from pythia_probe.cli import run_main
from pythia_probe.sweep import main

raise SystemExit(run_main(main, "python -m pythia_probe.sweep"))
