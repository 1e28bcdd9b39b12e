"""``python -m pythia_probe.plots RESULTS`` (see :mod:`pythia_probe.plots.run`): the flags are
parsed before pandas and matplotlib load, so ``--help`` stays quick."""

from pythia_probe.cli import parse_config, run_main
from pythia_probe.plots.config import PlotsConfig


def main(argv: list[str] | None = None) -> int:
    """CLI: draw the figures of a results folder and print their paths
    (:func:`pythia_probe.plots.run.main`)."""
    cfg = parse_config(PlotsConfig, argv, "python -m pythia_probe.plots")
    from pythia_probe.plots.run import draw  # deferred: --help
    return draw(cfg)


if __name__ == "__main__":
    raise SystemExit(run_main(main, "python -m pythia_probe.plots"))
