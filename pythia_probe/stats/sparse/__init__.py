"""The sparse statistics engine: counts where the corpus has them (``engine.SparseEngine``)."""
