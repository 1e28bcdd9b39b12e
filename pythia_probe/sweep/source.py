"""Where the weights come from: the model's checkpoints through :mod:`pythia_probe.hub` (a
hub id, a local folder of ``step*/`` folders, or a Hugging Face cache), the steps it has, its
config and tokenizer, and the stream of loaded revisions under a disk limit. Everything here
takes the :class:`~pythia_probe.sweep.config.SourceConfig` part, or the source it opened.

Checks that need no network come first (:func:`check_model_name`, the --steps grammar in
the config); when the hub cannot be reached, :func:`offline_advice` says in one line what to do.
"""

from __future__ import annotations

import difflib
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from pythia_probe.analysis import Needs
from pythia_probe.arch import NeoXConfig, NeoXWeights, name_filter
from pythia_probe.errors import (
    BadInputError,
    CorruptFileError,
    HubError,
    HubUnreachableError,
    MissingFileError,
    StepError,
    UserError,
)
from pythia_probe.hub import (
    CheckpointSource,
    endpoint,
    is_pythia,
    ledger,
    offline_hint,
    parse_steps,
    read_json,
)
from pythia_probe.planner.estimate import Rate
from pythia_probe.sweep.config import SourceConfig
from pythia_probe.tokenizer import load_tokenizer

log = logging.getLogger(__name__)

TOKENIZER = "tokenizer.json"
TOKENIZER_FILES = ("tokenizer_config.json", "special_tokens_map.json", TOKENIZER)
#: the sizes of the Pythia suite (EleutherAI/pythia-SIZE, -deduped, -v0, -seedN variants)
PYTHIA_SIZES = ("14m", "31m", "70m", "160m", "410m", "1b", "1.4b", "2.8b", "6.9b", "12b")
_SIZE = re.compile(r"pythia-(\d[^-]*)", re.IGNORECASE)


def check_model_name(model: str) -> None:
    """Refuse, before any network call, a Pythia id whose size is not one of the suite's
    (``EleutherAI/pythia-1.4bb``), naming the nearest valid ids."""
    m = _SIZE.match(model.split("/", 1)[-1])
    if not is_pythia(model) or m is None or m.group(1).lower() in PYTHIA_SIZES:
        return
    near = difflib.get_close_matches(m.group(1).lower(), PYTHIA_SIZES, n=2, cutoff=0.3)
    valid = ", ".join(f"EleutherAI/pythia-{s}" for s in near or PYTHIA_SIZES[2:6])
    raise BadInputError(f"--model {model}: Pythia has no size {m.group(1)!r} (sizes: "
                        f"{', '.join(PYTHIA_SIZES)}, each also -deduped); nearest: {valid}")


def open_source(src: SourceConfig, model: str | None = None) -> CheckpointSource:
    """The CheckpointSource of ``model`` (default the first of the run's models):
    ``--cache-dir``, else the tool's own checkpoint cache."""
    model = src.models[0] if model is None else model
    check_model_name(model)
    return CheckpointSource(model, cache_dir=src.cache_dir)


def select_steps(spec: str, source) -> list[int]:
    """Parse --steps against the steps the model has (StepError names the nearest valid ones);
    offline, a model with no checkpoint in the cache is a MissingFileError."""
    available = source.steps()
    if not available and source.local_dir is None and source.offline:
        raise MissingFileError(f"no checkpoint of {source.model} in the cache {source.storage}")
    steps = parse_steps(spec, available) if available else []
    if not steps:
        raise StepError(no_steps_line(spec, source, available))
    return steps


def no_steps_line(spec: str, source, available: list[int]) -> str:
    """Why ``--steps spec`` selects nothing of ``source``: it has no checkpoints at all (a
    folder without step*/ folders, a hub repo without step* branches), or none of those."""
    if not available:
        where = (f"no step*/ folders in {source.local_dir}" if source.local_dir is not None
                 else "no step* branches on the hub")
        return f"--model {source.model} has no checkpoints ({where})"
    return (f"--steps {spec} selects none of the {len(available)} steps {source.model} has "
            f"({_few(available)})")


def offline_advice(model: str, err: BaseException, offline: bool) -> HubError:
    """The one line for a hub that cannot be reached, or (``offline``: HF_HUB_OFFLINE is set)
    a cache without the model: what to do offline (the hub's offline_hint, for this model)."""
    todo = offline_hint(model, "step1000")
    if offline:
        return HubError(f"cannot list the checkpoints of {model} (HF_HUB_OFFLINE is set): "
                        f"{' '.join(str(err).split())}; pass --cache-dir with a Hugging Face "
                        f"cache that holds it, or {todo.split('; ', 1)[1]}")
    why = ("it cannot be reached" if isinstance(err, HubUnreachableError) else
           " ".join(str(err).split()))
    return HubError(f"cannot list the checkpoints of {model} on {endpoint()}: {why}; {todo}")


def tensor_names(needs: Needs):
    """Which weights the analyses read (HF-name predicate from arch)."""
    return name_filter(*needs.weights)


def model_config(source, rev) -> NeoXConfig:
    """The NeoXConfig of a revision from its config.json alone (no weights downloaded; the file
    verified against the hub's hash)."""
    if rev.local_dir is not None:
        path = Path(rev.local_dir) / "config.json"
        return NeoXConfig.from_dict(read_json(path, f"config.json of {rev.where}"), str(path))
    return NeoXConfig.from_dict(source.config(rev), f"config.json of {rev.where}")


def model_tokenizer(source, rev, tokenizer: str | None, model: str):
    """The tokenizer of the statistics: ``tokenizer`` (--tokenizer), else the one the first
    revision ships (local folder, or the hub at that commit, verified); None (with a warning)
    if none."""
    if tokenizer:
        return load_tokenizer(tokenizer)
    if source.local_dir is not None:
        found = [d for d in (source.local_dir, Path(rev.local_dir)) if (d / TOKENIZER).is_file()]
        path = found[0] if found else None
    elif rev.file(TOKENIZER) is not None:  # the files AutoTokenizer reads, from that commit
        paths = [source.fetch_file(rev, n) for n in TOKENIZER_FILES if rev.file(n) is not None]
        path = paths[-1].parent
    else:
        path = None
    if path is None:
        log.warning("%s ships no tokenizer.json; the statistics' tokenizer is not checked "
                    "(pass --tokenizer to check it)", model)
        return None
    return _load_model_tokenizer(path, rev)


def timed_tokenizer(source, rev, tokenizer: str | None, model: str):
    """(:func:`model_tokenizer`, the :class:`~pythia_probe.planner.estimate.Rate` its downloads
    reached, or None when nothing was fetched): the plan's measured bandwidth."""
    files = ([] if tokenizer or source.local_dir is not None or source.offline else
             [f for n in TOKENIZER_FILES if (f := rev.file(n)) is not None])
    fetched = sum(f.size for f in files if source.cache.find(rev.commit, f) is None)
    start = time.perf_counter()
    tok = model_tokenizer(source, rev, tokenizer, model)
    return tok, (Rate(fetched, time.perf_counter() - start) if fetched else None)


def _load_model_tokenizer(path: Path, rev):
    """The model's tokenizer folder, loaded; a file there that does not parse is named."""
    try:
        return load_tokenizer(str(path))
    except UserError:
        raise
    except Exception as err:  # noqa: BLE001 - tokenizers/transformers raise many kinds
        raise CorruptFileError(f"the tokenizer files of {rev.where} in {path} cannot be "
                               f"loaded: {type(err).__name__}: {err}") from err


def to_weights(loaded, device: str, dtype: torch.dtype) -> NeoXWeights:
    """NeoXWeights on the scoring device and dtype (so residual streams are computed there)."""
    tensors = {k: v.to(device, dtype) for k, v in loaded.tensors.items()}
    where = f"config.json of {loaded.revision.model}@{loaded.revision.branch}"
    return NeoXWeights(tensors, NeoXConfig.from_dict(loaded.config, where))


def load_weights(source, rev, names):
    """Fetch and load one revision directly (used for retries); evicts its files afterwards."""
    try:
        return source.load(rev, source.fetch(rev, names), names)
    finally:
        source.evict(rev)


def stream(source, revs, names, prefetch: int, max_disk: float | None):
    """Yield (revision, Loaded or the exception it raised), prefetching ``prefetch`` revisions
    ahead and never holding more than ``max_disk`` bytes of downloads.

    A failing revision ends the stream; it is yielded as an error and the stream restarts
    after it.
    """
    i = 0
    while i < len(revs):
        try:
            for loaded in source.stream(revs[i:], names=names, prefetch=prefetch,
                                        max_disk=max_disk):
                yield loaded.revision, loaded
                i += 1
        except Exception as e:  # noqa: BLE001 - reported per step by the caller
            yield revs[i], e
            i += 1


def revision_ledger(source, steps: list[int], model: str) -> pd.DataFrame:
    """The revision ledger of ``steps`` (:func:`pythia_probe.hub.revisions.ledger`: from metadata,
    no weight downloaded; local folders hashed) with the model's name as its first column."""
    df = ledger(source, steps)
    df.insert(0, "model", model)
    return df


def ledger_lines(df: pd.DataFrame, model: str) -> list[str]:
    """The plan's line on what the branches hold; suspect steps named in a warning too."""
    counts = df["status"].value_counts()
    suspect = df[df["status"] == "suspect"]
    line = (f"revisions of {model}: " + ", ".join(f"{int(counts.get(s, 0))} {s}" for s in
                                                  ("ok", "duplicate", "suspect")))
    if not suspect.empty:
        log.warning("%s: steps %s are suspect (scored; their rows say revision_status "
                    "suspect, the figures mark them, the summary leaves them out): step%d: %s",
                    model, ",".join(map(str, suspect["step"])), suspect["step"].iloc[0],
                    suspect["reason"].iloc[0])
    return [line]


# ---- the models of one sweep ------------------------------------------------------------------
@dataclass
class ModelRun:
    """One model of a sweep: its source, the asked steps it has (and those it lacks), the first
    revision's config and the tokenizer of its statistics; later its ledger and statistics."""

    model: str
    name: str  # the model column of the table
    source: CheckpointSource
    steps: list[int]
    lacks: list[int]
    first: object  # Revision
    config: NeoXConfig
    tokenizer: object = None
    fingerprint: dict | None = None
    fetch_rate: Rate | None = None  # what the planning fetches reached (the tokenizer files)
    ledger: pd.DataFrame | None = None
    stats: object = None  # sweep.statistics.StatsChoice

    @property
    def status(self) -> dict[int, str]:
        """step -> the ledger's status (ok, duplicate, suspect)."""
        if self.ledger is None:
            return {}
        return {int(s): str(v) for s, v in zip(self.ledger["step"], self.ledger["status"],
                                               strict=True)}


def asked_steps(spec: str, sources) -> list[tuple[list[int], list[int]]]:
    """(steps it has, asked steps it lacks) per source. One model: the spec against its own
    steps (a step it lacks is an error naming the nearest). Several: against every step any of
    them has (a step none has is the error), each model reported lacking the others'."""
    if len(sources) == 1:
        return [(select_steps(spec, sources[0]), [])]
    have = [set(src.steps()) for src in sources]
    for src, steps in zip(sources, have, strict=True):
        if not steps and src.local_dir is None and src.offline:
            raise MissingFileError(f"no checkpoint of {src.model} in the cache {src.storage}")
    asked = parse_steps(spec, sorted(set().union(*have)))
    if not asked:
        has = "; ".join(f"{src.model} has {f'steps {_few(sorted(h))}' if h else 'no checkpoints'}"
                        for src, h in zip(sources, have, strict=True))
        raise StepError(f"--steps {spec} selects no step of any of the models ({has})")
    return [([s for s in asked if s in h], [s for s in asked if s not in h]) for h in have]


def lacking_lines(runs) -> list[str]:
    """One line per model that lacks asked steps (reported for that model only)."""
    return [f"{r.model} lacks {len(r.lacks)} of the asked steps ({_few(r.lacks)}): not on the "
            "hub for this model; its other steps and the other models are swept"
            for r in runs if r.lacks]


def _few(steps: list[int]) -> str:
    return ", ".join(map(str, steps[:8])) + (" ..." if len(steps) > 8 else "")
