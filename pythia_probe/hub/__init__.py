"""Everything that talks to the Hugging Face hub or reads checkpoints, in one package.

The public face (what the sweep and the ``revisions`` command use; each name loads its module
on first use, so ``import pythia_probe.hub`` imports no torch)::

    from pythia_probe.hub import CheckpointSource, parse_steps, plan_downloads, ledger

- :mod:`.steps`: Pythia's checkpoint schedule and the ``--steps`` grammar;
- :mod:`.catalog`: which revisions a model has and what files each holds (nothing downloaded);
- :mod:`.checkpoints`: :class:`CheckpointSource` (resolve, fetch, verify, load, evict) and the
  download plan of many models (:func:`plan_downloads`);
- :mod:`.revision_ledger`: the revision ledger (which branches hold duplicate or final
  weights); :mod:`.revisions`: the ``revisions`` command (and every name of the ledger);
- below them: :mod:`.weights` (checkpoint files on disk: records, hashes, checked loading),
  :mod:`.cache` (the cache layout and what the tool owns in it), :mod:`.io` (checked names,
  one retry policy, the bytes from the hub to disk) and :mod:`.net` (timeouts and transport).
"""

from pythia_probe.lazy import faces

__all__ = ["PYTHIA_STEPS", "CheckpointSource", "DownloadPlan", "Group", "Loaded", "RetryPolicy",
           "Revision", "Task", "endpoint", "is_pythia", "ledger", "offline_hint", "parse_steps",
           "plan_downloads", "read_json", "read_ledger", "stream_plan", "write_ledger"]
__getattr__, __dir__ = faces(__name__, {
    ".checkpoints": (
        "CheckpointSource",
        "DownloadPlan",
        "Group",
        "Loaded",
        "RetryPolicy",
        "Revision",
        "Task",
        "plan_downloads",
        "stream_plan",
    ),
    ".io": ("endpoint", "offline_hint"),
    ".revision_ledger": ("ledger", "read_ledger", "write_ledger"),
    ".steps": ("PYTHIA_STEPS", "is_pythia", "parse_steps"),
    ".weights": ("read_json",),
})
