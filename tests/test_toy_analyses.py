"""The toy reproduction scripts' computations (analyses/toy_*.py) on tiny inputs."""

from __future__ import annotations

import importlib
import math
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from pythia_probe.results import read_results
from pythia_probe.stats.reference import reference_stats
from pythia_probe.toy import paper
from pythia_probe.toy.model import AttnOnlyTransformer, ToyConfig

ROOT = Path(__file__).resolve().parents[1]
ANALYSES = ROOT / "analyses"


@pytest.fixture(scope="module")
def scripts():
    sys.path.insert(0, str(ANALYSES))
    try:
        yield {n: importlib.import_module(n) for n in ("toy_table1", "toy_table3", "toy_figure5")}
    finally:
        sys.path.remove(str(ANALYSES))


@pytest.mark.parametrize("ceiling_name", ["batch_ceiling_W_O_Bbar", "noise_floor_W_O_Bbar"])
def test_min_cosines_takes_min_over_steps_and_layers_beside_the_batch_ceiling(scripts,
                                                                               ceiling_name):
    """Layers are 1-based in the rows and the table (the paper's numbering); a run written before
    the rename (its ceiling named noise_floor_*) is read under the new name."""
    from pythia_probe.toy.repro import markdown

    df = pd.DataFrame({"metric": ["cos_W_Qbar"] * 3 + ["cos_V_PhiBT", "cos_W_O_Bbar",
                                                        "cos_P_Delta", ceiling_name],
                       "step": [1, 2, 2, 1, 1, 1, None], "layer": [1, 1, 2, 1, None, 1, None],
                       "value": [0.99, 0.995, 0.98, 0.9, 0.8, 0.7, 0.81]})
    table = scripts["toy_table1"].min_cosines(df).set_index("weight")
    row = table.loc["attention (W vs Qbar)"]
    assert row["ours_min_cosine"] == 0.98 and row["at_step"] == 2 and row["at_layer"] == 2
    assert table.loc["attention (W vs Qbar)", "paper"] == pytest.approx(0.999496)
    assert "noise_floor" not in table.columns
    assert table.loc["output (W_O vs Bbar)", "batch_ceiling"] == pytest.approx(0.81)
    assert math.isnan(table.loc["attention (W vs Qbar)", "batch_ceiling"])  # none in this run
    assert math.isnan(table.loc["positional (P vs Delta)", "paper"])
    assert "| weight |" in markdown(table.reset_index())


@pytest.mark.parametrize("tag,values", [("table1", paper.TABLE1), ("table2", paper.TABLE2)])
def test_committed_toy_tables_come_from_their_runs_rows(tag, values):
    """results/toy/table{1,2}.csv are the min cosines and batch ceilings of the committed runs,
    whose ceiling rows were written before the rename (rows/noise_floor.parquet): the old files
    read under the new name."""
    run = ROOT / "results" / "toy" / "runs" / tag
    if not (run / "rows").is_dir():
        pytest.skip(f"no committed run at {run}")
    want = paper.min_cosines(read_results(run), values).set_index("weight")
    got = pd.read_csv(ROOT / "results" / "toy" / f"{tag}.csv").set_index("weight")
    assert "batch_ceiling" in got.columns and "noise_floor" not in got.columns
    assert want["batch_ceiling"].notna().all()
    for col in ("ours_min_cosine", "batch_ceiling"):
        assert got[col].to_numpy() == pytest.approx(want[col].to_numpy(), rel=1e-12), col
    assert (got["batch_ceiling"] > got["ours_min_cosine"]).all()  # every minimum below it


def test_old_runs_noise_floor_rows_read_as_batch_ceiling():
    df = pd.DataFrame({"metric": ["noise_floor_W_Qbar", "cos_W_Qbar", "loss"],
                       "analysis": ["toy_noise_floor", "toy_train", "toy_train"],
                       "value": [0.9, 0.8, 6.0]})
    up = paper.upgrade_names(df)
    assert up["metric"].tolist() == ["batch_ceiling_W_Qbar", "cos_W_Qbar", "loss"]
    assert up["analysis"].tolist() == ["toy_batch_ceiling", "toy_train", "toy_train"]
    assert df["metric"].iloc[0] == "noise_floor_W_Qbar"  # the input is not changed


def test_ablation_of_pure_leading_terms_gives_uniform_loss(scripts):
    seqs = torch.randint(0, 9, (6, 8), generator=torch.Generator().manual_seed(0))
    stats = reference_stats(seqs, 9)
    model = AttnOnlyTransformer(ToyConfig(9, 7, 1), dtype=torch.float64)
    with torch.no_grad():
        model.W_O.copy_(3.0 * stats["Bbar"])  # W_O is exactly its leading term, the rest is 0
    losses = scripts["toy_table3"].ablation_losses(model, seqs, stats)
    assert losses["output"] == pytest.approx(math.log(9), rel=1e-12)
    assert losses["original"] < losses["output"]
    assert losses["value layer 1"] == pytest.approx(losses["original"], rel=1e-12)
    torch.testing.assert_close(model.W_O, 3.0 * stats["Bbar"])  # restored afterwards


def test_figure5_top_tokens_skip_query_and_function_words(scripts):
    vocab = ["red", "ball", "the", "car", "dress"]
    row = torch.tensor([9.0, 5.0, 8.0, 4.0, 1.0])
    assert scripts["toy_figure5"].top_tokens(row, vocab, "red", {"the"}) == ["ball", "car",
                                                                               "dress"]


def test_paper_settings_are_valid_configs(scripts):
    from pythia_probe.toy.train import TrainConfig

    t1 = TrainConfig(**scripts["toy_table1"].PAPER)
    assert (t1.tokenizer, t1.seq_len, t1.n_seqs, t1.batch_size, t1.epochs, t1.lr) == (
        "word:3000", 200, 65536, 2048, 100, 0.005)
    assert t1.dataset == "roneneldan/TinyStories" and t1.layers == 3
