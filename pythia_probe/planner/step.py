"""Memory and compute plan of one checkpoint's analyses (what the sweep's --dry-run prints).

Computed from the shapes alone: V (statistic rows), the model (d_model, layers, heads,
d_mlp, parameters), the analyses, the compute dtype and how the targets are held:

- ``factored``: the statistics' sparse parts (``nnz``: their non-zeros) on the device, products
  nnz x (d_model + 1) per (stream, target), nothing V x V anywhere;
- ``dense`` (top-k or first-format statistics): each target matrix V x V its own single factor,
  in the compute dtype on the device and in float64 on the host.

Once per statistics each target's norms (D, m, ||C_T C_T^T||_F, the chance terms;
:func:`~pythia_probe.analysis.factored.target_vectors`) are computed in float64 on the host and
cached by the statistics' content identity: ``once_macs``, costed at the host's float64 sparse
rate where they are not cached yet (:meth:`Plan.norm_macs`).

A step is scored layer by layer (:mod:`pythia_probe.analysis.layers`): the forward pass holds
one layer's streams, each stream becomes a basis of width d_model + 1 whose Gram and whose
product with each target are computed once (:mod:`pythia_probe.analysis.basis`); a Gram costs
its upper block triangle (:func:`gram_macs`, about half of V (d + 1)^2). Work is counted in
multiply-adds, split into dense (GEMM) and sparse products, so the expected seconds per step
follow from the two rates measured on the device (:mod:`.rates`). Each analysis declares its
own part (``Analysis.cost`` of a :class:`Shape`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from pythia_probe.planner.budget import GB

GRAM_BLOCK = 1100  # column block of a Gram's upper triangle (d + 1 = 2,049: two blocks)
MODES = ("dense", "factored")
#: the products each factored target needs, by the parts they multiply
PRODUCT_PARTS = {"PhiBT": ("W", "C"), "Qbar": ("Qbar",), "Bbar": ("C",), "BbarT": ("C",),
                 "QbarT": ("Qbar",), "QbarHeadT": ("QbarHead",)}


class Shape(NamedTuple):
    """Sizes an analysis's cost depends on (``Analysis.cost``): statistic rows V, the model's
    d_model, layers, heads, and the number of layers scored per head."""

    V: int
    d_model: int
    n_layers: int
    n_heads: int
    head_layers: int


def block_edges(k: int) -> list[int]:
    """Column edges of a Gram's blocks of about GRAM_BLOCK (``analysis.basis.add_gram``)."""
    nb = max(1, -(-k // GRAM_BLOCK))
    return [k * i // nb for i in range(nb + 1)]


def gram_macs(rows: int, k: int) -> int:
    """Multiply-adds of ``add_gram`` over ``rows`` rows of width k (about half of k^2)."""
    e = block_edges(k)
    return rows * sum((b - a) * (k - a) for a, b in zip(e, e[1:], strict=False))


@dataclass(frozen=True)
class StepShape:
    """The sizes a step's cost depends on."""

    V: int
    d_model: int
    n_layers: int
    n_heads: int
    d_mlp: int
    n_params: int


@dataclass(frozen=True)
class Plan:
    """Bytes held at the peak of one checkpoint's analysis, by part; multiply-adds per step
    (dense and sparse) and once per statistics."""

    mode: str
    targets: float
    residuals: float
    weights: float
    transient: float
    dense_macs: float
    sparse_macs: float
    once_macs: float
    parts: dict = field(default_factory=dict)
    groups: int = 0
    shared_macs: float = 0.0
    """The part of dense_macs every target set shares (the forward pass, the bases' moments):
    done once per step however many interval scorings read it."""
    together: bool = True
    """With groups: every target set held at once (False: one replicate set at a time)."""
    norms: dict = field(default_factory=dict)
    """Multiply-adds of each target's once-per-statistics norms (one target set)."""

    @property
    def total(self) -> float:
        return self.targets + self.residuals + self.weights + self.transient

    @property
    def flops_per_step(self) -> float:
        return 2 * (self.dense_macs + self.sparse_macs)

    def seconds(self, rates: Mapping[str, float]) -> float:
        """Expected seconds per step at ``rates`` (multiply-adds per second: dense, sparse)."""
        return self.dense_macs / rates["dense"] + self.sparse_macs / rates["sparse"]

    def norm_macs(self, names) -> float:
        """Multiply-adds of the norms of targets ``names`` (e.g. those not cached yet), of
        every target set the run holds (with groups: G + 3 sets and the halves' cross
        product, about one more)."""
        return sum(self.norms[n] for n in names) * (self.groups + 4 if self.groups else 1)

    def lines(self, rates: Mapping[str, float] | None = None) -> list[str]:
        """Human-readable lines, GB = 1e9 bytes; with measured ``rates`` the expected time."""
        held = {"dense": "dense matrices", "factored": "sparse parts"}
        out = [f"targets ({held[self.mode]})".ljust(30) + f"{self.targets / GB:8.2f} GB"]
        out += [f"one layer's streams and bases {self.residuals / GB:8.2f} GB",
                f"weights of one checkpoint     {self.weights / GB:8.2f} GB",
                f"products and transients       {self.transient / GB:8.2f} GB",
                f"peak total                    {self.total / GB:8.2f} GB",
                f"multiply-adds per checkpoint  {self.dense_macs:8.2e} dense, "
                f"{self.sparse_macs:.2e} sparse",
                f"multiply-adds once per stats  {self.once_macs:8.2e} (target norms, cached)"]
        if self.groups and self.together:
            out.append(f"ceiling and intervals (G = {self.groups} groups): {self.groups + 3} "
                       f"target sets, {self.groups + 1} scorings per step sharing one forward pass "
                       "(--no-intervals: 1)")
        elif self.groups:
            out.append(f"ceiling and intervals (G = {self.groups} groups): the {self.groups + 3} "
                       "target sets do not fit at once: one replicate set at a time, "
                       f"{self.groups + 1} scorings per step, each with its own forward pass "
                       "(--no-intervals: 1)")
        if rates:
            out.append(f"expected time per checkpoint  {self.seconds(rates):8.1f} s (dense "
                       f"{rates['dense'] / 1e9:.1f}, sparse {rates['sparse'] / 1e9:.2f} "
                       "G multiply-adds/s, measured now)")
        return out


KNOWN = ("embedding", "attention", "attention_lnfold", "unembedding")


def _bases(names: set[str], L: int, heads: int = 0) -> dict[str, int]:
    """Distinct bases of one step against each target (the embedding's stream after layer l
    is layer l + 1's pre; the attention maps read each layer's pre)."""
    out = {}
    if "embedding" in names:
        out["PhiBT"] = 1 + 2 * L
    if names & {"attention", "attention_lnfold"}:  # each layer's pre on both orientations
        out["Qbar"] = out["QbarT"] = L
        if heads:
            out["QbarHeadT"] = heads  # the authors' per-head target, on the layers with heads
    if "unembedding" in names:
        for t in ("Bbar", "BbarT"):
            out[t] = out.get(t, 0) + 1
        out["PhiBT"] = out.get("PhiBT", 0) + 1
    return out


class Scoring(NamedTuple):
    """How a step is scored: bytes of the compute dtype, the layers scored per head (None:
    every layer), the rank a pass holds (0: one layer a pass) and the rows of an MLP batch."""

    dtype_bytes: int = 4
    per_head_layers: int | None = None
    max_rank: int = 0
    batch_size: int = 4096


def memory_plan(s: StepShape, analyses: Sequence, *, mode: str = "factored",
                nnz: Mapping[str, int] | None = None, how: Scoring | None = None) -> Plan:
    """Peak bytes and multiply-adds for scoring one checkpoint (see the module docstring);
    ``analyses``: the :class:`~pythia_probe.analysis.base.Analysis` objects, each declaring
    its cost; ``nnz``: non-zeros of the parts ``C``, ``W``, ``Qbar`` (``mode`` factored)."""
    if mode not in MODES:
        raise ValueError(f"targets mode {mode!r}; valid: {', '.join(MODES)}")
    chosen = list(analyses)
    names = {a.name for a in chosen}
    how = how or Scoring()
    V, d, L, b = s.V, s.d_model, s.n_layers, how.dtype_bytes
    w, max_rank, batch_size = d + 1, how.max_rank, how.batch_size
    heads = L if how.per_head_layers is None else how.per_head_layers
    per_target = _bases(names, L, heads)
    costs = {a.name: a.cost(Shape(V, d, L, s.n_heads, heads)) for a in chosen}
    for a in chosen:  # an analysis the plan does not know: its own bases on its targets
        if a.name not in KNOWN:
            for t in a.needs.targets:
                per_target[t] = per_target.get(t, 0) + costs[a.name].bases
    layered = bool(names & {"embedding", "attention", "attention_lnfold"})
    k = min(L, max(1, max_rank // w)) if max_rank else 1  # layers per pass
    n_bases = (1 + 2 * L if "embedding" in names else L if layered else 0) + \
        3 * ("unembedding" in names)
    nnz = dict(nnz or {})
    parts = {p: nnz.get(p, 0) for t in per_target for p in PRODUCT_PARTS[t]}
    targets = {"dense": len(per_target) * V * V * b,
               "factored": sum(n * (b + 8) + 8 * (V + 1) for n in parts.values())
               + 16 * V * len(per_target)}[mode]
    held = (2 * k + 1) if "embedding" in names else k
    residuals = layered * (3 * V * d * b + held * V * w * b + 2 * batch_size * s.d_mlp * b)
    group = max(per_target.values(), default=0) and (2 * k + 1) * w
    transient = V * group * b + 3 * V * w * b + 12 * w * w * 8
    dense = layered * V * L * (2 * d * d + 2 * d * s.d_mlp) + n_bases * gram_macs(V, w)
    shared = dense
    dense += sum(c.macs for c in costs.values())
    sparse, norms = 0.0, {}
    for t, n in per_target.items():
        dense += n * gram_macs(V, w)  # factored: at most (the rows the corpus fills)
        if mode == "factored":
            sparse += n * w * sum(parts[p] for p in PRODUCT_PARTS[t])
            norms[t] = float(2 * V * sum(parts[p] for p in PRODUCT_PARTS[t]))
        else:
            dense += n * V * V * w
            norms[t] = float(V ** 3)
    return Plan(mode, targets, residuals, s.n_params * b, transient, float(dense),
                float(sparse), sum(norms.values()), parts, shared_macs=float(shared),
                norms=norms)


def with_groups(plan: Plan, G: int) -> Plan:
    """The plan with the ceiling and interval columns of statistics of G document groups: G + 3
    target sets held (the run's, G left out, two halves), G + 1 scorings per step sharing one
    forward pass and the bases' moments (``shared_macs``: once), each with its own pass over
    its targets; the once-per-statistics work G + 3 times (the halves' cross product, once, is
    about one more norm)."""
    if G < 2:
        return plan
    own = plan.dense_macs - plan.shared_macs
    return replace(plan, targets=plan.targets * (G + 3),
                   dense_macs=plan.shared_macs + own * (G + 1),
                   sparse_macs=plan.sparse_macs * (G + 1), once_macs=plan.once_macs * (G + 4),
                   groups=G)


def one_set_at_a_time(plan: Plan) -> Plan:
    """A :func:`with_groups` plan with the replicate target sets prepared one at a time: the
    run's targets, one replicate's and, while the ceiling is computed once, the second half's
    held (3 sets), and a forward pass per scoring (the same numbers, less memory)."""
    G = plan.groups
    if not G or not plan.together:
        return plan
    own = (plan.dense_macs - plan.shared_macs) / (G + 1)
    return replace(plan, targets=plan.targets / (G + 3) * 3,
                   dense_macs=(plan.shared_macs + own) * (G + 1), together=False)
