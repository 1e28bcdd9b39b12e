"""Corpus statistics of the leading-terms paper (section 2): streaming, exact, any device.

Public API: ``CorpusStats`` (the frozen result, factored at any vocabulary:
``block(name, rows, cols)``, ``mul`` / ``tmul`` products, ``parts()``, save/load),
``batch_stats`` (both passes over one batch), ``compute_stats`` (the shard driver behind
``python -m pythia_probe.stats``), ``SequencePolicy``, and the accumulators of both engines
(``CountAccumulator`` / ``QAccumulator`` of ``stats/dense/``, ``SparseCountAccumulator`` of
``stats/sparse/``; ``update -> self``). Layout: the shared core (``result.py`` + ``stores.py``
+ ``factors.py`` + ``tables.py`` + ``compose.py``, ``groups.py``, ``consistency.py``,
``pass1.py``, ``engine.py``: the interface) imports no engine; ``driver.py`` dispatches to the
engines ``dense/`` and ``sparse/``; ``native/`` holds the C kernels behind one dispatch (C or
their torch / numpy twins, chosen inside).
Memory plans: ``stats/MEMORY.md``, computed in ``pythia_probe/planner/statistics.py``.
"""

from pythia_probe.stats.dense.count import CountAccumulator
from pythia_probe.stats.dense.first import first_pass
from pythia_probe.stats.dense.second import QAccumulator
from pythia_probe.stats.driver import batch_stats, compute_stats
from pythia_probe.stats.engine import Engine, top_k_ids
from pythia_probe.stats.result import CorpusStats, read_meta
from pythia_probe.stats.sequences import SequencePolicy
from pythia_probe.stats.sparse.count import SparseCountAccumulator

__all__ = ["CorpusStats", "CountAccumulator", "Engine", "QAccumulator", "SequencePolicy",
           "SparseCountAccumulator", "batch_stats", "compute_stats", "first_pass", "read_meta",
           "top_k_ids"]
