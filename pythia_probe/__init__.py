"""pythia_probe: corpus-statistic leading terms vs. transformer weights across training."""

__version__ = "0.1.0"
