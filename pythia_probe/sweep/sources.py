"""Everything the sweep reads before and around the analyses: checkpoints (through
:mod:`pythia_probe.checkpoints`), statistics, and the checks that run before any download.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file
from tqdm import tqdm

from pythia_probe.analysis import Needs, theory_matrix
from pythia_probe.analysis.cosine import Theory, prepare_theory
from pythia_probe.analysis.plan import choose_theory, memory_plan
from pythia_probe.analysis.prepared import prepared_theory
from pythia_probe.arch import NeoXConfig, NeoXWeights, name_filter
from pythia_probe.checkpoints import CheckpointSource
from pythia_probe.errors import (
    BadInputError,
    CorruptFileError,
    MismatchError,
    MissingFileError,
    UserError,
)
from pythia_probe.resources import human_bytes, memory_budget
from pythia_probe.results import read_manifest
from pythia_probe.stats import CorpusStats, compose
from pythia_probe.steps import parse_steps
from pythia_probe.sweep.config import SweepConfig, shard_done
from pythia_probe.tokenizer import load_tokenizer
from pythia_probe.weights_io import read_json

log = logging.getLogger(__name__)

TOKENIZER = "tokenizer.json"
TOKENIZER_FILES = ("tokenizer_config.json", "special_tokens_map.json", TOKENIZER)


def load_stats(cfg: SweepConfig, fingerprint: dict | None):
    """The CorpusStats of ``--stats``, refused if computed with another tokenizer."""

    path = Path(cfg.stats)
    if not path.is_file():
        raise MissingFileError(f"--stats {cfg.stats}: no such statistics file; compute one with "
                               "`python -m pythia_probe.stats ...` (or run --demo)")
    return CorpusStats.load(path, expect=fingerprint)


class LazyStats:
    """A statistics file's metadata (token ids, d_vocab, T, stats_id, restricted) read from its
    header; the tensors are loaded by :meth:`load` on first use only, then kept."""

    def __init__(self, cfg: SweepConfig, meta: dict) -> None:
        missing = [k for k in ("d_vocab", "T", "stats_id") if k not in meta]
        if missing:
            raise BadInputError(f"--stats {cfg.stats}: metadata lacks {missing}; recompute it with "
                                "`python -m pythia_probe.stats ...`")
        self.cfg, self.meta, self._stats = cfg, meta, None
        vocab = meta.get("vocab", {})
        self.d_vocab, self.T = int(meta["d_vocab"]), int(meta["T"])
        self.restricted = bool(vocab.get("restricted", False))
        ids = vocab.get("ids")
        self.token_ids = torch.arange(self.d_vocab) if ids is None else torch.tensor(ids)
        self.stats_id = str(meta["stats_id"])

    def load(self):
        """The CorpusStats (every tensor read from disk, once)."""
        if self._stats is None:
            self._stats = load_stats(self.cfg, None)
        return self._stats


def load_text(cfg: SweepConfig, stats) -> torch.Tensor:
    """First ``text_rows`` windows of ``--text``, inputs only, at most the statistics' T long."""

    if stats.restricted:
        raise BadInputError("attention_text needs full-vocabulary statistics (these are top-k)")
    tokens = load_file(cfg.text)["tokens"]
    if tokens.ndim != 2 or int(tokens.max()) >= stats.d_vocab:
        raise BadInputError(f"--text {cfg.text}: need 'tokens' [N, T+1] with ids < "
                            f"{stats.d_vocab}, got shape {tuple(tokens.shape)}")
    return tokens[:cfg.text_rows, :min(tokens.shape[1] - 1, stats.T)]


def _theory_source(lazy: LazyStats, name: str, cfg: SweepConfig) -> torch.Tensor:
    """A theory matrix; PhiBT not stored in the file is composed on the sweep's device."""


    stats = lazy.load()
    if name == "PhiBT" and cfg.device != "cpu":
        with safe_open(cfg.stats, framework="pt") as f:
            stored = "PhiBT" in f.keys()
        if not stored:  # V^3 flops: on the accelerator, result back on the host
            return compose.phi_bt(stats.Bbar, stats.Phibar, device=cfg.device, out_device="cpu")
    return theory_matrix(stats, name)


def prepare_theories(stats, names: Sequence[str], cfg: SweepConfig) -> dict:
    """The theory side of every needed matrix, prepared once per statistics.

    ``--theory streamed`` (default): C_T written once to the theory cache (keyed by stats_id,
    rebuilt when the statistics change) and streamed in blocks per checkpoint, so no V x V
    matrix stays in memory. ``--theory memory``: T cast to the device and kept resident.
    ``stats``: a :class:`LazyStats`; its tensors are read only when a theory is built.
    """
    if cfg.theory == "memory":
        return _resident_theories(stats, names, cfg)

    cache = theory_cache_dir(cfg)
    return {n: prepared_theory(n, lambda n=n: _theory_source(stats, n, cfg), cache,
                               stats.stats_id, dtype=cfg.torch_dtype, device=cfg.device,
                               chunk=cfg.chunk)
            for n in tqdm(sorted(set(names)), desc="theory cache", disable=len(names) < 2)}


def theory_cache_dir(cfg: SweepConfig) -> Path:
    """--theory-cache, else ``<statistics file stem>.theory/`` next to the statistics file."""
    if cfg.theory_cache:
        return Path(cfg.theory_cache)
    stats = Path(cfg.stats)
    return stats.with_name(stats.stem + ".theory")


def _resident_theories(stats, names: Sequence[str], cfg: SweepConfig) -> dict[str, Theory]:
    """Cast each needed theory matrix to the device/dtype once (Bbar^T shares Bbar's storage)."""
    cast: dict[str, torch.Tensor] = {}
    for name in sorted(set(names), key=lambda n: n == "BbarT"):
        if name == "BbarT":
            T = cast["Bbar"].T if "Bbar" in cast else theory_matrix(stats.load(), name)
        else:
            T = cast[name] = _theory_source(stats, name, cfg).to(cfg.device, cfg.torch_dtype)
        cast.setdefault(name, T)
    return {n: prepare_theory(n, cast[n], dtype=cfg.torch_dtype, device=cfg.device,
                              chunk=cfg.chunk)
            for n in tqdm(sorted(set(names)), desc="theory norms", disable=len(names) < 2)}


# ---- checkpoints (pythia_probe.checkpoints) ----------------------------------------------------
def open_source(cfg: SweepConfig):
    """The model's CheckpointSource: ``--cache-dir``, else the tool's own checkpoint cache."""

    return CheckpointSource(cfg.model, cache_dir=cfg.cache_dir)


def available_steps(source) -> list[int]:
    """Steps the model has: local step folders, cached refs offline, else the hub's branches
    (listed through the source's retry policy)."""
    return source.steps()


def tensor_names(needs: Needs):
    """Which weights the analyses read (HF-name predicate from arch)."""

    return name_filter(*needs.weights)


def model_config(source, rev):
    """The NeoXConfig of a revision from its config.json alone (no weights downloaded; the file
    verified against the hub's hash)."""

    if rev.local_dir is not None:

        path = Path(rev.local_dir) / "config.json"
        return NeoXConfig.from_dict(read_json(path, f"config.json of {rev.where}"), str(path))
    return NeoXConfig.from_dict(source.config(rev), f"config.json of {rev.where}")


def to_weights(loaded, cfg: SweepConfig):
    """NeoXWeights on the sweep's device and dtype (so residual streams are computed there)."""

    tensors = {k: v.to(cfg.device, cfg.torch_dtype) for k, v in loaded.tensors.items()}
    where = f"config.json of {loaded.revision.model}@{loaded.revision.branch}"
    return NeoXWeights(tensors, NeoXConfig.from_dict(loaded.config, where))


def load_weights(source, rev, names):
    """Fetch and load one revision directly (used for retries); evicts its files afterwards."""
    try:
        return source.load(rev, source.fetch(rev, names), names)
    finally:
        source.evict(rev)


def stream(source, revs, names, cfg: SweepConfig):
    """Yield (revision, Loaded or the exception it raised), prefetching one revision ahead.

    A failing revision ends E's stream; it is yielded as an error and the stream restarts after it.
    """
    i = 0
    while i < len(revs):
        try:
            for loaded in source.stream(revs[i:], names=names, prefetch=cfg.prefetch):
                yield loaded.revision, loaded
                i += 1
        except Exception as e:  # noqa: BLE001 - reported per step by the caller
            yield revs[i], e
            i += 1


# ---- checks before any download ----------------------------------------------------------------
def model_tokenizer(cfg: SweepConfig, source, rev):
    """The tokenizer of the statistics: --tokenizer, else the one the first revision ships
    (local folder, or the hub at that commit, verified); None (with a warning) if none."""
    if cfg.tokenizer:
        return load_tokenizer(cfg.tokenizer)
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
                    "(pass --tokenizer to check it)", cfg.model)
        return None
    return _load_model_tokenizer(path, rev)


def _load_model_tokenizer(path: Path, rev):
    """The model's tokenizer folder, loaded; a file there that does not parse is named."""

    try:
        return load_tokenizer(str(path))
    except UserError:
        raise
    except Exception as err:  # noqa: BLE001 - tokenizers/transformers raise many kinds
        raise CorruptFileError(f"the tokenizer files of {rev.where} in {path} cannot be "
                               f"loaded: {type(err).__name__}: {err}") from err


def check_resume(cfg: SweepConfig, stats_id: str) -> str | None:
    """Run id of a compatible earlier run in ``--out`` (None if fresh); refuse a different one."""
    if not (Path(cfg.out) / "manifest.json").exists():
        return None
    old = read_manifest(cfg.out)
    want = {**cfg.identity(), "analyses": list(cfg.analyses), "stats_id": stats_id}
    have = {k: old.get("config", {}).get(k) for k in want}
    if have != want:
        diff = {k: (have[k], want[k]) for k in want if have[k] != want[k]}
        raise MismatchError(f"{cfg.out} holds a different run ({diff}: old, new); choose a new "
                            "--out or the same settings to resume")
    return old.get("run_id")


def select_steps(cfg: SweepConfig, source) -> list[int]:
    """Parse --steps against the steps the model has (StepError names the nearest valid ones)."""

    return parse_steps(cfg.steps, available_steps(source))


def checkpoint_plan(cfg: SweepConfig, c, d_vocab: int, streamed: bool):
    """The memory plan of one checkpoint of model config ``c`` in the given theory mode."""

    n_params = c.d_vocab * c.d_model * 2 + c.n_layers * (
        4 * c.d_model**2 + 2 * c.d_model * c.d_mlp + 4 * c.d_model)
    return memory_plan(d_vocab, c.d_model, c.n_layers, c.n_heads, n_params, cfg.analyses,
                       dtype_bytes=torch.tensor([], dtype=cfg.torch_dtype).element_size(),
                       chunk=cfg.chunk, streamed=streamed, max_rank=cfg.max_rank)


def memory_need(cfg: SweepConfig, c, rows: int, stats_bytes: int) -> float:
    """Peak bytes of ``--theory memory`` on the device; on the CPU the statistics file
    (``stats_bytes``), loaded while the theory matrices are cast, counts too."""
    plan = checkpoint_plan(cfg, c, rows, streamed=False)
    if torch.device(cfg.device).type != "cpu":
        return plan.total
    return max(plan.total, stats_bytes + plan.theories)


def resolve_theory(cfg: SweepConfig, c, rows: int, stats_bytes: int,
                   budget: tuple[float | None, str] | None = None) -> tuple[str, str]:
    """(theory mode, why): ``--theory`` itself unless auto; auto picks memory when its peak fits
    the device's budget (:func:`~pythia_probe.resources.memory_budget`), else streamed."""
    if cfg.theory != "auto":
        return cfg.theory, f"--theory {cfg.theory} given"
    need = memory_need(cfg, c, rows, stats_bytes)
    limit, how = budget if budget is not None else memory_budget(cfg.device)
    return choose_theory(need, limit, how)


def plan_lines(cfg: SweepConfig, source, steps: list[int], names, c, rows: int,
               stats_id: str | None, theory: tuple[str, str]) -> list[str]:
    """The plan: steps (done, duplicates), bytes still to download, disk, theory, memory."""
    todo = [s for s in steps if not shard_done(cfg, s, stats_id)]
    revs = source.resolve(todo)
    dups = {} if source.local_dir is not None else source.duplicates(revs)
    fetch = [r for r in revs if r.step not in dups]
    need = sum(source.bytes_to_download(r, names) for r in fetch)
    biggest = max([r.nbytes for r in fetch] or [0])
    mode, why = theory
    plan = checkpoint_plan(cfg, c, rows, streamed=mode == "streamed")
    return [f"model {cfg.model}: {len(steps)} steps: {len(steps) - len(todo)} already done, "
            f"{len(dups)} with the weights of an earlier step (copied, not downloaded), "
            f"{len(fetch)} to score: {steps[:6]}{' ...' if len(steps) > 6 else ''}",
            f"download {human_bytes(need)} still (cached files excluded); disk at any time <= "
            f"{human_bytes((cfg.prefetch + 1) * biggest)} ({cfg.prefetch + 1} checkpoints)",
            f"theory: {cfg.theory} -> {mode} ({why})",
            f"memory on {cfg.device} ({cfg.dtype}, V={rows:,}):",
            *("  " + line for line in plan.lines())]
