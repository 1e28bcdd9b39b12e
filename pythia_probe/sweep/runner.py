"""The sweep as a library: validate, plan, then score every step and write its shard.

See :mod:`pythia_probe.sweep` for the command. Ranks are given in the config (the entry point
reads them); nothing here asks the process group except the barrier between phases.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from functools import partial
from pathlib import Path

import torch
from tqdm import tqdm

from pythia_probe.analysis import (
    Analysis,
    Needs,
    Options,
    StepTensors,
    combined_needs,
    get_analyses,
)
from pythia_probe.analysis.attention_text import model_attention
from pythia_probe.analysis.cosine import Theory
from pythia_probe.arch import single_token_residuals
from pythia_probe.errors import BadInputError, DiskFullError, ResourceError, user_message
from pythia_probe.fileio import remove, write_json
from pythia_probe.progress import JobProgress, Stage
from pythia_probe.ranks import Ranks
from pythia_probe.results import (
    make_rows,
    new_run_id,
    read_manifest,
    read_shard,
    write_manifest,
    write_shard,
)
from pythia_probe.stats.recipe import ensure
from pythia_probe.sweep.config import FAILED, SweepConfig, shard_done, shard_path, split_steps
from pythia_probe.sweep.sources import (
    LazyStats,
    check_resume,
    load_text,
    load_weights,
    model_config,
    model_tokenizer,
    open_source,
    plan_lines,
    prepare_theories,
    resolve_theory,
    select_steps,
    stream,
    tensor_names,
    to_weights,
)
from pythia_probe.sweep.statistics import choose_statistics, read_stats_meta
from pythia_probe.tokenizer import tokenizer_fingerprint

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepContext:
    """What every step of one sweep shares, built once: the analyses and what they need
    together, the prepared theories, the statistics' token ids and identity, the run's."""

    analyses: list[Analysis]
    needs: Needs
    theories: dict[str, Theory]
    token_ids: torch.Tensor
    stats_id: str
    run_id: str
    model_name: str
    raw: dict[str, torch.Tensor]
    text: torch.Tensor | None


def step_tensors(weights, ctx: StepContext, cfg: SweepConfig) -> StepTensors:
    """Residual streams of each statistic token fed alone, and the weights, in stats row order
    (residual streams, layer weights and W_U only when an analysis needs them)."""
    dt, dev, token_ids = cfg.torch_dtype, cfg.device, ctx.token_ids
    res = {}
    if ctx.needs.residuals:
        r = single_token_residuals(weights, token_ids, cfg.batch_size, dt)
        res = {k: list(v.to(dev)) for k, v in r.items()}
    n_layers = weights.cfg.n_layers if {"attn", "ln"} <= set(ctx.needs.weights) else 0
    layers = [weights.layer(i) for i in range(n_layers)]
    W_U = weights.W_U[:, token_ids].to(dev, dt) if ctx.needs.unembedding else None
    return StepTensors(res, [L.W_Q.to(dev, dt) for L in layers],
                       [L.W_K.to(dev, dt) for L in layers],
                       weights.W_E[token_ids].to(dev, dt), W_U,
                       ln1_w=[L.ln1_w.to(dev, dt) for L in layers])


def analyse(loaded, weights, ctx: StepContext, cfg: SweepConfig) -> list[dict]:
    """All rows of one checkpoint."""
    x = step_tensors(weights, ctx, cfg)
    if ctx.needs.text:
        x.text_tokens = ctx.text
        x.text_attn = model_attention(loaded.config, weights.sd, ctx.text, cfg.device)
    opts = Options(chunk=cfg.chunk, per_head=cfg.per_head, max_rank=cfg.max_rank, raw=ctx.raw)
    rows = []
    for a in ctx.analyses:
        rows += a.run(x, {n: ctx.theories[n] for n in a.needs.theories}, opts)
    return rows


# ---- the run -----------------------------------------------------------------------------------
@dataclass
class Outcome:
    done: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)


def run_step(loaded, step: int, ctx: StepContext, cfg: SweepConfig) -> Path:
    """Analyse one loaded checkpoint and write its shard."""
    weights = to_weights(loaded, cfg)
    top = int(ctx.token_ids.max())
    if top >= weights.cfg.d_vocab:
        raise BadInputError(f"statistics index token {top} but the model has only "
                            f"{weights.cfg.d_vocab} embedding rows: wrong model or statistics")
    rows = analyse(loaded, weights, ctx, cfg)
    df = make_rows(rows, model=ctx.model_name, step=step, stats_id=ctx.stats_id,
                   dtype=cfg.dtype, run_id=ctx.run_id)
    return write_shard(df, shard_path(cfg.out, step))


def _record_failure(cfg: SweepConfig, step: int, err: BaseException, tries: int) -> str:
    """Write ``OUT/failed/step{N}.json`` atomically; return the one-line message."""
    msg = user_message(err) or f"{type(err).__name__}: {err}"
    write_json(Path(cfg.out) / FAILED / f"step{step}.json",
               {"step": step, "error": msg, "rank": cfg.rank, "tries": tries,
                "traceback": "".join(traceback.format_exception(err))})
    return msg


def sweep_steps(source, steps: Sequence[int], ctx: StepContext, cfg: SweepConfig,
                progress: JobProgress | None = None) -> Outcome:
    """Every step not already done; retry each failure, then record it and go on."""
    out = Outcome()
    todo = [s for s in steps if not shard_done(cfg, s, ctx.stats_id)]
    out.skipped = [s for s in steps if s not in todo]
    names = tensor_names(ctx.needs)
    revs = source.resolve(todo)
    dups = duplicates(source, revs, steps)
    bar = (progress.counter("sweep", len(todo)) if progress is not None else
           tqdm(total=len(todo), desc=f"sweep rank {cfg.rank}", unit="step"))
    for rev, first in stream(source, [r for r in revs if r.step not in dups], names, cfg):
        for attempt in range(cfg.retries + 1):
            try:
                loaded = first if attempt == 0 else load_weights(source, rev, names)
                if isinstance(loaded, Exception):
                    raise loaded
                run_step(loaded, rev.step, ctx, cfg)
                remove(Path(cfg.out) / FAILED / f"step{rev.step}.json", [cfg.out])
                out.done.append(rev.step)
                break
            except (DiskFullError, ResourceError):
                raise  # no later step can succeed either: stop the sweep
            except Exception as e:  # noqa: BLE001 - a bad checkpoint must not stop the sweep
                if attempt == cfg.retries:
                    out.failed[rev.step] = _record_failure(cfg, rev.step, e, attempt + 1)
                    log.warning("step %d failed after %d tries: %s", rev.step, attempt + 1,
                                out.failed[rev.step])
        bar.update(1)
    for step, same in dups.items():  # byte-identical weights (Pythia's step1 == step0)
        if shard_done(cfg, same, ctx.stats_id):
            df = read_shard(shard_path(cfg.out, same)).assign(step=step, run_id=ctx.run_id)
            write_shard(df, shard_path(cfg.out, step))
            out.done.append(step)
        else:
            out.failed[step] = _record_failure(cfg, step, RuntimeError(
                f"weights identical to step {same}, which has no results"), 0)
        bar.update(1)
    bar.close()
    return out


def duplicates(source, revs, steps) -> dict[int, int]:
    """{step: earlier step of this rank with byte-identical weights}, from the hub's LFS
    hashes (no download); local folders are not hashed (that would read every file)."""
    if source.local_dir is not None:
        return {}
    return {s: same for s, same in source.duplicates(revs).items() if same in steps}


def _context(cfg: SweepConfig, analyses, run_id: str, meta: dict,
             ranks: Ranks) -> StepContext:
    """Theory matrices prepared once (cached on disk unless ``--theory memory``) and shared by
    every step. Token ids and stats_id come from the statistics file's metadata; its tensors
    are loaded only when a cache must be (re)built, for ``--theory memory``, or for raw
    statistics (attention_text), and dropped afterwards."""
    stats = LazyStats(cfg, meta)
    needs = combined_needs(analyses)
    names = list(needs.theories)
    local = Path(cfg.model).exists()
    raw = {n: stats.load()[n] for n in needs.raw}
    if cfg.rank == 0:  # rank 0 builds the theory cache; the others then reuse it
        theories = prepare_theories(stats, names, cfg)
    ranks.barrier()
    if cfg.rank != 0:
        theories = prepare_theories(stats, names, cfg)
    return StepContext(analyses, needs, theories, stats.token_ids, stats.stats_id, run_id,
                       Path(cfg.model).name if local else cfg.model, raw,
                       load_text(cfg, stats) if needs.text else None)


def _run_id(cfg: SweepConfig, stats_id: str, config: dict, steps, source, argv,
            choices: dict, ranks: Ranks) -> str:
    """Rank 0 picks the run id (reusing a compatible earlier run's) and writes the manifest."""
    if cfg.rank == 0:
        run_id = check_resume(cfg, stats_id) or new_run_id()
        hub = source.manifest(source.resolve(steps)) if source.local_dir is None else None
        write_manifest(cfg.out, config, argv=argv, run_id=run_id,
                       extra={"steps": steps, "status": "running", "checkpoints": hub,
                              **choices})
    ranks.barrier()
    if cfg.rank != 0:
        manifest = Path(cfg.out) / "manifest.json"
        return read_manifest(cfg.out)["run_id"] if manifest.exists() else new_run_id()
    return run_id


def _end_manifest(cfg: SweepConfig, config: dict, argv, started, run_id: str, steps,
                  choices: dict, status: str, reason: str | None, failed=()) -> None:
    """Rank 0 records how the run ended: complete, or failed with the reason."""
    if cfg.rank != 0:
        return
    old = read_manifest(cfg.out)
    write_manifest(cfg.out, config, argv=argv, started=started, run_id=run_id,
                   extra={"steps": steps, "status": status, "reason": reason,
                          "failed_steps": list(failed), "checkpoints": old.get("checkpoints"),
                          **choices})


def run(cfg: SweepConfig, argv: list[str] | None = None, ranks: Ranks | None = None) -> int:
    """Validate everything, then sweep this rank's steps; 0 if every step succeeded, else 1.

    ``ranks``: the process group of a multi-process launch (the entry point builds it); steps
    are split by ``cfg.rank`` / ``cfg.world_size``."""
    source = open_source(cfg)
    try:
        return _run(cfg, source, argv, ranks or Ranks(device=cfg.device))
    finally:
        source.close()  # leases of planning fetches (config, tokenizer) released


def _run(cfg: SweepConfig, source, argv: list[str] | None, ranks: Ranks) -> int:
    analyses = get_analyses(list(cfg.analyses))
    steps = select_steps(cfg, source)
    first = source.resolve(steps[:1])[0]  # file list only, nothing downloaded
    c = model_config(source, first)
    tok = model_tokenizer(cfg, source, first)
    fingerprint = None if tok is None else tokenizer_fingerprint(tok)
    stats = choose_statistics(cfg, tok, fingerprint, c)
    theory = resolve_theory(cfg, c, stats.rows, stats.file_bytes())
    lines = stats.lines() + plan_lines(cfg, source, steps, tensor_names(combined_needs(
        analyses)), c, stats.rows, stats.stats_id, theory)
    if ranks.is_main:
        print("\n".join(lines), flush=True)
    if cfg.dry_run:
        return 0
    choices = {"theory_choice": {"requested": cfg.theory, "resolved": theory[0],
                                 "reason": theory[1]},
               "vocabulary": {"rows": stats.rows, "reason": stats.vocab_reason,
                              "recipe": None if stats.recipe is None else asdict(stats.recipe)},
               "statistics": str(stats.path)}
    progress = _progress(cfg, stats, len(steps), ranks)
    if not stats.built:
        ensure(stats.recipe, tok, fingerprint, cfg.device, ranks, progress)
    cfg = replace(cfg, stats=str(stats.path), theory=theory[0])
    meta = read_stats_meta(stats.path, fingerprint)
    try:
        return _sweep(cfg, source, steps, analyses, meta, argv, ranks, progress, choices)
    finally:
        if progress is not None:
            progress.close()


def _progress(cfg: SweepConfig, stats, n_steps: int, ranks: Ranks) -> JobProgress | None:
    """One display across the statistics (when they are built now) and the sweep (rank 0)."""
    if not cfg.progress or not ranks.is_main:
        return None
    stages = [] if stats.built else [
        Stage("statistics pass 1", stats.recipe.docs * (stats.recipe.seq_len + 1), "tok"),
        Stage("statistics pass 2", None, "tok")]
    return JobProgress(stages + [Stage("sweep", n_steps, "step")])


def _sweep(cfg: SweepConfig, source, steps, analyses, meta, argv, ranks: Ranks,
           progress: JobProgress | None, choices: dict) -> int:
    started = datetime.now(timezone.utc)
    config = {**asdict(cfg), "analyses": list(cfg.analyses), "stats_id": meta["stats_id"]}
    run_id = _run_id(cfg, meta["stats_id"], config, steps, source, argv, choices, ranks)
    end = partial(_end_manifest, cfg, config, argv, started, run_id, steps, choices)
    try:
        outcome = sweep_steps(source, split_steps(steps, cfg.rank, cfg.world_size),
                              _context(cfg, analyses, run_id, meta, ranks), cfg, progress)
    except BaseException as err:
        end("failed", user_message(err) or f"{type(err).__name__}: {err}")
        raise
    ranks.barrier()
    failed = sorted(int(p.stem[4:]) for p in (Path(cfg.out) / FAILED).glob("step*.json"))
    end("failed" if failed else "complete",
        f"{len(failed)} steps failed (see {FAILED}/)" if failed else None, failed)
    if progress is not None:
        progress.close()
    print(f"rank {cfg.rank}: {len(outcome.done)} steps done, {len(outcome.skipped)} already "
          f"done, {len(outcome.failed)} failed" + "".join(
              f"\n  step {s}: {m}" for s, m in outcome.failed.items()))
    return 1 if outcome.failed else 0
