"""``python -m pythia_probe.sweep``: the command line; the only place that knows about ranks."""

from __future__ import annotations

import argparse
import os
import sys

from pythia_probe import demo
from pythia_probe.analysis.cosine import DEFAULT_CHUNK
from pythia_probe.cli import run_main
from pythia_probe.sweep.config import DTYPES, THEORY_MODES, SweepConfig
from pythia_probe.sweep.runner import run

#: --demo writes here (untracked); `--demo --out results/demo` regenerates the committed copy
DEMO_OUT = "runs/demo"


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
    p.add_argument("--cache-dir", help="checkpoint download cache (default: the tool's own, "
                                        "$HF_HOME/pythia_probe/checkpoints; an existing Hugging "
                                        "Face cache may be given: only files the tool downloaded "
                                        "are ever deleted)")
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

        demo_cfg = demo.DemoConfig(**({"max_step": a.demo_max_step} if a.demo_max_step else {}))
        return demo.run_demo(a.out or DEMO_OUT, demo_cfg, device=a.device, work=a.work)
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


def dist_env() -> tuple[int, int]:
    """(rank, world_size) under accelerate launch / torchrun; (0, 1) otherwise."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


if __name__ == "__main__":
    raise SystemExit(run_main(main, "python -m pythia_probe.sweep"))
