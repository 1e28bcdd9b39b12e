"""The dense statistics engine: V x V tensors on any device (``engine.DenseEngine``)."""
