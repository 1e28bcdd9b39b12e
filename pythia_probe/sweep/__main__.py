"""``python -m pythia_probe.sweep``."""

from pythia_probe.sweep import main

raise SystemExit(main())
