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

from pythia_probe.sweep.config import SweepConfig, shard_path, split_steps
from pythia_probe.sweep.runner import StepContext, run, run_step

__all__ = ["StepContext", "SweepConfig", "run", "run_step", "shard_path", "split_steps"]
