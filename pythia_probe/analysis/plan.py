"""Memory and compute plan of one checkpoint's analyses (what the sweep's --dry-run prints).

Everything is computed from the shapes: V (statistic rows), d_model, n_layers, n_heads, the
number of parameters, the analyses and the compute dtype. See benchmarks/bench_analysis.py for
measurements of the factored path against the materialised one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

GB = 1e9


@dataclass(frozen=True)
class Plan:
    """Bytes held at the peak of one checkpoint's analysis, by part, and flops per checkpoint."""

    theories: float
    residuals: float
    weights: float
    transient: float
    flops_per_step: float
    flops_theory_norms: float

    @property
    def total(self) -> float:
        return self.theories + self.residuals + self.weights + self.transient

    def lines(self) -> list[str]:
        """Human-readable lines, GB = 1e9 bytes."""
        return [f"theory matrices (resident)    {self.theories / GB:8.2f} GB",
                f"single-token residuals        {self.residuals / GB:8.2f} GB",
                f"weights of one checkpoint     {self.weights / GB:8.2f} GB",
                f"factors + chunk transients    {self.transient / GB:8.2f} GB",
                f"peak total                    {self.total / GB:8.2f} GB",
                f"flops per checkpoint          {self.flops_per_step:8.2e}",
                f"flops for theory norms (once) {self.flops_theory_norms:8.2e}"]


def memory_plan(V: int, d_model: int, n_layers: int, n_heads: int, n_params: int,
                analyses: Sequence[str], *, dtype_bytes: int = 4, chunk: int = 4096,
                per_head_layers: int | None = None) -> Plan:
    """Peak bytes and flops for scoring one checkpoint with the factored cosines.

    Theory matrices: one V x V each in the compute dtype (Bbar^T is a view of Bbar).
    Residuals: pre/attn/post for every layer, V x d_model each. Transients: one layer's
    factors (F, G for the mean and every head, plus float64 copies for the r x r norms) and
    one V x chunk column block with its product (two blocks for the theory-norm pass).
    """
    from pythia_probe.analysis import get_analyses

    names = {t for a in get_analyses(list(analyses)) for t in a.theories} - {"BbarT"}
    heads = n_layers if per_head_layers is None else per_head_layers
    theories = len(names) * V * V * dtype_bytes
    residuals = 3 * n_layers * V * d_model * dtype_bytes
    weights = n_params * dtype_bytes
    r = 2 * d_model if "attention" in analyses else d_model  # mean + all heads of a layer
    factors = 2 * V * r * dtype_bytes + V * r * 8
    transient = factors + 2 * V * chunk * dtype_bytes + r * chunk * dtype_bytes
    flops = 0.0
    if "embedding" in analyses:
        flops += 3 * n_layers * 2 * V * V * d_model
    if "attention" in analyses:
        flops += n_layers * 2 * V * V * d_model + heads * 2 * V * V * d_model
    if "unembedding" in analyses:
        flops += 3 * 2 * V * V * d_model
    return Plan(theories, residuals, weights, transient, flops, len(names) * 2 * V**3)
