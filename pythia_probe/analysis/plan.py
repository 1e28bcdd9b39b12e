"""Memory and compute plan of one checkpoint's analyses (what the sweep's --dry-run prints).

Everything is computed from the shapes: V (statistic rows), d_model, n_layers, n_heads, the
number of parameters, the analyses and the compute dtype, for either way of holding the target
matrices: ``streamed`` (each prepared target C_T is cached on disk once per statistics and read
in ``chunk``-row blocks once per layer and analysis, so nothing V x V is resident) or resident
(``--targets memory``: each statistic V x V stays in memory). The sweep's default ``--targets
auto`` picks memory when its planned peak fits the device's budget (:func:`memory_budget`,
:func:`choose_targets`), since streaming re-reads the cache every checkpoint (e.g. ~485 GB for
full-vocabulary pythia-1.4b).
See benchmarks/bench_analysis.py for measurements against the materialised computation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pythia_probe.analysis.base import Shape
from pythia_probe.analysis.registry import get_analyses
from pythia_probe.resources import GPU_SAFETY, memory_budget  # noqa: F401 - the plan's budget

GB = 1e9


@dataclass(frozen=True)
class Plan:
    """Bytes held at the peak of one checkpoint's analysis, by part, and flops per checkpoint."""

    targets: float
    residuals: float
    weights: float
    transient: float
    flops_per_step: float
    flops_target_norms: float
    targets_disk: float = 0.0
    targets_read_per_step: float = 0.0

    @property
    def total(self) -> float:
        return self.targets + self.residuals + self.weights + self.transient

    def lines(self) -> list[str]:
        """Human-readable lines, GB = 1e9 bytes."""
        return [f"target matrices (resident)    {self.targets / GB:8.2f} GB",
                f"target cache on disk (once)   {self.targets_disk / GB:8.2f} GB",
                f"targets read per checkpoint   {self.targets_read_per_step / GB:8.2f} GB",
                f"single-token residuals        {self.residuals / GB:8.2f} GB",
                f"weights of one checkpoint     {self.weights / GB:8.2f} GB",
                f"factors + chunk transients    {self.transient / GB:8.2f} GB",
                f"peak total                    {self.total / GB:8.2f} GB",
                f"flops per checkpoint          {self.flops_per_step:8.2e}",
                f"flops for target norms (once) {self.flops_target_norms:8.2e}"]


def memory_plan(V: int, d_model: int, n_layers: int, n_heads: int, n_params: int,
                analyses: Sequence[str], *, dtype_bytes: int = 4, chunk: int = 4096,
                per_head_layers: int | None = None, streamed: bool = True,
                max_rank: int = 0) -> Plan:
    """Peak bytes and flops for scoring one checkpoint with the factored cosines.

    Target matrices: streamed, none resident; the cache holds C_T per target (Bbar^T is its own
    file) and is read once per pass: one layer per pass, or as many layers as fit in
    ``max_rank`` stacked factor columns. Resident: one V x V each in the compute dtype (Bbar^T
    is a view of Bbar).
    Residuals: pre/attn/post for every layer, V x d_model each. Transients: one pass's
    factors (F, G for the mean and every head, plus float64 copies for the r x r norms) and
    one V x chunk column block with its product (streamed: the host read buffer and its copy on
    the device; resident: two blocks for the target-norm pass).
    """
    chosen = get_analyses(list(analyses))
    names = {t for a in chosen for t in a.needs.targets} - {"BbarT"}
    files = {t for a in chosen for t in a.needs.targets}
    heads = n_layers if per_head_layers is None else per_head_layers
    costs = [a.cost(Shape(V, d_model, n_layers, n_heads, heads)) for a in chosen]
    targets = 0 if streamed else len(names) * V * V * dtype_bytes
    residuals = 3 * n_layers * V * d_model * dtype_bytes * any(a.needs.residuals for a in chosen)
    weights = n_params * dtype_bytes
    layered = [c.rank_per_layer for c in costs if c.rank_per_layer]
    per_pass = [(rank, min(n_layers, max(1, max_rank // rank))) for rank in layered]
    passes = sum(-(-n_layers // k) for _, k in per_pass) + sum(c.passes for c in costs)
    r = max([rank * k for rank, k in per_pass] or [d_model])
    factors = 2 * V * r * dtype_bytes + V * r * 8
    transient = factors + 2 * V * chunk * dtype_bytes + r * chunk * dtype_bytes
    flops = float(sum(c.flops for c in costs))
    disk = len(files) * V * V * dtype_bytes if streamed else 0.0
    read = passes * V * V * dtype_bytes if streamed else 0.0
    return Plan(targets, residuals, weights, transient, flops, len(files) * 2 * V**3, disk, read)


# ---- --targets auto --------------------------------------------------------------------------


def choose_targets(need: float, budget: float | None, measured: str = "") -> tuple[str, str]:
    """``--targets auto``: ("memory", why) when the memory-mode peak ``need`` fits ``budget``,
    else ("streamed", why); streamed too when the budget is unknown (None)."""
    if budget is None:
        return "streamed", f"memory-mode peak {need / GB:.2f} GB; budget unknown ({measured})"
    fits = need <= budget
    return ("memory" if fits else "streamed",
            f"memory-mode peak {need / GB:.2f} GB {'fits' if fits else 'exceeds'} budget "
            f"{budget / GB:.2f} GB ({measured})")
