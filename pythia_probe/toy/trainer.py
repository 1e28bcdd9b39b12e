"""Train the Def. 3.1 model the paper's way and track its weights against Theorem 4.1.

All weights start at zero; plain SGD (no momentum, no weight decay), full batch or mini-batch.
Every ``log_every`` steps one tidy shard ``rows/step{step:08d}.parquet`` is written with, per
layer (1-based, as in the paper), the Frobenius cosine of W_O vs Bbar, V vs Phibar^T Bbar^T,
W vs Qbar and P vs Delta, the relative error against the predicted weight
``coefficient(s) * leading term`` and the norm ratio, plus the mean training loss of the
interval. Theory statistics come from the FIRST training batch (as in the paper);
``rows/batch_ceiling.parquet`` holds each term's cosine between the first batch and the whole
training set: the batch ceiling, an upper bound on first-batch agreement (toy/paper.py; runs
written before the rename have it as rows/noise_floor.parquet). Checkpoints (safetensors) allow
an exact resume. The command prints its headline numbers beside the paper's Table 1.
Several processes (``torchrun`` or ``accelerate launch``): data parallel, each rank a share of
every batch, gradients summed through the :class:`~pythia_probe.ranks.Ranks` built in main().
On CPU, subnormal floats are flushed to zero while training (tiny gradient products at small
lr otherwise slow every step tens of times; values below 1e-38 only).

Paper scale (Table 1):  python -m pythia_probe.toy.train --preset paper  (toy/flags.py PRESETS)

The command is :mod:`pythia_probe.toy.train` (its flags parsed without torch); this module is
what it runs, and every name here is also ``pythia_probe.toy.train.NAME``.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor
from tqdm import tqdm

from pythia_probe.errors import BadInputError, MissingFileError
from pythia_probe.fileio import check_folders, check_writable
from pythia_probe.ranks import Ranks, from_env
from pythia_probe.results import (
    make_rows,
    new_run_id,
    read_manifest,
    read_results,
    write_manifest,
    write_shard,
)
from pythia_probe.toy import paper
from pythia_probe.toy.config import (  # noqa: F401 - the trainer's public names
    DTYPES,
    Schedule,
    TrainConfig,
    make_schedule,
    saved_config,
    with_preset,
)
from pythia_probe.toy.data import load_toy_data
from pythia_probe.toy.leading import batch_ceiling_rows, leading_terms, weight_rows
from pythia_probe.toy.model import AttnOnlyTransformer, ToyConfig
from pythia_probe.toy.resume import (  # noqa: F401 - the trainer's public names
    check_resumable,
    earlier_run_ids,
    latest_checkpoint,
    load_tensors,
    save_checkpoint,
    save_tensors,
    saved_train_config,
)

log = logging.getLogger("pythia_probe.toy.train")  # the command's name, as before

MODEL_NAME = "toy-attn"
ANALYSIS = "toy_train"


def resolve_device(device: str) -> str:
    """'auto' -> cuda when available, else cpu; anything else as given (checked by the config)."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def next_token_loss(model: torch.nn.Module, seqs: Tensor) -> Tensor:
    """Eq. 3: mean next-token cross-entropy over positions."""
    logits = model(seqs[:, :-1])
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             seqs[:, 1:].reshape(-1))


def sgd_step(model: torch.nn.Module, params: list[Tensor], seqs: Tensor, lr: float,
             micro_batch: int = 0, ranks: Ranks | None = None) -> float:
    """One plain-SGD update on ``seqs`` (this rank's share of the batch; micro-batches
    accumulated); gradients and the loss are averaged over ranks. Returns the batch loss."""
    chunks = seqs.split(micro_batch or len(seqs))
    total = 0.0
    for p in params:
        p.grad = None
    for chunk in chunks:
        loss = next_token_loss(model, chunk) * (len(chunk) / len(seqs))
        loss.backward()
        total += float(loss.detach())
    if ranks is not None and ranks.world > 1:  # every rank holds an equal share: the mean
        for p in params:
            if p.grad is not None:
                ranks.sum_(p.grad).div_(ranks.world)
        total = float(ranks.sum_(torch.tensor(total, device=params[0].device))) / ranks.world
    with torch.no_grad():
        for p in params:
            if p.grad is not None:
                p.add_(p.grad, alpha=-lr)
    return total


def theory_batch(seqs: Tensor, sched: Schedule) -> Tensor:
    """The first training batch: the paper computes the theory matrices from it alone."""
    return seqs[sched.batch_indices(0)]


@contextmanager
def subnormals_flushed(device: torch.device):
    """Flush subnormal floats to zero on CPU for the duration (restored afterwards)."""
    on = device.type == "cpu" and torch.set_flush_denormal(True)
    try:
        yield
    finally:
        if on:
            torch.set_flush_denormal(False)


class TrainRun(NamedTuple):
    """Where a training run writes (``out``: rows and checkpoints, rank 0 only), the step it
    starts from and the ids its rows carry."""

    out: Path
    start_step: int = 0
    run_id: str | None = None
    stats_id: str | None = None


def train(model: AttnOnlyTransformer, seqs: Tensor, stats: dict[str, Tensor], cfg: TrainConfig,
          sched: Schedule, run: TrainRun, *, ranks: Ranks | None = None) -> list[float]:
    """Run SGD from ``run.start_step`` to the end of the schedule; write rows and checkpoints
    under ``run.out`` (rank 0 only)."""
    ranks = ranks or Ranks()
    out, start_step, run_id, stats_id = run
    params = list(model.parameters())
    device = model.W_O.device
    losses: list[float] = []
    common = {"model": MODEL_NAME, "analysis": ANALYSIS, "run_id": run_id, "stats_id": stats_id,
              "dtype": cfg.dtype}
    bar = tqdm(range(start_step, sched.total_steps), desc="toy train", disable=not ranks.is_main,
               initial=start_step, total=sched.total_steps)
    with subnormals_flushed(device):
        for step in bar:
            batch = seqs[sched.batch_indices(step)][ranks.rank::ranks.world].to(device)
            losses.append(sgd_step(model, params, batch, cfg.lr, cfg.micro_batch, ranks))
            bar.set_postfix(loss=f"{losses[-1]:.4f}")
            done = step + 1
            if done % sched.log_every == 0 or done == sched.total_steps:
                since_log = done - (done - 1) // sched.log_every * sched.log_every
                if ranks.is_main:
                    _write_rows(model, stats, done, cfg, losses[-since_log:], out, common)
            if ranks.is_main and (done % sched.checkpoint_every == 0
                                  or done == sched.total_steps):
                save_checkpoint(out, model.state_dict(), done)
    return losses


def _write_rows(model, stats, step, cfg, interval, out, common) -> None:
    rows = weight_rows(model, stats, step, cfg.lr)
    rows.append({"layer": None, "metric": "loss", "value": sum(interval) / len(interval),
                 "n": len(interval)})
    write_shard(make_rows(rows, step=step, **common), out / "rows" / f"step{step:08d}.parquet")


def run(cfg: TrainConfig, argv: list[str] | None = None, ranks: Ranks | None = None) -> Path:
    """Load data, build the zero-initialised model, resume if possible, train; return out dir.

    A finished run (its last checkpoint at the final step) is left untouched.
    """
    ranks = ranks or Ranks(device=resolve_device(cfg.device))
    out, started = check_writable(cfg.out), datetime.now(timezone.utc)
    check_folders(out, [out / "rows", out / "data", out / "checkpoints"])  # never through a link
    data = load_toy_data(cfg.data_config(), cache_dir=out / "data")
    sched = make_schedule(cfg, len(data.tokens))
    if sched.batch % ((cfg.micro_batch or 1) * ranks.world):
        raise BadInputError("batch_size must be a multiple of micro_batch x number of processes")
    found = latest_checkpoint(out) if cfg.resume else None
    if found is not None and found[0] >= sched.total_steps:
        log.info("%s already finished %d steps; nothing to train", out, found[0])
        return out
    device = torch.device(ranks.device)
    stats, stats_id = leading_terms(theory_batch(data.tokens, sched), data.d_vocab, device)
    model = AttnOnlyTransformer(ToyConfig(data.d_vocab, cfg.seq_len, cfg.layers),
                                dtype=DTYPES[cfg.dtype], device=device)
    start = _restore(model, out, cfg) if found is not None else 0
    run_id = new_run_id()
    config = {**asdict(cfg), "d_vocab": data.d_vocab, "steps_per_epoch": sched.steps_per_epoch,
              "total_steps": sched.total_steps, "log_every": sched.log_every}
    extra = {"resumed_from_step": start, "data": data.meta,
             "earlier_run_ids": earlier_run_ids(out) if start else []}
    if ranks.is_main:
        save_tensors(out / "theory.safetensors", stats)
        whole = leading_terms(data.tokens, data.d_vocab, device)[0]
        write_shard(make_rows(batch_ceiling_rows(stats, whole),
                              model=MODEL_NAME, analysis="toy_batch_ceiling", run_id=run_id,
                              stats_id=stats_id, n=len(data.tokens)),
                    out / "rows" / "batch_ceiling.parquet")
        write_manifest(out, config, argv=argv, started=started, run_id=run_id, extra=extra)
    train(model, data.tokens, stats, cfg, sched, TrainRun(out, start, run_id, stats_id),
          ranks=ranks)
    if ranks.is_main:
        write_manifest(out, config, argv=argv, started=started, run_id=run_id, extra=extra)
    return out


def _restore(model: AttnOnlyTransformer, out: Path, cfg: TrainConfig) -> int:
    found = latest_checkpoint(out)
    if found is None:
        return 0
    check_resumable(out, cfg)
    step, state = found
    model.load_state_dict({k: v.to(model.W_O.device) for k, v in state.items()})
    log.info("resuming %s from step %d", out, step)
    return step


def load_run(out: str | Path) -> tuple[TrainConfig, AttnOnlyTransformer, dict[str, Tensor], Any]:
    """(config, model at its last checkpoint, theory statistics, ToyData) of a finished run."""
    out = Path(out)
    cfg = saved_train_config(out)
    found = latest_checkpoint(out)
    if found is None:
        raise MissingFileError(f"no checkpoint under {out}/checkpoints; train the run first")
    data = load_toy_data(cfg.data_config(), cache_dir=out / "data")
    model = AttnOnlyTransformer(ToyConfig(data.d_vocab, cfg.seq_len, cfg.layers),
                                dtype=DTYPES[cfg.dtype])
    model.load_state_dict(found[1])
    return cfg, model, load_tensors(out / "theory.safetensors"), data


def command(cfg: TrainConfig, argv: list[str]) -> int:
    """The command once its flags are parsed (:func:`pythia_probe.toy.train.main`): train, then
    print the headline numbers beside the paper's (rank 0); returns a process exit code."""
    ranks = from_env(resolve_device(cfg.device))
    out = run(cfg, argv=argv, ranks=ranks)
    if ranks.is_main:
        d_vocab = int(read_manifest(out)["config"]["d_vocab"])
        print("\n".join(paper.comparison_lines(read_results(out / "rows"), cfg, d_vocab)))
    ranks.barrier()  # every rank leaves together, after rank 0 has written and reported
    return 0
