"""The targets every step is scored against, prepared once per run from the statistics, in
the one form a target is held (:mod:`pythia_probe.analysis.factored`), with the scoring part's
dtype, device and block size: full-vocabulary factored statistics through their sparse parts on
the scoring device (one set shared by every target, nothing V x V anywhere); top-k restricted or
first-format (dense) statistics each target matrix its own single factor. A target's
once-per-statistics vectors (D, m, the norm, the chance terms) are cached by the statistics'
content identity, ``stats_id``, in the tool's cache (:func:`targets_cache`), checked by their
digest; never by where the statistics file lies.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from tqdm import tqdm

from pythia_probe.analysis import target_matrix
from pythia_probe.analysis.factored import FactoredTarget, Parts, dense_parts
from pythia_probe.analysis.factored_cache import cached_vectors, read_vectors, vectors_path
from pythia_probe.analysis.intervals import ceiling
from pythia_probe.errors import BadInputError
from pythia_probe.hub.io import tool_cache
from pythia_probe.sweep.config import ScoringConfig
from pythia_probe.sweep.statistics import LazyStats


def targets_cache(stats_id: str) -> Path:
    """Where the vectors of the targets of statistics ``stats_id`` are cached:
    ``<tool cache>/targets/<stats_id>`` (``$PYTHIA_PROBE_CACHE``, else under ``HF_HOME``)."""
    return tool_cache("targets") / str(stats_id)


def uncached(stats_id: str | None, names: Sequence[str]) -> list[str]:
    """The targets among ``names`` whose norms are not cached for statistics ``stats_id`` (all
    of them before the statistics exist: ``stats_id`` None)."""
    if stats_id is None:
        return list(names)
    where = targets_cache(stats_id)
    return [n for n in names if read_vectors(vectors_path(where, n), n, stats_id)[0] is None]


def prepare_targets(stats: LazyStats, names: Sequence[str], scoring: ScoringConfig,
                    progress: bool = True) -> dict[str, FactoredTarget]:
    """The target of every needed name, from the run's statistics."""
    return held_targets(stats.load(), names, scoring, progress)


def full_parts(st) -> dict[str, Any] | None:
    """The sparse parts of full-vocabulary factored statistics ``st``; None for top-k
    restricted or first-format (dense) statistics."""
    try:
        p = st.parts()
    except BadInputError:  # a first-format file: dense tensors
        return None
    return None if p.get("ids") is not None else p


def held_targets(st, names: Sequence[str], scoring: ScoringConfig,
                 progress: bool = True) -> dict[str, FactoredTarget]:
    """Every needed target of statistics ``st`` (a CorpusStats, or anything with ``parts()``
    and ``stats_id``): through the sparse parts where they are full-vocabulary, one set on the
    device shared by all; else each target matrix (top-k or first-format) as its own single
    factor, a derived one composed on the scoring device."""
    names, dtype, device = sorted(set(names)), scoring.torch_dtype, scoring.device
    cache, chunk = targets_cache(st.stats_id), min(scoring.chunk, 1024)
    p = full_parts(st)
    shared = None if p is None else Parts(p, dtype, device, set(names))
    out = {}
    for n in tqdm(names, desc="target norms", disable=len(names) < 2 or not progress):
        if p is None:
            st.compose_device = device
            own = dense_parts(target_matrix(st, n))
            parts = Parts(own, dtype, device, {n})
        else:
            own, parts = p, shared
        vectors = cached_vectors(n, lambda own=own: own, cache, st.stats_id, chunk)
        out[n] = FactoredTarget(n, parts, vectors, st.stats_id)
    return out


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


def prepare_scale(stats: LazyStats, names: Sequence[str], scoring: ScoringConfig,
                  together: bool = True, progress: bool = True,
                  raw: Sequence[str] = ()) -> Scale | None:
    """The run's :class:`Scale` from statistics built with groups (meta ``groups.G`` > 1:
    ``st.leave_out(g)``, ``st.halves()``, each statistics of its own stats_id, prepared like
    the run's targets, cached under that id; ``together`` False (the plan's choice): the
    left-out sets are prepared one at a time, when scored); None without groups or with
    intervals off (``scoring.intervals``). ``raw``: the raw statistics the analyses read
    (``Needs.raw``), taken from each left-out statistics too."""
    G = int((stats.meta.get("groups") or {}).get("G", 0))  # from the header: no tensor read
    if not scoring.intervals or G < 2:
        return None
    st = stats.load()
    names = sorted(set(names))
    A, B = (held_targets(h, names, scoring, False) for h in st.halves())
    ceilings = {n: ceiling(A[n], B[n], min(scoring.chunk, 1024)) for n in names}
    del A, B
    prepare = [partial(_left_out, st, g, names, scoring, raw) for g in st.filled_groups()]
    if not together:
        return Scale(prepare, ceilings)
    return Scale([p() for p in tqdm(prepare, desc="left-out targets", disable=not progress)],
                 ceilings)


def _left_out(st, g: int, names: Sequence[str], scoring: ScoringConfig,
              raw: Sequence[str] = ()) -> dict:
    """The targets (and ``raw`` statistics) of the statistics without group ``g`` (formed
    now, not before)."""
    part = st.leave_out(g)
    return {**held_targets(part, names, scoring, False), **raw_statistics(part, raw)}
