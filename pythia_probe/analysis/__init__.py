"""Analyses of one checkpoint against corpus statistics, looked up by name.

Each analysis is a pure function of a :class:`StepTensors` (the single-token residual streams
and weights of one checkpoint) and prepared target matrices, returning tidy-table row dicts
(analysis, layer, head, metric, value, n); the sweep adds model, step, stats_id, dtype, run_id.
Each declares what it needs (:class:`Needs`) and costs (:class:`Cost`): see
:mod:`pythia_probe.analysis.base` and the registry in :mod:`pythia_probe.analysis.registry`.
"""

from pythia_probe.lazy import faces

__all__ = ["REGISTRY", "Analysis", "Cost", "Needs", "Options", "Shape", "StepTensors",
           "combined_needs", "get_analyses", "target_matrix"]
__getattr__, __dir__ = faces(__name__, {
    ".base": ("Analysis", "Cost", "Needs", "Options", "Shape", "StepTensors", "combined_needs"),
    ".registry": ("REGISTRY", "get_analyses"),
    ".targets": ("target_matrix",),
})
