"""Corpus statistics of the leading-terms paper (section 2): streaming, exact, any device.

Public API: ``CorpusStats`` (frozen result, save/load), ``batch_stats`` (both passes over one
batch), ``CountAccumulator`` / ``QAccumulator`` (streaming passes, ``update -> self``,
``finalize``), ``SequencePolicy``; ``run.compute_stats`` is the shard driver behind
``python -m pythia_probe.stats``. The sparse engine (``SparseCountAccumulator``,
``outofcore``, ``tilepass``, ``sparse_run``; ``--engine auto`` picks it when the dense V x V
tensors do not fit) computes the same statistics in memory that grows with the corpus.
Memory plans: ``stats/MEMORY.md``.
"""

from pythia_probe.errors import MismatchError as StatsMismatchError  # the old name, still used
from pythia_probe.stats.accumulate import CountAccumulator, QAccumulator
from pythia_probe.stats.batch import batch_stats
from pythia_probe.stats.corpus_stats import CorpusStats, read_meta
from pythia_probe.stats.engine import first_pass, top_k_ids
from pythia_probe.stats.sequences import SequencePolicy
from pythia_probe.stats.sparse import SparseCountAccumulator

__all__ = ["CorpusStats", "CountAccumulator", "QAccumulator", "SequencePolicy",
           "SparseCountAccumulator", "StatsMismatchError", "batch_stats", "first_pass",
           "read_meta", "top_k_ids"]
