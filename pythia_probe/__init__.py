"""pythia_probe: corpus-statistic leading terms vs. transformer weights across training.

The notebook API (:mod:`pythia_probe.api`), loaded on first use so that ``import pythia_probe``
stays cheap and does nothing else::

    import pythia_probe as pp
    df = pp.run_sweep(model="EleutherAI/pythia-70m,EleutherAI/pythia-160m", steps="early")
    df = pp.read_results("runs/pythia-70m_pythia-160m")
    st = pp.statistics("runs/pythia-70m_pythia-160m")
"""

import importlib

__version__ = "0.1.0"
__all__ = ["read_results", "run_sweep", "statistics", "summary_table"]


def __getattr__(name: str):
    if name in __all__:
        return getattr(importlib.import_module("pythia_probe.api"), name)
    raise AttributeError(f"module 'pythia_probe' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *__all__])
