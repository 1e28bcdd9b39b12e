"""The target matrices every step is scored against, prepared once per run from the statistics.
Takes the :class:`~pythia_probe.sweep.config.TargetsConfig` part (how they are held) and the
scoring part's dtype, device and block size.

``factored``: the statistics' sparse parts on the scoring device, each target scored through
them (:mod:`pythia_probe.analysis.factored`), its once-per-statistics vectors (D, m, norm,
trace, total) cached in the same folder, keyed by stats_id and checked by their digest: nothing
V x V anywhere. ``streamed``: C_T written once to the prepared-target cache (``<stats
stem>.targets/``, keyed by stats_id and checked by its content digest, rebuilt when either
differs) and streamed in blocks per checkpoint, so no V x V matrix stays in memory.
``memory``: each statistic cast to the device and kept resident. ``auto`` is resolved by the plan
(:func:`pythia_probe.sweep.plan.resolve_targets`) before anything here runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from torch import Tensor
from tqdm import tqdm

from pythia_probe.analysis import target_matrix
from pythia_probe.analysis.cosine import Target, prepare_target
from pythia_probe.analysis.factored import FactoredTarget, Parts
from pythia_probe.analysis.factored_cache import cached_vectors
from pythia_probe.analysis.intervals import ceiling
from pythia_probe.analysis.prepared import cached_target
from pythia_probe.errors import BadInputError
from pythia_probe.sweep.config import ScoringConfig, TargetsConfig
from pythia_probe.sweep.statistics import LazyStats


def prepare_targets(stats: LazyStats, names: Sequence[str], tc: TargetsConfig, mode: str,
                    scoring: ScoringConfig, progress: bool = True) -> dict:
    """The prepared target of every needed name; ``mode``: the resolved memory or streamed.
    ``stats``' tensors are read only when a target is built (a warm cache reads none)."""
    names = sorted(set(names))
    if mode == "factored":
        return factored_targets(stats.load(), names, tc.cache_dir(stats.path), scoring,
                                progress)
    if mode == "memory":
        return _resident_targets(stats, names, scoring, progress)
    cache = tc.cache_dir(stats.path)
    dtype, device = scoring.torch_dtype, scoring.device
    return {n: cached_target(n, lambda n=n: _statistic(stats, n, device), cache,
                             stats.stats_id, dtype=dtype, device=device, chunk=scoring.chunk)
            for n in tqdm(names, desc="target cache", disable=len(names) < 2 or not progress)}


def factored_targets(st, names: Sequence[str], cache: Path, scoring: ScoringConfig,
                     progress: bool = True) -> dict[str, FactoredTarget]:
    """Every needed target through the sparse parts of ``st`` (a CorpusStats with ``parts()``
    and ``stats_id``): one set of parts on the device shared by all of them."""
    p = st.parts()
    if p.get("ids") is not None:
        raise BadInputError("--targets factored needs full-vocabulary statistics (these are "
                            "top-k restricted): use --targets auto, memory or streamed")
    Path(cache).mkdir(parents=True, exist_ok=True)
    parts = Parts(p, scoring.torch_dtype, scoring.device, set(names))
    return {n: FactoredTarget(n, parts, cached_vectors(n, lambda: p, cache, st.stats_id,
                                                       min(scoring.chunk, 1024)), st.stats_id)
            for n in tqdm(names, desc="target norms", disable=len(names) < 2 or not progress)}


def _statistic(stats: LazyStats, name: str, device: str) -> Tensor:
    """A target matrix from the statistics; a derived one the file does not store (PhiBT at a
    large vocabulary) is composed on the scoring device, its result on the host."""
    st = stats.load()
    st.compose_device = device
    return target_matrix(st, name)


def _resident_targets(stats: LazyStats, names: Sequence[str], scoring: ScoringConfig,
                      progress: bool) -> dict[str, Target]:
    """Cast each needed target matrix to the device/dtype once (a transpose, Bbar^T or Qbar^T,
    shares its statistic's storage)."""
    dtype, device = scoring.torch_dtype, scoring.device
    cast: dict[str, Tensor] = {}
    for name in sorted(names, key=lambda n: n in TRANSPOSES):
        if name in TRANSPOSES and TRANSPOSES[name] in cast:
            T = cast[TRANSPOSES[name]].T
        else:
            T = _statistic(stats, name, device).to(device, dtype)
        cast.setdefault(name, T)
    return {n: prepare_target(n, cast[n], dtype=dtype, device=device, chunk=scoring.chunk)
            for n in tqdm(names, desc="target norms", disable=len(names) < 2 or not progress)}


TRANSPOSES = {"BbarT": "Bbar", "QbarT": "Qbar"}
"""Targets that are the transpose of another target: held as a view of it in memory mode."""
RAW = "raw"
"""Key of a target set's raw statistics (``Needs.raw``: attention_text's Qbar and Delta), so a
left-out set's analyses read the left-out statistics, not the full corpus's."""


def raw_statistics(st, names: Sequence[str]) -> dict:
    """``{RAW: {name: st[name]}}`` for the raw statistics ``names`` of ``st`` (empty: {})."""
    return {RAW: {n: st[n] for n in names}} if names else {}


@dataclass(frozen=True)
class Scale:
    """What the ceiling and interval columns are scored from, prepared once per run: the
    target sets of the G leave-one-group-out statistics (held, or where they do not fit at
    once, functions preparing each when its scoring comes) and each target's split-half
    cosine (its two halves against each other: the rows' ``ceiling_half``, whose
    Spearman-Brown correction is their ``ceiling``)."""

    left_out: list[dict | Callable[[], dict]]
    ceilings: dict[str, float]


def prepare_scale(stats: LazyStats, names: Sequence[str], tc: TargetsConfig, mode: str,
                  scoring: ScoringConfig, progress: bool = True,
                  raw: Sequence[str] = ()) -> Scale | None:
    """The run's :class:`Scale` from statistics built with groups (meta ``groups.G`` > 1:
    ``st.leave_out(g)``, ``st.halves()``, each statistics of its own stats_id, prepared like
    the run's targets in a cache subfolder of that id; ``scoring.together`` False: the
    left-out sets are prepared one at a time, when scored); None without groups or with
    intervals off (``scoring.intervals``). ``raw``: the raw statistics the analyses read
    (``Needs.raw``), taken from each left-out statistics too."""
    G = int((stats.meta.get("groups") or {}).get("G", 0))  # from the header: no tensor read
    if not scoring.intervals or G < 2:
        return None
    st = stats.load()
    names = sorted(set(names))
    cache = tc.cache_dir(stats.path)
    A, B = (part_targets(h, names, cache, mode, scoring) for h in st.halves())
    ceilings = {n: ceiling(A[n], B[n], min(scoring.chunk, 1024)) for n in names}
    del A, B
    prepare = [partial(_left_out, st, g, names, cache, mode, scoring, raw)
               for g in st.filled_groups()]
    if not scoring.together:
        return Scale(prepare, ceilings)
    return Scale([p() for p in tqdm(prepare, desc="left-out targets", disable=not progress)],
                 ceilings)


def _left_out(st, g: int, names: Sequence[str], cache: Path, mode: str,
              scoring: ScoringConfig, raw: Sequence[str] = ()) -> dict:
    """The targets (and ``raw`` statistics) of the statistics without group ``g`` (formed
    now, not before)."""
    part = st.leave_out(g)
    return {**part_targets(part, names, cache, mode, scoring), **raw_statistics(part, raw)}


def part_targets(st, names: Sequence[str], cache: Path, mode: str,
                 scoring: ScoringConfig) -> dict:
    """The targets of statistics ``st`` of part of the corpus (a CorpusStats), held as
    ``mode``; caches in ``cache/part-<stats_id>`` so parts never overwrite each other."""
    sub = Path(cache) / f"part-{st.stats_id[:16]}"
    dtype, device = scoring.torch_dtype, scoring.device
    if mode == "factored":
        return factored_targets(st, names, sub, scoring, progress=False)
    if mode == "memory":
        return {n: prepare_target(n, target_matrix(st, n).to(device, dtype), dtype=dtype,
                                  device=device, chunk=scoring.chunk) for n in names}
    return {n: cached_target(n, lambda n=n: target_matrix(st, n), sub, st.stats_id,
                             dtype=dtype, device=device, chunk=scoring.chunk) for n in names}
