"""The sweep's first stage: what it scores, found before any weight is downloaded. Checks that
need no network (files named on the command line, a Pythia model's --steps), then each
model's steps, first revision and config (the hub's or the cache's listing), its tokenizer and
the statistics it scores against (one choice per tokenizer: every Pythia size shares one),
as a :class:`Prepared` job the planner plans (``planner.sweep.plan``); and, once the run
holds its folder, the statistics builds still missing (:func:`build_missing`). What each model
still downloads (:func:`downloads`) is asked once the output folder's layout is known.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pythia_probe.analysis import combined_needs
from pythia_probe.errors import BadInputError, HubError, MissingFileError
from pythia_probe.hub import PYTHIA_STEPS, is_pythia, parse_steps, plan_downloads
from pythia_probe.planner.disk import disk_limit, model_downloads
from pythia_probe.stats.recipe import ensure
from pythia_probe.sweep.claims import one_builder
from pythia_probe.sweep.config import SweepParts
from pythia_probe.sweep.source import (
    ModelRun,
    asked_steps,
    model_config,
    offline_advice,
    tensor_names,
    timed_tokenizer,
)
from pythia_probe.sweep.statistics import LazyStats, choose_for_models, read_stats_meta
from pythia_probe.tokenizer import tokenizer_fingerprint

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prepared:
    """The sweep's configuration parts, its analyses (objects, each declaring its cost) and
    the models it scores, each with its steps, config, tokenizer and statistics choice."""

    parts: SweepParts
    analyses: list
    runs: list[ModelRun]

    @property
    def needs(self):
        """What the analyses need together (weights, targets, raw statistics, text)."""
        return combined_needs(self.analyses)


def prepare(parts: SweepParts, analyses: list, sources) -> Prepared:
    """Each model's steps, config, tokenizer and statistics choice: nothing downloaded but
    config and tokenizer files."""
    st, sc = parts.statistics, parts.scoring
    check_local(parts)
    runs = _models(parts, sources)
    for r in runs:
        check_heads(sc, r.config.n_layers)
        r.tokenizer, r.fetch_rate = timed_tokenizer(r.source, r.first, st.tokenizer, r.model)
        r.fingerprint = None if r.tokenizer is None else tokenizer_fingerprint(r.tokenizer)
    choose_for_models(st, runs, sc.device)
    return Prepared(parts, analyses, runs)


def check_local(parts: SweepParts) -> None:
    """What needs no network, checked before any network call: files named on the command
    line exist, and a Pythia model's --steps are steps of Pythia's schedule."""
    if all(is_pythia(m) for m in parts.source.models):  # StepError names the nearest steps
        parse_steps(parts.plan.steps, PYTHIA_STEPS)
    stats, text = parts.statistics.stats, parts.scoring.text
    if stats is not None and not Path(stats).is_file():
        raise MissingFileError(f"--stats {stats}: no such statistics file; compute one with "
                               "`python -m pythia_probe.stats compute ...`, or leave --stats "
                               "out to build the paper's recipe")
    if text is not None and not Path(text).is_file():
        raise MissingFileError(f"--text {text}: no such file (a safetensors file with "
                               "'tokens' [N, T+1], e.g. the demo's tokens.safetensors)")


def check_heads(sc, n_layers: int) -> None:
    """Refuse --heads layers the model does not have, naming the valid ones."""
    if isinstance(sc.per_head, list):
        bad = [layer for layer in sc.per_head if not 1 <= layer <= n_layers]
        if bad:
            raise BadInputError(f"--heads {sc.heads}: the model has layers 1..{n_layers} "
                                f"(numbered from 1, as in the paper), not {bad}")


def _models(parts: SweepParts, sources) -> list[ModelRun]:
    """Each model's steps, first revision and config: the hub's (or cache's) listing, nothing
    downloaded but config.json; an unreachable hub is one line saying what to do offline."""
    src = parts.source
    with _offline_advice(parts, sources):
        found = asked_steps(parts.plan.steps, sources)
    runs = []
    for model, source, (steps, lacks) in zip(src.models, sources, found, strict=True):
        if not steps:
            log.warning("%s has none of the asked steps (%s): left out", model, parts.plan.steps)
            continue
        with _offline_advice(parts, [source]):
            first = source.resolve(steps[:1])[0]
        runs.append(ModelRun(model, src.name_of(model), source, steps, lacks, first,
                             model_config(source, first)))
    return runs


@contextlib.contextmanager
def _offline_advice(parts: SweepParts, sources) -> Iterator[None]:
    try:
        yield
    except (HubError, MissingFileError) as err:
        source = sources[0]
        unreachable = isinstance(err, HubError) or source.offline
        if source.local_dir is not None or not unreachable:
            raise  # a local folder's or the hub's own answer (e.g. no such repository)
        if parts.plan.dry_run:
            print("\n".join(line for s in sources for line in _local_lines(parts, s)),
                  flush=True)
        raise offline_advice(source.model, err, source.offline) from err


def _local_lines(parts: SweepParts, source) -> list[str]:
    """What the plan can say without the hub: the asked steps (Pythia's schedule is known) and
    which of them the cache holds (read without the network)."""
    sc, spec, model = parts.scoring, parts.plan.steps, source.model
    asked = parse_steps(spec, PYTHIA_STEPS) if is_pythia(model) else None
    known = f"{len(asked)} steps of the Pythia schedule" if asked else "steps not known offline"
    cached = source.cached_steps()
    held = [s for s in cached if asked is None or s in asked]
    where = (f"the cache {source.storage} holds {len(held)} of them"
             + (f" ({held[:6]}{' ...' if len(held) > 6 else ''}); HF_HUB_OFFLINE=1 plans and "
                "scores from it" if held else ""))
    return [f"model {model}: --steps {spec} ({known}); analyses {','.join(sc.analyses)}; "
            f"results in {parts.output.out}", where]


def build_missing(job: Prepared, ranks, progress) -> dict[Path, LazyStats]:
    """Each distinct statistics file built once if missing, then read (by its path, which is
    named by its content)."""
    parts, out = job.parts, {}
    for r in job.runs:
        path = r.stats.path
        if path in out:
            continue
        if not r.stats.built:  # shards started together build it once
            with one_builder(path, ranks, f"statistics for {r.model}"):
                ensure(r.stats.recipe, r.tokenizer, r.fingerprint, parts.scoring.device, ranks,
                       progress if progress is not None and not out else parts.output.progress)
        out[path] = LazyStats(path, read_stats_meta(path, r.fingerprint))
    return out


def downloads(job: Prepared, layout) -> tuple[list, dict]:
    """The groups of identical weights over every model's steps (the unit of a share) and each
    model's downloads (by name): its steps not done in ``layout`` yet, fetched once per group,
    within the disk the loader may use."""
    runs = job.runs
    groups = plan_downloads([r.source for r in runs], {r.source.model: r.steps for r in runs})
    sc, names = job.parts.scoring, tensor_names(job.needs)
    return groups.groups, {r.name: model_downloads(
        r, groups.groups, [s for s in r.steps if not layout.done(r.name, s, sc.analyses,
                                                          r.stats.stats_id)],
        names, disk_limit(job.parts.source.max_disk_gb, r.source)) for r in runs}
