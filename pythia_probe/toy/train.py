"""Train the Def. 3.1 model the paper's way and track its weights against Theorem 4.1.

All weights start at zero; plain SGD (no momentum, no weight decay), full batch or mini-batch.
Every ``log_every`` steps one tidy shard ``rows/step{step:08d}.parquet`` is written with, per
layer, the Frobenius cosine of W_O vs Bbar, V vs Phibar^T Bbar^T, W vs Qbar and P vs Delta,
the relative error against the predicted weight ``coefficient(s) * leading term`` and the norm
ratio, plus the mean training loss of the interval. Theory statistics come from the FIRST
training batch (as in the paper). Checkpoints (safetensors) allow an exact resume.
Multi-GPU: ``accelerate launch -m pythia_probe.toy.train ...`` (data parallel; only main()
knows about ranks).

Paper scale (Table 1):  python -m pythia_probe.toy.train --dataset roneneldan/TinyStories
  --layers 3 --tokenizer word:3000 --seq-len 200 --n-seqs 65536 --batch-size 2048 --micro-batch 512
  --epochs 100 --lr 0.005 --out results/toy/runs/paper
"""

from __future__ import annotations

import logging
import math
from contextlib import nullcontext
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor
from tqdm import tqdm

from pythia_probe import theory
from pythia_probe.cli import flag, parse_config, run_main
from pythia_probe.errors import BadInputError, CorruptFileError, MissingFileError, check_device
from pythia_probe.fileio import atomic_write, remove
from pythia_probe.linalg import frobenius_cosine
from pythia_probe.ranks import world_size
from pythia_probe.results import make_rows, new_run_id, read_manifest, write_manifest, write_shard
from pythia_probe.stats import batch_stats
from pythia_probe.toy.data import TOKENIZERS, ToyDataConfig, load_toy_data
from pythia_probe.toy.model import AttnOnlyTransformer, ToyConfig

log = logging.getLogger(__name__)

MODEL_NAME = "toy-attn"
ANALYSIS = "toy_train"
DTYPES = {"float32": torch.float32, "float64": torch.float64}
#: weight -> metric suffix naming its leading term
PAIRS = {"W_O": "W_O_Bbar", "V": "V_PhiBT", "W": "W_Qbar", "P": "P_Delta"}


@dataclass(frozen=True)
class TrainConfig:
    """Toy training run. batch_size 0 = full batch; micro_batch 0 = no gradient accumulation;
    log_every 0 = once per epoch; checkpoint_every must be a multiple of log_every."""

    dataset: str = "builtin"
    """Corpus: 'builtin', a local .txt/.jsonl/.parquet file, or a hub dataset id."""
    tokenizer: str = "word:3000"
    """'word:K' (the paper's word rule, top-K words; stories with other words dropped) or
    'bpe:K' (a byte-level BPE with K ids trained on the data)."""
    layers: int = 3
    """Number of layers L."""
    seq_len: int = 200
    """T, predicted positions per sequence (stories keep T+1 tokens)."""
    n_seqs: int = 65536
    """Number of training sequences N."""
    docs: int | None = None
    """Read at most this many documents."""
    stories: int = 20000
    """Stories generated for --dataset builtin."""
    lr: float = 0.005
    """SGD learning rate."""
    epochs: int = 100
    """Epochs."""
    batch_size: int = 2048
    """SGD batch (0 = full batch)."""
    micro_batch: int = 0
    """Gradient-accumulation chunk (0 = the whole batch)."""
    log_every: int = 0
    """Steps between result rows (0 = once per epoch)."""
    checkpoint_every: int = 0
    """Steps between checkpoints (0 = once per epoch; a multiple of log_every)."""
    seed: int = 0
    """Shuffling seed."""
    dtype: Literal["float32", "float64"] = "float32"
    """Parameter dtype."""
    device: str = "auto"
    """auto | cpu | cuda | cuda:N."""
    out: str = "results/toy/run"
    """Run folder (rows/, checkpoints/, manifest.json)."""
    resume: bool = True
    """Continue from the newest checkpoint in --out (--no-resume: start from zero)."""

    def __post_init__(self) -> None:
        kind, size = parse_tokenizer(self.tokenizer)
        if kind not in TOKENIZERS:
            raise BadInputError(f"--tokenizer {self.tokenizer!r}: valid: word:K or bpe:K")
        if self.dtype not in DTYPES:
            raise BadInputError(f"--dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        for name in ("batch_size", "micro_batch", "log_every", "checkpoint_every"):
            if getattr(self, name) < 0:
                raise BadInputError(f"{flag(name)} must be >= 0, got {getattr(self, name)}")
        for name in ("layers", "seq_len", "n_seqs", "epochs", "stories"):
            if getattr(self, name) < 1:
                raise BadInputError(f"{flag(name)} must be >= 1, got {getattr(self, name)}")
        if size < 1:
            raise BadInputError(f"--tokenizer {self.tokenizer!r}: K must be >= 1")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise BadInputError(f"--lr must be a positive finite number, got {self.lr}")
        if self.batch_size > self.n_seqs:
            raise BadInputError(f"--batch-size {self.batch_size} exceeds --n-seqs {self.n_seqs}")
        if self.device != "auto":
            check_device(self.device)

    def data_config(self) -> ToyDataConfig:
        kind, size = parse_tokenizer(self.tokenizer)
        return ToyDataConfig(source=self.dataset, tokenizer=kind, d_vocab=size,
                             seq_len=self.seq_len, n_seqs=self.n_seqs, max_docs=self.docs,
                             corpus_opts=({"n_stories": self.stories}
                                          if self.dataset == "builtin" else {}))


def parse_tokenizer(spec: str) -> tuple[str, int]:
    """'word:3000' -> ("word", 3000); refused (one line) unless KIND:INTEGER."""
    kind, _, size = spec.partition(":")
    if not size.isdigit():
        raise BadInputError(f"--tokenizer {spec!r}: valid: word:K or bpe:K (K an integer)")
    return kind, int(size)


#: field names of runs saved before the flag vocabulary was unified -> today's
LEGACY_FIELDS = {"data": "dataset", "builtin_stories": "stories", "max_docs": "docs"}


def saved_config(saved: dict) -> dict:
    """A run manifest's config in today's field names (older runs wrote data, vocab, ...)."""
    cfg = {LEGACY_FIELDS.get(k, k): v for k, v in saved.items()}
    if "vocab" in cfg and ":" not in str(cfg.get("tokenizer", "")):
        cfg["tokenizer"] = f"{cfg.get('tokenizer', 'word')}:{cfg.pop('vocab')}"
    names = {f.name for f in fields(TrainConfig)}
    return {k: v for k, v in cfg.items() if k in names}


@dataclass(frozen=True)
class Schedule:
    """Step arithmetic of a run: N sequences, batch B, epochs; shuffled per epoch by seed."""

    n_seqs: int
    batch: int
    epochs: int
    seed: int
    log_every: int
    checkpoint_every: int

    @property
    def steps_per_epoch(self) -> int:
        return self.n_seqs // self.batch

    @property
    def total_steps(self) -> int:
        return self.epochs * self.steps_per_epoch

    def permutation(self, epoch: int) -> Tensor:
        """Order of epoch ``epoch``; the identity for full-batch runs."""
        if self.batch == self.n_seqs:
            return torch.arange(self.n_seqs)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.n_seqs, generator=g)

    def batch_indices(self, step: int) -> Tensor:
        """Sequence indices of the batch used for update number step + 1."""
        epoch, b = divmod(step, self.steps_per_epoch)
        return self.permutation(epoch)[b * self.batch:(b + 1) * self.batch]


def make_schedule(cfg: TrainConfig, n_seqs: int) -> Schedule:
    batch = cfg.batch_size or n_seqs
    spe = n_seqs // batch
    log_every = cfg.log_every or spe
    ckpt = cfg.checkpoint_every or max(spe, log_every)
    if ckpt % log_every:
        raise BadInputError(f"checkpoint_every {ckpt} must be a multiple of log_every {log_every}")
    return Schedule(n_seqs, batch, cfg.epochs, cfg.seed, log_every, ckpt)


def next_token_loss(model: torch.nn.Module, seqs: Tensor) -> Tensor:
    """Eq. 3 through ``model``'s forward (so a DDP wrapper syncs): mean CE over positions."""
    logits = model(seqs[:, :-1])
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             seqs[:, 1:].reshape(-1))


def sgd_step(model: torch.nn.Module, params: list[Tensor], seqs: Tensor, lr: float,
             micro_batch: int = 0, accelerator: Any = None) -> float:
    """One plain-SGD update on ``seqs`` (accumulating micro-batches); returns the mean loss."""
    chunks = seqs.split(micro_batch or len(seqs))
    total = 0.0
    for p in params:
        p.grad = None
    for i, chunk in enumerate(chunks):
        last = i == len(chunks) - 1
        sync = nullcontext() if accelerator is None or last else accelerator.no_sync(model)
        with sync:
            loss = next_token_loss(model, chunk) * (len(chunk) / len(seqs))
            if accelerator is None:
                loss.backward()
            else:
                accelerator.backward(loss)
        total += float(loss.detach())
    with torch.no_grad():
        for p in params:
            p.add_(p.grad, alpha=-lr)
    if accelerator is not None:  # every rank saw an equal share: the batch loss is the mean
        total = float(accelerator.reduce(torch.tensor(total, device=accelerator.device), "mean"))
    return total


def weight_rows(model: AttnOnlyTransformer, stats: dict[str, Tensor], step: int,
                lr: float) -> list[dict]:
    """Cosine, relative error and norm ratio of every weight vs its leading term at ``step``."""
    pred = theory.predicted_weights(stats, step, lr)
    rows = []
    for w, suffix in PAIRS.items():
        term = stats[theory.LEADING_TERM[w]]
        weights = model.W_O[None] if w == "W_O" else getattr(model, w)
        for layer, weight in enumerate(weights.detach().cpu()):
            values = {f"cos_{suffix}": frobenius_cosine(weight, term),
                      f"relerr_{suffix}": theory.relative_error(weight, pred[w]),
                      f"normratio_{suffix}": _norm_ratio(weight, pred[w])}
            rows += [{"layer": None if w == "W_O" else layer, "metric": m, "value": v}
                     for m, v in values.items() if math.isfinite(v)]
    return rows


def _norm_ratio(weight: Tensor, predicted: Tensor) -> float:
    denom = float(predicted.double().norm())
    return float(weight.detach().double().norm()) / denom if denom > 0 else math.nan


def save_checkpoint(out: Path, model: AttnOnlyTransformer, step: int) -> Path:
    """Weights at ``step`` to out/checkpoints/step{step}.safetensors; older ones removed."""
    ckdir = out / "checkpoints"
    path = ckdir / f"step{step:08d}.safetensors"
    tensors = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    atomic_write(path, lambda tmp: save_file(tensors, str(tmp), metadata={"step": str(step)}))
    for old in ckdir.glob("step*.safetensors"):
        if old != path:
            remove(old, [ckdir])
    return path


def latest_checkpoint(out: Path) -> tuple[int, dict[str, Tensor]] | None:
    """(step, state dict) of the newest checkpoint under out/checkpoints, or None."""
    paths = sorted((out / "checkpoints").glob("step*.safetensors"))
    if not paths:
        return None
    try:
        return int(paths[-1].stem[4:]), load_file(str(paths[-1]))
    except (SafetensorError, OSError, ValueError) as err:
        raise CorruptFileError(f"toy checkpoint {paths[-1]} is unreadable ({err}); delete it "
                               "(and train again) or pass --no-resume") from err


def theory_batch(seqs: Tensor, sched: Schedule) -> Tensor:
    """The first training batch: the paper computes the theory matrices from it alone."""
    return seqs[sched.batch_indices(0)]


def train(model: AttnOnlyTransformer, seqs: Tensor, stats: dict[str, Tensor], cfg: TrainConfig,
          sched: Schedule, out: Path, *, start_step: int = 0, run_id: str | None = None,
          accelerator: Any = None, stats_id: str | None = None) -> list[float]:
    """Run SGD from ``start_step`` to the end of the schedule; write rows and checkpoints."""
    main_proc = accelerator is None or accelerator.is_main_process
    ddp = model if accelerator is None else accelerator.prepare(model)
    params = list(model.parameters())
    rank, world = (0, 1) if accelerator is None else (accelerator.process_index,
                                                      accelerator.num_processes)
    device = model.W_O.device
    losses: list[float] = []
    common = {"model": MODEL_NAME, "analysis": ANALYSIS, "run_id": run_id, "stats_id": stats_id,
              "dtype": cfg.dtype}
    bar = tqdm(range(start_step, sched.total_steps), desc="toy train", disable=not main_proc,
               initial=start_step, total=sched.total_steps)
    for step in bar:
        batch = seqs[sched.batch_indices(step)][rank::world].to(device)
        losses.append(sgd_step(ddp, params, batch, cfg.lr, cfg.micro_batch, accelerator))
        bar.set_postfix(loss=f"{losses[-1]:.4f}")
        done = step + 1
        if done % sched.log_every == 0 or done == sched.total_steps:
            since_log = done - (done - 1) // sched.log_every * sched.log_every
            interval = losses[-since_log:]
            if main_proc:
                _write_rows(model, stats, done, cfg, interval, out, common)
        if main_proc and (done % sched.checkpoint_every == 0 or done == sched.total_steps):
            save_checkpoint(out, model, done)
    return losses


def _write_rows(model, stats, step, cfg, interval, out, common) -> None:
    rows = weight_rows(model, stats, step, cfg.lr)
    rows.append({"layer": None, "metric": "loss", "value": sum(interval) / len(interval),
                 "n": len(interval)})
    write_shard(make_rows(rows, step=step, **common), out / "rows" / f"step{step:08d}.parquet")


def _device(cfg: TrainConfig, accelerator: Any) -> torch.device:
    if accelerator is not None:
        return accelerator.device
    if cfg.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(cfg.device)


def _accelerator() -> Any:
    """An Accelerator (data-parallel gradients on accelerate's PartialState) only when launched
    with several processes (accelerate launch); ranks are read from it, nowhere else."""
    if world_size() <= 1:
        return None
    from accelerate import Accelerator  # seconds to import: only for multi-process runs

    return Accelerator()


def run(cfg: TrainConfig, argv: list[str] | None = None, accelerator: Any = None) -> Path:
    """Load data, build the zero-initialised model, resume if possible, train; return out dir.

    A finished run (its last checkpoint at the final step) is left untouched.
    """
    out, started = Path(cfg.out), datetime.now(timezone.utc)
    data = load_toy_data(cfg.data_config(), cache_dir=out / "data")
    sched = make_schedule(cfg, len(data.tokens))
    if sched.batch % ((cfg.micro_batch or 1) * (accelerator.num_processes if accelerator else 1)):
        raise BadInputError("batch_size must be a multiple of micro_batch x number of processes")
    found = latest_checkpoint(out) if cfg.resume else None
    if found is not None and found[0] >= sched.total_steps:
        log.info("%s already finished %d steps; nothing to train", out, found[0])
        return out
    device = _device(cfg, accelerator)
    corpus_stats = batch_stats(theory_batch(data.tokens, sched), data.d_vocab, device=device)
    stats = {k: v.cpu() for k, v in theory.as_stats(corpus_stats).items()}
    model = AttnOnlyTransformer(ToyConfig(data.d_vocab, cfg.seq_len, cfg.layers),
                                dtype=DTYPES[cfg.dtype], device=device)
    start = _restore(model, out, cfg) if found is not None else 0
    run_id, main_proc = new_run_id(), accelerator is None or accelerator.is_main_process
    config = {**asdict(cfg), "d_vocab": data.d_vocab, "steps_per_epoch": sched.steps_per_epoch,
              "total_steps": sched.total_steps, "log_every": sched.log_every}
    extra = {"resumed_from_step": start, "data": data.meta,
             "earlier_run_ids": _earlier_run_ids(out) if start else []}
    if main_proc:
        save_file({k: v.contiguous() for k, v in stats.items()}, str(out / "theory.safetensors"))
        write_manifest(out, config, argv=argv, started=started, run_id=run_id, extra=extra)
    train(model, data.tokens, stats, cfg, sched, out, start_step=start, run_id=run_id,
          accelerator=accelerator, stats_id=corpus_stats.stats_id)
    if main_proc:
        write_manifest(out, config, argv=argv, started=started, run_id=run_id, extra=extra)
    return out


def _earlier_run_ids(out: Path) -> list[str]:
    old = read_manifest(out)
    return [*old.get("earlier_run_ids", []), old.get("run_id")]


#: config fields that may change between a run and its resumption
RESUMABLE = ("epochs", "out", "resume", "device")


def _restore(model: AttnOnlyTransformer, out: Path, cfg: TrainConfig) -> int:
    found = latest_checkpoint(out)
    if found is None:
        return 0
    old = saved_config(read_manifest(out)["config"])
    diff = [k for k, v in asdict(cfg).items() if k not in RESUMABLE and old.get(k) != v]
    if diff:
        raise BadInputError(f"{out} holds a run with different settings {diff}; pass the same "
                            "settings, another --out, or --no-resume")
    step, state = found
    model.load_state_dict({k: v.to(model.W_O.device) for k, v in state.items()})
    log.info("resuming %s from step %d", out, step)
    return step


def load_run(out: str | Path) -> tuple[TrainConfig, AttnOnlyTransformer, dict[str, Tensor], Any]:
    """(config, model at its last checkpoint, theory statistics, ToyData) of a finished run."""
    out = Path(out)
    cfg = TrainConfig(**saved_config(read_manifest(out)["config"]))
    found = latest_checkpoint(out)
    if found is None:
        raise MissingFileError(f"no checkpoint under {out}/checkpoints; train the run first")
    data = load_toy_data(cfg.data_config(), cache_dir=out / "data")
    model = AttnOnlyTransformer(ToyConfig(data.d_vocab, cfg.seq_len, cfg.layers),
                                dtype=DTYPES[cfg.dtype])
    model.load_state_dict(found[1])
    return cfg, model, load_file(str(out / "theory.safetensors")), data


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns a process exit code."""
    cfg = parse_config(TrainConfig, argv, "python -m pythia_probe.toy.train")
    run(cfg, argv=argv, accelerator=_accelerator())
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main, "python -m pythia_probe.toy.train"))
