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

from pythia_probe.lazy import faces

__all__ = ["CorpusStats", "CountAccumulator", "Engine", "QAccumulator", "SequencePolicy",
           "SparseCountAccumulator", "batch_stats", "compute_stats", "first_pass", "read_meta",
           "top_k_ids"]
__getattr__, __dir__ = faces(__name__, {
    ".dense.count": ("CountAccumulator",),
    ".dense.first": ("first_pass",),
    ".dense.second": ("QAccumulator",),
    ".driver": ("batch_stats", "compute_stats"),
    ".engine": ("Engine", "top_k_ids"),
    ".result": ("CorpusStats", "read_meta"),
    ".sequences": ("SequencePolicy",),
    ".sparse.count": ("SparseCountAccumulator",),
})
