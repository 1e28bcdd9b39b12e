"""The fixed inputs of the frozen sweep outputs (issue 27: behaviour frozen before the
consolidation). make_frozen.py and tests/test_frozen.py both run the cases here.

A loopback hub holding one Pythia-shaped model (EleutherAI/pythia-70m: a tiny GPT-NeoX with
Pythia's 50,304 embedding rows and a tokenizer in the real one's format, steps 0, 1, 2 and
143000) and Skylion007/openwebtext (2 parquet shards of 40 documents); statistics built from the
paper's recipe on first use; the sweep with its defaults (embedding, attention_lnfold,
attention; intervals on) at top-200 in both conventions, and at the full vocabulary."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from pythia_probe.results import read_results
from pythia_probe.sweep import statistics
from pythia_probe.sweep.__main__ import main as sweep_main
from pythia_probe.testing.endpoint import use_endpoint
from pythia_probe.testing.hub import HubServer
from pythia_probe.testing.repos import build_pythia_suite_hub

MODEL = "EleutherAI/pythia-70m"
BASE = ["--model", MODEL, "--steps", "0,1,2,143000", "--no-plots", "--no-progress"]
CASES = {
    "top200_paper": BASE + ["--top-k", "200"],
    "top200_authors": BASE + ["--top-k", "200", "--conventions", "authors"],
    "full_paper": BASE + ["--steps", "0,143000"],
}
KEY = ["model", "step", "analysis", "layer", "head", "metric"]
#: the numbers frozen: every float column of the table, and the verdict
FLOATS = ["value", "chance", "chance_sd", "ceiling", "ceiling_half", "ci_low", "ci_high",
          "effect"]
COLUMNS = KEY + FLOATS + ["above_chance", "n", "stats_id", "revision_status"]


def build_hub(root: Path) -> Path:
    build_pythia_suite_hub(root, models={MODEL: (8, 2)}, steps=(0, 1, 2, 143000))
    return root


def run_case(name: str, hub_root: Path, work: Path) -> pd.DataFrame:
    """Run one case's sweep in ``work`` (its own tool cache, a 24 GB machine's budget) and
    return its table, sorted by cell, with the frozen columns."""
    work.mkdir(parents=True, exist_ok=True)
    out = work / "out"
    budget, statistics.memory_budget = statistics.memory_budget, (
        lambda device: (19.2e9, "24 GB machine"))
    cache = os.environ.get("PYTHIA_PROBE_CACHE")
    os.environ["PYTHIA_PROBE_CACHE"] = str(work / "cache")
    try:
        with HubServer(hub_root) as hub, use_endpoint(hub.endpoint):
            code = sweep_main(CASES[name] + ["--out", str(out)])
    finally:
        statistics.memory_budget = budget
        os.environ.pop("PYTHIA_PROBE_CACHE")
        if cache is not None:
            os.environ["PYTHIA_PROBE_CACHE"] = cache
    if code != 0:
        raise RuntimeError(f"frozen case {name}: sweep exit {code}")
    df = read_results(out)[COLUMNS]
    return df.sort_values(KEY, na_position="first").reset_index(drop=True)
