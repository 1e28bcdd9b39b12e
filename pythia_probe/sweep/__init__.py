"""Sweep checkpoints: score every step's weights against corpus statistics, one shard per step.

    python -m pythia_probe.sweep --model EleutherAI/pythia-1.4b --steps 1000-143000 \\
        --stats stats/owt.safetensors --analyses embedding,attention --out runs/run1
    python -m pythia_probe.sweep --demo            # offline: train a tiny GPT-NeoX, sweep, plot

``--model`` is a hub id or a local folder with one ``step{N}/`` folder per checkpoint.
Statistics are loaded once (their tokenizer must match the model's) and shared by every step.

The package, by concern (each module takes only its part of the configuration):

- ``config``: the command's flags (:class:`SweepConfig`, validated once) and the frozen parts
  they split into (:class:`SweepParts`: source, statistics, scoring, plan, output);
- ``source``: where the weights come from (checkpoints, steps, config, tokenizer, the
  download stream under a disk limit, the offline advice);
- ``statistics``: ``--stats`` or the recipe, the vocabulary (``--top-k``), the file's metadata;
- ``held``: the targets prepared once per run, in the factored form (their norms cached by
  the statistics' content identity, checked by their digest);
- ``scoring``: what is scored (:class:`~pythia_probe.sweep.scoring.Scorer`: the analyses on
  one checkpoint, every value range-checked);
- ``layout`` and ``manifest``: the results folder (shards, failures, lock) and its record;
- ``runner``: the three stages in order: ``prepare`` (models, steps, statistics) ->
  :mod:`pythia_probe.planner` (what runs, downloads, disk and memory, decided, checked and
  printed before any download) -> ``execute`` (lock, targets, this process's share of the
  steps, retries, resume, the summary).

Each step writes ``OUT/shards/step{N}.parquet`` atomically; a rerun skips finished shards. A
step that fails is retried ``--retries`` times, then reported in ``OUT/failed/`` and the
manifest while the sweep goes on (exit code 1). Under ``accelerate launch`` or ``torchrun``
steps are split round-robin across processes; each writes its own shards and rank 0 writes
the manifest and holds the folder's lock. All bad input (unknown analysis, step the model
lacks, statistics from another tokenizer or with ids the model lacks, layers it lacks) is
rejected before any weight is downloaded.
"""

from pythia_probe.lazy import faces

__all__ = ["Scorer", "SweepConfig", "SweepParts", "run", "run_step"]
__getattr__, __dir__ = faces(__name__, {
    ".config": ("SweepConfig", "SweepParts"),
    ".runner": ("run",),
    ".scoring": ("Scorer",),
    ".tasks": ("run_step",),
})
