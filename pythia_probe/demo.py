"""A small GPT-NeoX trained on the built-in corpus, with Pythia-like checkpoints, for ``--demo``.

Built-in stories -> word tokenizer (the leading-terms paper's rule) -> [N, T+1] token windows
-> transformers' GPTNeoXForCausalLM (a few layers, Pythia's architecture: parallel residual,
partial rotary, untied embeddings) trained with AdamW, saving checkpoints at steps 0, 1, 2, 4,
..., 512 (as far as training goes) and then every ``save_every`` steps.

Layout (what :mod:`pythia_probe.hub.checkpoints` reads as a local model folder)::

    OUT/tokenizer.json               the word tokenizer
    OUT/tokens.safetensors           the training windows (statistics use the same data)
    OUT/step{N}/config.json          GPT-NeoX config
    OUT/step{N}/model.safetensors    weights (safetensors only)
    OUT/train_state.safetensors      the optimizer's moments, the batch sampler's RNG and the
                                     losses at the newest checkpoint: training killed by any
                                     signal resumes from there, to the same weights

:func:`build_demo_model` trains on its own; ``python -m pythia_probe.sweep --demo`` also
computes statistics, sweeps the checkpoints and plots. Every file goes through
:mod:`pythia_probe.fileio`. Under ``torchrun``/``accelerate launch`` rank 0 trains and computes
the statistics once, every rank sweeps its share of the checkpoints, and rank 0 plots.
"""

from __future__ import annotations

import json
import logging
import math
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from pythia_probe import sweep
from pythia_probe.builtin_corpus import generate_stories
from pythia_probe.errors import BadInputError
from pythia_probe.fileio import (
    atomic_write,
    check_folders,
    with_subfolders,
    write_bytes,
    write_text,
)
from pythia_probe.ranks import Ranks, check_device
from pythia_probe.stats import batch_stats
from pythia_probe.stats.groups import DEFAULT_GROUPS
from pythia_probe.tokenizer import (
    build_word_tokenizer,
    d_vocab,
    encode_documents,
    load_tokenizer,
    tokenizer_fingerprint,
)

TOKENS_FILE = "tokens.safetensors"
STATE_FILE = "train_state.safetensors"
ANALYSES = ("embedding", "attention", "attention_lnfold", "unembedding", "attention_text")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DemoConfig:
    """Demo model and training settings (`bench_defaults.py --runs demo` times --demo)."""

    n_stories: int = 3000
    vocab_size: int = 1000  # top-k words; the built-in corpus has fewer types, so no OOV
    seq_len: int = 64  # T predicted positions per window
    n_layers: int = 4
    d_model: int = 64
    n_heads: int = 4
    d_mlp: int = 256
    batch_size: int = 32
    max_step: int = 1024
    save_every: int = 256
    lr: float = 3e-3
    warmup: int = 64
    seed: int = 0

    def __post_init__(self):
        if self.d_model % self.n_heads:
            raise BadInputError(f"d_model={self.d_model} must be divisible by "
                                f"n_heads={self.n_heads}")
        for name in ("n_stories", "vocab_size", "seq_len", "n_layers", "batch_size", "max_step",
                     "save_every"):
            if getattr(self, name) < 1:
                raise BadInputError(f"{name} must be >= 1, got {getattr(self, name)}")


def checkpoint_steps(max_step: int, save_every: int) -> list[int]:
    """Pythia-like schedule: 0, 1, 2, 4, ..., 512 (<= max_step), then every ``save_every``."""
    early = [0] + [2**k for k in range(10) if 2**k <= max_step]
    regular = range(save_every, max_step + 1, save_every)
    return sorted(set(early) | {s for s in regular if s > 512} | {max_step})


def build_data(cfg: DemoConfig):
    """Built-in stories -> word tokenizer -> [N, T+1] LongTensor windows of the stories packed
    one after another (OOV stories dropped), and each window's document: the story of its
    first token, numbered 0, 1, ... in order (the statistics' document groups)."""

    docs = generate_stories(cfg.n_stories, seed=cfg.seed)
    tok = build_word_tokenizer(docs, cfg.vocab_size)
    stories = list(encode_documents(tok, docs, drop_oov=True))
    ids = [i for doc in stories for i in doc]
    L = cfg.seq_len + 1
    n = len(ids) // L
    if n < cfg.batch_size:
        raise BadInputError(f"only {n} windows of {L} tokens from {cfg.n_stories} "
                            f"stories; need >= batch_size={cfg.batch_size}: raise n_stories")
    tokens = torch.tensor(ids[: n * L]).view(n, L)
    starts = torch.tensor([0] + [len(s) for s in stories]).cumsum(0)[:-1]
    documents = torch.searchsorted(starts, torch.arange(n) * L, right=True) - 1
    return tok, tokens, documents


def make_model(cfg: DemoConfig, n_vocab: int):
    """A randomly initialised GPTNeoXForCausalLM with Pythia's architectural choices."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    config = GPTNeoXConfig(
        vocab_size=n_vocab, hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads, intermediate_size=cfg.d_mlp,
        max_position_embeddings=cfg.seq_len, rotary_pct=0.25, use_parallel_residual=True,
        tie_word_embeddings=False, bos_token_id=None, eos_token_id=None)
    torch.manual_seed(cfg.seed)
    return GPTNeoXForCausalLM(config).float()


def save_checkpoint(model, out: Path, step: int) -> Path:
    """Write ``out/step{step}/{config.json, model.safetensors}`` (atomic per file)."""
    folder = out / f"step{step}"
    write_text(folder / "config.json", model.config.to_json_string())
    sd = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    save_tensors(sd, folder / "model.safetensors", {"format": "pt", "step": str(step)})
    return folder


def save_tensors(tensors: dict, path: Path, metadata: dict | None = None) -> Path:
    """A safetensors file written through the one atomic writer."""
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    return atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=metadata), nbytes)


def save_tokenizer_files(tok, out: Path) -> None:
    """The tokenizer's files (tokenizer.json, tokenizer_config.json) into ``out``, each
    through the atomic writer (save_pretrained writes into a private temporary folder)."""
    with tempfile.TemporaryDirectory(prefix="demo-tokenizer-") as tmp:
        tok.save_pretrained(tmp)
        for f in sorted(Path(tmp).iterdir()):
            if f.is_file():
                write_bytes(out / f.name, f.read_bytes())


def _lr(cfg: DemoConfig, step: int) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = (step - cfg.warmup) / max(1, cfg.max_step - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def save_train_state(out: Path, opt, g: torch.Generator, losses: dict, step: int,
                     cfg: DemoConfig) -> None:
    """What an exact resume at ``step`` needs beside that step's weights: AdamW's moments, the
    batch sampler's RNG state and the losses so far (one file, replaced atomically)."""
    tensors = {f"opt.{i}.{k}": v.detach().clone() for i, state in opt.state_dict()["state"].items()
               for k, v in state.items()}
    tensors["rng"] = g.get_state()
    tensors["losses"] = torch.tensor([losses[s] for s in range(step)], dtype=torch.float64)
    save_tensors(tensors, out / STATE_FILE, {"step": str(step), "config": json.dumps(asdict(cfg))})


def load_train_state(out: Path, cfg: DemoConfig) -> tuple[int, dict] | None:
    """(step, tensors) of the state saved by a run of ``cfg`` whose checkpoint at that step is
    there; None (train from step 0) when there is none, it is another config's or unreadable."""
    try:
        with safe_open(out / STATE_FILE, "pt") as f:
            meta = f.metadata() or {}
        state = load_file(out / STATE_FILE)
    except (OSError, SafetensorError):
        return None
    step = int(meta.get("step", -1))
    if meta.get("config") != json.dumps(asdict(cfg)) or \
            not (out / f"step{step}" / "model.safetensors").is_file():
        log.info("%s is not a state of these settings; training from step 0", out / STATE_FILE)
        return None
    return step, state


def _resume(out: Path, cfg: DemoConfig, model, opt, g: torch.Generator) -> tuple[int, dict]:
    """Restore model, optimizer and RNG from the newest saved state; (start step, losses)."""
    saved = load_train_state(out, cfg)
    if saved is None:
        return 0, {}
    step, state = saved
    model.load_state_dict(load_file(out / f"step{step}" / "model.safetensors"))
    moments: dict[int, dict] = {}
    for key, value in state.items():
        if key.startswith("opt."):
            _, i, name = key.split(".", 2)
            moments.setdefault(int(i), {})[name] = value
    opt.load_state_dict({"state": moments, "param_groups": opt.state_dict()["param_groups"]})
    g.set_state(state["rng"])
    log.info("resuming the demo's training from its checkpoint at step %d", step)
    return step, dict(enumerate(state["losses"].tolist()))


def train(cfg: DemoConfig, out: str | Path, tokens: torch.Tensor, n_vocab: int,
          progress: bool = True) -> dict:
    """Train with AdamW on random windows, from the newest saved state if any; save checkpoints
    (and the state to resume from) on the schedule. Returns losses."""
    out = Path(out)
    model = make_model(cfg, n_vocab)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
    g = torch.Generator().manual_seed(cfg.seed)
    start, losses = _resume(out, cfg, model, opt, g)
    saves = set(checkpoint_steps(cfg.max_step, cfg.save_every))
    for step in tqdm(range(start, cfg.max_step + 1), desc="demo train", unit="step",
                     initial=start, total=cfg.max_step + 1, disable=not progress):
        if step in saves:
            save_checkpoint(model, out, step)
            save_train_state(out, opt, g, losses, step, cfg)
        if step == cfg.max_step:
            break
        batch = tokens[torch.randint(len(tokens), (cfg.batch_size,), generator=g)]
        loss = model(input_ids=batch, labels=batch).loss
        for group in opt.param_groups:
            group["lr"] = _lr(cfg, step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses[step] = loss.item()
    return losses


def build_demo_model(cfg: DemoConfig, out: str | Path, progress: bool = True) -> dict:
    """Data, tokenizer and checkpoints under ``out``; skips training if the last step exists."""
    out = Path(out)
    tok, tokens, documents = build_data(cfg)
    save_tokenizer_files(tok, out)
    save_tensors({"tokens": tokens.contiguous(), "documents": documents.contiguous()},
                 out / TOKENS_FILE)
    last = out / f"step{cfg.max_step}" / "model.safetensors"
    if last.exists():
        return {"trained": False, "n_windows": len(tokens)}
    t0 = time.perf_counter()
    losses = train(cfg, out, tokens, n_vocab=len(tok), progress=progress)
    first, final = losses[0], sum(list(losses.values())[-20:]) / min(20, len(losses))
    return {"trained": True, "n_windows": len(tokens), "loss_first": first,
            "loss_final": final, "train_seconds": time.perf_counter() - t0}


def demo_stats(model_dir: str | Path, out: str | Path, cfg: DemoConfig | None = None):
    """Statistics of the demo's training windows (both passes, exact), saved to ``out``; the
    metadata says which corpus they came from (the built-in stories, as the model saw them)."""
    cfg = cfg or DemoConfig()
    tok = load_tokenizer(str(model_dir))
    tokens = load_tokens(model_dir)
    documents = load_file(Path(model_dir) / TOKENS_FILE)["documents"]
    stats = batch_stats(tokens, d_vocab(tok), tokenizer=tokenizer_fingerprint(tok),
                        groups=DEFAULT_GROUPS, documents=documents)  # story s: group s mod G
    stats.meta["corpus"] = {"dataset": "builtin", "stories": cfg.n_stories, "seed": cfg.seed,
                            "groups": "by story: a window in the group of its first token's",
                            "windows": int(tokens.shape[0]), "tokens_per_window":
                            int(tokens.shape[1]), "what": "the demo model's training windows"}
    stats.save(out)
    return stats


def run_demo(out: str | Path, cfg: DemoConfig | None = None, device: str = "cpu",
             work: str | Path | None = None, ranks: Ranks | None = None,
             progress: bool = True) -> int:
    """The README's main job: corpus -> tokenizer -> model checkpoints -> statistics -> sweep ->
    tables (``out/run``: shards, revisions.parquet, summary.parquet) + figures (``out/plots``)
    + the printed summary (per layer: peak and exit steps, :mod:`pythia_probe.summary`).

    Checkpoints and statistics go to ``work`` (default ``out/work``). Returns the sweep's code.
    ``ranks``: under a multi-process launch rank 0 trains and computes the statistics, every
    rank sweeps its share of the steps, rank 0 summarises and plots.
    """
    device = "cuda" if device == "auto" and torch.cuda.is_available() else (
        "cpu" if device == "auto" else device)
    check_device(device)  # before minutes of training
    out, cfg = Path(out), cfg or DemoConfig()
    ranks = ranks or Ranks(device=device)
    work = Path(work) if work is not None else out / "work"
    model = work / "demo-neox"
    check_folders(out, [*with_subfolders(model), out / "run", *with_subfolders(out / "plots")])
    torch.set_num_threads(1)  # tiny matrices: extra OpenMP threads only add contention
    if ranks.is_main:
        print(plan_line(cfg, model, out), flush=True)
        info = build_demo_model(cfg, model, progress)
        if "loss_first" in info:
            print(f"trained {cfg.max_step} steps: loss {info['loss_first']:.3f} -> "
                  f"{info['loss_final']:.3f} (mean of last 20) in {info['train_seconds']:.0f} s")
        demo_stats(model, work / "stats.safetensors", cfg)
    ranks.barrier()  # the other ranks wait for the checkpoints and statistics
    parts = sweep.SweepConfig(
        model=str(model), steps="all", stats=str(work / "stats.safetensors"),
        analyses=ANALYSES,
        text=str(model / TOKENS_FILE), out=str(out / "run"), device=device, dtype="float64",
        progress=progress).split(ranks.device)
    # the sweep writes the summary, the revision ledger and the figures (into out/plots)
    parts = replace(parts, output=replace(parts.output, plots_dir=str(out / "plots")))
    return sweep.run(parts, ranks)


def plan_line(cfg: DemoConfig, model: Path, out: Path) -> str:
    """What --demo is about to do, printed before the minutes of training."""
    steps = checkpoint_steps(cfg.max_step, cfg.save_every)
    state = load_train_state(model, cfg)
    start = (f"resuming from step {state[0]}" if state and state[0] else "from step 0")
    shown = steps if len(steps) <= 6 else [*steps[:4], "...", steps[-1]]
    return (f"demo plan: train a {cfg.n_layers}-layer GPT-NeoX (d_model {cfg.d_model}) for "
            f"{cfg.max_step} steps on {cfg.n_stories} built-in stories ({start}), "
            f"{len(steps)} checkpoints ({', '.join(map(str, shown))}) in "
            f"{model}; then the corpus statistics, a sweep of {len(steps)} checkpoints x "
            f"{len(ANALYSES)} analyses into {out / 'run'} and figures into {out / 'plots'}")


def load_tokens(out: str | Path) -> torch.Tensor:
    """The [N, T+1] training windows saved by :func:`build_demo_model`."""
    return load_file(Path(out) / TOKENS_FILE)["tokens"]
