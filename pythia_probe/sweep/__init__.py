"""Sweep checkpoints: score every step's weights against corpus statistics, one shard per step.

    python -m pythia_probe.sweep --model EleutherAI/pythia-1.4b --steps 1000-143000 \\
        --stats stats/owt.safetensors --analyses embedding,attention --out results/run1
    python -m pythia_probe.sweep --demo            # offline: train a tiny GPT-NeoX, sweep, plot

``--model`` is a hub id or a local folder with one ``step{N}/`` folder per checkpoint.
Statistics are loaded once (their tokenizer must match the model's) and shared by every step:
the theory side (C_T, row-normalised and row-centred, and its norm) is prepared once per
statistics file into a cache (``--theory-cache``, default ``<stats stem>.theory/`` next to the
statistics; rebuilt when stats_id changes) and streamed in ``--chunk`` blocks per checkpoint,
so no V x V matrix is resident while checkpoints are scored (``--theory memory`` keeps the
statistics resident instead; the default ``--theory auto`` picks memory when its planned peak
fits the device's free memory, records the choice in the manifest, and ``--dry-run`` prints it;
``--max-rank`` scores several layers per pass over the cache). Only the statistics file's
metadata is read unless a cache must be (re)built, ``--theory memory`` runs or raw statistics
are needed (attention_text).
Each step writes ``OUT/shards/step{N}.parquet`` atomically; a rerun skips finished shards. A
step that fails is retried ``--retries`` times, then reported in ``OUT/failed/`` and the
manifest while the sweep goes on (exit code 1). Under ``accelerate launch`` steps are split
round-robin across processes; each writes its own shards and rank 0 writes the manifest.
All bad input (unknown analysis, step the model lacks, statistics from another tokenizer) is
rejected before any weight is downloaded.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from functools import partial
from pathlib import Path

import torch
from tqdm import tqdm

from pythia_probe.analysis import StepTensors, get_analyses
from pythia_probe.analysis.cosine import DEFAULT_CHUNK
from pythia_probe.errors import BadInputError, DiskFullError, ResourceError, user_message
from pythia_probe.fileio import write_json
from pythia_probe.results import (
    make_rows,
    new_run_id,
    read_manifest,
    read_shard,
    write_manifest,
    write_shard,
)
from pythia_probe.sweep.config import (
    DTYPES,
    FAILED,
    THEORY_MODES,
    SweepConfig,
    shard_done,
    shard_path,
    split_steps,
)
from pythia_probe.sweep.sources import (
    LazyStats,
    check_resume,
    check_stats,
    dry_run,
    load_text,
    load_weights,
    model_fingerprint,
    open_source,
    prepare_theories,
    resolve_theory,
    select_steps,
    stream,
    tensor_names,
    to_weights,
)

#: --demo writes here (untracked); `--demo --out results/demo` regenerates the committed copy
DEMO_OUT = "runs/demo"

__all__ = ["SweepConfig", "main", "run", "run_step", "shard_path", "split_steps"]


def step_tensors(weights, token_ids: torch.Tensor, cfg: SweepConfig,
                 need_residuals: bool, need_unembedding: bool = True) -> StepTensors:
    """Residual streams of each statistic token fed alone, and the weights, in stats row order.

    W_U is only read when ``need_unembedding`` (the sweep downloads it only for unembedding)."""
    from pythia_probe.arch import single_token_residuals

    dt, dev = cfg.torch_dtype, cfg.device
    res = {}
    if need_residuals:
        r = single_token_residuals(weights, token_ids, cfg.batch_size, dt)
        res = {k: list(v.to(dev)) for k, v in r.items()}
    layers = [weights.layer(i) for i in range(weights.cfg.n_layers)]
    W_U = weights.W_U[:, token_ids].to(dev, dt) if need_unembedding else None
    return StepTensors(res, [L.W_Q.to(dev, dt) for L in layers],
                       [L.W_K.to(dev, dt) for L in layers],
                       weights.W_E[token_ids].to(dev, dt), W_U,
                       ln1_w=[L.ln1_w.to(dev, dt) for L in layers])


def analyse(loaded, weights, ctx: dict, cfg: SweepConfig) -> list[dict]:
    """All rows of one checkpoint."""
    analyses = ctx["analyses"]
    need = any(a.name in ("embedding", "attention", "attention_lnfold") for a in analyses)
    x = step_tensors(weights, ctx["token_ids"], cfg, need,
                     any(a.name == "unembedding" for a in analyses))
    if ctx.get("text") is not None:
        from pythia_probe.analysis.attention_text import model_attention

        x.text_tokens = ctx["text"]
        x.text_attn = model_attention(loaded.config, weights.sd, ctx["text"], cfg.device)
    rows = []
    for a in analyses:
        rows += a.run(x, {n: ctx["theories"][n] for n in a.theories}, chunk=cfg.chunk,
                      per_head=cfg.per_head, raw=ctx["raw"], max_rank=cfg.max_rank)
    return rows


# ---- the run -----------------------------------------------------------------------------------
@dataclass
class Outcome:
    done: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)


def run_step(loaded, step: int, ctx: dict, cfg: SweepConfig) -> Path:
    """Analyse one loaded checkpoint and write its shard."""
    weights = to_weights(loaded, cfg)
    top = int(ctx["token_ids"].max())
    if top >= weights.cfg.d_vocab:
        raise BadInputError(f"statistics index token {top} but the model has only "
                            f"{weights.cfg.d_vocab} embedding rows: wrong model or statistics")
    rows = analyse(loaded, weights, ctx, cfg)
    df = make_rows(rows, model=ctx["model_name"], step=step, stats_id=ctx["stats_id"],
                   dtype=cfg.dtype, run_id=ctx["run_id"])
    return write_shard(df, shard_path(cfg.out, step))


def _record_failure(cfg: SweepConfig, step: int, err: BaseException, tries: int) -> str:
    """Write ``OUT/failed/step{N}.json`` atomically; return the one-line message."""
    msg = user_message(err) or f"{type(err).__name__}: {err}"
    write_json(Path(cfg.out) / FAILED / f"step{step}.json",
               {"step": step, "error": msg, "rank": cfg.rank, "tries": tries,
                "traceback": "".join(traceback.format_exception(err))})
    return msg


def sweep_steps(source, steps: Sequence[int], ctx: dict, cfg: SweepConfig) -> Outcome:
    """Every step not already done; retry each failure, then record it and go on."""
    out = Outcome()
    todo = [s for s in steps if not shard_done(cfg, s, ctx["stats_id"])]
    out.skipped = [s for s in steps if s not in todo]
    names = tensor_names(ctx["analyses"])
    revs = source.resolve(todo)
    dups = duplicates(source, revs, steps)
    bar = tqdm(total=len(todo), desc=f"sweep rank {cfg.rank}", unit="step")
    for rev, first in stream(source, [r for r in revs if r.step not in dups], names, cfg):
        for attempt in range(cfg.retries + 1):
            try:
                loaded = first if attempt == 0 else load_weights(source, rev, names)
                if isinstance(loaded, Exception):
                    raise loaded
                run_step(loaded, rev.step, ctx, cfg)
                (Path(cfg.out) / FAILED / f"step{rev.step}.json").unlink(missing_ok=True)
                out.done.append(rev.step)
                break
            except (DiskFullError, ResourceError):
                raise  # no later step can succeed either: stop the sweep
            except Exception as e:  # noqa: BLE001 - a bad checkpoint must not stop the sweep
                if attempt == cfg.retries:
                    out.failed[rev.step] = _record_failure(cfg, rev.step, e, attempt + 1)
                    tqdm.write(f"step {rev.step} failed after {attempt + 1} tries: {e}")
        bar.update()
    for step, same in dups.items():  # byte-identical weights (Pythia's step1 == step0)
        if shard_done(cfg, same, ctx["stats_id"]):
            df = read_shard(shard_path(cfg.out, same)).assign(step=step, run_id=ctx["run_id"])
            write_shard(df, shard_path(cfg.out, step))
            out.done.append(step)
        else:
            out.failed[step] = _record_failure(cfg, step, RuntimeError(
                f"weights identical to step {same}, which has no results"), 0)
        bar.update()
    bar.close()
    return out


def duplicates(source, revs, steps) -> dict[int, int]:
    """{step: earlier step of this rank with byte-identical weights}, from the hub's LFS
    hashes (no download); local folders are not hashed (that would read every file)."""
    if source.local_dir is not None:
        return {}
    return {s: same for s, same in source.duplicates(revs).items() if same in steps}


def dist_env() -> tuple[int, int]:
    """(rank, world_size) under accelerate launch / torchrun; (0, 1) otherwise."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def _barrier(cfg: SweepConfig) -> None:
    if cfg.world_size > 1 and torch.distributed.is_available() and \
            torch.distributed.is_initialized():
        torch.distributed.barrier()


def _context(cfg: SweepConfig, analyses, run_id: str, meta: dict) -> dict:
    """Theory matrices prepared once (cached on disk unless ``--theory memory``) and shared by
    every step. Token ids and stats_id come from the statistics file's metadata; its tensors
    are loaded only when a cache must be (re)built, for ``--theory memory``, or for raw
    statistics (attention_text), and dropped afterwards."""
    stats = LazyStats(cfg, meta)
    names = [t for a in analyses for t in a.theories]
    local = Path(cfg.model).exists()
    raw = {n: stats.load()[n] for a in analyses for n in a.raw}
    if cfg.rank == 0:  # rank 0 builds the theory cache; the others then reuse it
        theories = prepare_theories(stats, names, cfg)
    _barrier(cfg)
    if cfg.rank != 0:
        theories = prepare_theories(stats, names, cfg)
    return {"analyses": analyses, "theories": theories,
            "token_ids": stats.token_ids, "stats_id": stats.stats_id, "run_id": run_id,
            "model_name": Path(cfg.model).name if local else cfg.model, "raw": raw,
            "text": load_text(cfg, stats) if cfg.text else None}


def _run_id(cfg: SweepConfig, stats_id: str, config: dict, steps, source, argv,
            choice: dict) -> str:
    """Rank 0 picks the run id (reusing a compatible earlier run's) and writes the manifest."""
    if cfg.rank == 0:
        run_id = check_resume(cfg, stats_id) or new_run_id()
        hub = source.manifest(source.resolve(steps)) if source.local_dir is None else None
        write_manifest(cfg.out, config, argv=argv, run_id=run_id,
                       extra={"steps": steps, "status": "running", "checkpoints": hub,
                              "theory_choice": choice})
    _barrier(cfg)
    if cfg.rank != 0:
        manifest = Path(cfg.out) / "manifest.json"
        return read_manifest(cfg.out)["run_id"] if manifest.exists() else new_run_id()
    return run_id


def _end_manifest(cfg: SweepConfig, config: dict, argv, started, run_id: str, steps,
                  choice: dict, status: str, reason: str | None, failed=()) -> None:
    """Rank 0 records how the run ended: complete, or failed with the reason."""
    if cfg.rank != 0:
        return
    old = read_manifest(cfg.out)
    write_manifest(cfg.out, config, argv=argv, started=started, run_id=run_id,
                   extra={"steps": steps, "status": status, "reason": reason,
                          "failed_steps": list(failed), "checkpoints": old.get("checkpoints"),
                          "theory_choice": choice})


def run(cfg: SweepConfig, argv: list[str] | None = None) -> int:
    """Validate everything, then sweep this rank's steps; 0 if every step succeeded, else 1."""
    analyses = get_analyses(list(cfg.analyses))
    source = open_source(cfg)
    steps = select_steps(cfg, source)
    first = source.resolve(steps[:1])[0]  # file list only, nothing downloaded
    meta = check_stats(cfg, model_fingerprint(cfg, source, first))
    if cfg.dry_run:
        return dry_run(cfg, source, steps, meta)
    started = datetime.now(timezone.utc)
    mode, why = resolve_theory(cfg, source, first, meta)
    choice = {"requested": cfg.theory, "resolved": mode, "reason": why}
    cfg = replace(cfg, theory=mode)
    tqdm.write(f"theory: {choice['requested']} -> {mode} ({why})")
    config = {**asdict(cfg), "analyses": list(cfg.analyses), "stats_id": meta["stats_id"]}
    run_id = _run_id(cfg, meta["stats_id"], config, steps, source, argv, choice)
    end = partial(_end_manifest, cfg, config, argv, started, run_id, steps, choice)
    try:
        outcome = sweep_steps(source, split_steps(steps, cfg.rank, cfg.world_size),
                              _context(cfg, analyses, run_id, meta), cfg)
    except BaseException as err:
        end("failed", user_message(err) or f"{type(err).__name__}: {err}")
        raise
    _barrier(cfg)
    failed = sorted(int(p.stem[4:]) for p in (Path(cfg.out) / FAILED).glob("step*.json"))
    end("failed" if failed else "complete",
        f"{len(failed)} steps failed (see {FAILED}/)" if failed else None, failed)
    print(f"rank {cfg.rank}: {len(outcome.done)} steps done, {len(outcome.skipped)} already "
          f"done, {len(outcome.failed)} failed" + "".join(
              f"\n  step {s}: {m}" for s, m in outcome.failed.items()))
    return 1 if outcome.failed else 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pythia_probe.sweep", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="hub id (EleutherAI/pythia-1.4b) or folder of step*/ folders")
    p.add_argument("--steps", default="all", help="e.g. 1000-143000, 0,1,2,4, early, log, all")
    p.add_argument("--stats", help="statistics file from `python -m pythia_probe.stats`")
    p.add_argument("--analyses", default="embedding,attention",
                   help="comma-separated: embedding, attention, attention_lnfold (the authors' "
                        "LN-folded, centred W_Q/W_K), unembedding, attention_text")
    p.add_argument("--out", help="results folder (shards/, failed/, manifest.json)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=list(DTYPES))
    p.add_argument("--heads", default="all", help="per-head rows: all, none or layers 1,12,23")
    p.add_argument("--retries", type=int, default=1)
    p.add_argument("--chunk", type=int, default=DEFAULT_CHUNK, help="vocab columns per block")
    p.add_argument("--batch-size", type=int, default=4096, help="tokens per residual batch")
    p.add_argument("--tokenizer", help="tokenizer to check the statistics against")
    p.add_argument("--cache-dir", help="hub download cache (default: the Hugging Face cache)")
    p.add_argument("--prefetch", type=int, default=1, help="checkpoints downloaded ahead")
    p.add_argument("--text", help="attention_text: safetensors file with 'tokens' [N, T+1]")
    p.add_argument("--text-rows", type=int, default=32, help="attention_text: sequences used")
    p.add_argument("--theory", default="auto", choices=list(THEORY_MODES),
                   help="streamed: prepared theory cached on disk, read in blocks (no V x V "
                        "in memory per checkpoint); memory: keep the statistics resident; "
                        "auto (default): memory when its planned peak fits the device's free "
                        "memory, else streamed")
    p.add_argument("--theory-cache", help="folder of the prepared-theory cache (default: "
                                          "<stats stem>.theory/ next to the statistics)")
    p.add_argument("--max-rank", type=int, default=0,
                   help="score several layers per pass over the theory while their stacked "
                        "factor rank stays <= this (fewer cache reads, more memory); 0: one layer")
    p.add_argument("--dry-run", action="store_true", help="print the plan and stop")
    p.add_argument("--demo", action="store_true",
                   help="offline demo: train a tiny GPT-NeoX on the built-in corpus and sweep it")
    p.add_argument("--demo-max-step", type=int, help="demo training steps (default 1024)")
    p.add_argument("--work", default="runs/demo",
                   help="--demo: where the model checkpoints and statistics go")
    return p


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; the only place that knows about process ranks."""
    a = build_parser().parse_args(argv)
    if a.demo:
        from pythia_probe.demo import DemoConfig, run_demo

        demo_cfg = DemoConfig(**({"max_step": a.demo_max_step} if a.demo_max_step else {}))
        return run_demo(a.out or DEMO_OUT, demo_cfg, device=a.device, work=a.work)
    missing = [f"--{k}" for k in ("model", "stats", "out") if getattr(a, k) is None]
    if missing:
        build_parser().error(f"{', '.join(missing)} required (or use --demo)")
    rank, world = dist_env()
    device = a.device
    if world > 1:
        from accelerate import PartialState

        state = PartialState(cpu=device == "cpu")  # joins the process group (for the barrier)
        device = str(state.device) if device == "cuda" else device  # cuda -> cuda:<local rank>
    cfg = SweepConfig(model=a.model, steps=a.steps, stats=a.stats, out=a.out,
                      analyses=tuple(x.strip() for x in a.analyses.split(",") if x.strip()),
                      device=device, dtype=a.dtype, heads=a.heads, retries=a.retries,
                      chunk=a.chunk, batch_size=a.batch_size, tokenizer=a.tokenizer,
                      cache_dir=a.cache_dir, prefetch=a.prefetch, text=a.text,
                      text_rows=a.text_rows, theory=a.theory, theory_cache=a.theory_cache,
                      max_rank=a.max_rank,
                      dry_run=a.dry_run, rank=rank, world_size=world)
    return run(cfg, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    raise SystemExit(main())
