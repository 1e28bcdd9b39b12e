"""analyses/toy_table2.py and analyses/toy_figure4.py run end to end at tiny CPU settings."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import pandas as pd
import pytest

from pythia_probe.results import read_manifest, read_results

ANALYSES = Path(__file__).resolve().parents[1] / "analyses"
TINY = dict(stories=300, seq_len=32, n_seqs=64, batch_size=32)  # ~0.5-1.5 s per run


@pytest.fixture(scope="module")
def scripts():
    sys.path.insert(0, str(ANALYSES))
    try:
        yield {n: importlib.import_module(n) for n in ("toy_table2", "toy_figure4")}
    finally:
        sys.path.remove(str(ANALYSES))


def test_table2_min_cosines_beside_paper(scripts, tmp_path, monkeypatch, capsys):
    t2 = scripts["toy_table2"]
    monkeypatch.setattr(t2, "CPU", {**t2.CPU, **TINY, "tokenizer": "bpe:300", "epochs": 2,
                                    "log_every": 1})
    run_dir, out = tmp_path / "run", tmp_path / "out"
    assert t2.main(["--run-dir", str(run_dir), "--results", str(out)]) == 0
    df = read_results(run_dir)  # validates every shard
    cfg = read_manifest(run_dir)["config"]
    assert cfg["tokenizer"] == "bpe:300" and cfg["d_vocab"] <= 300
    table = pd.read_csv(out / "table2.csv").set_index("weight")
    assert table["ours_min_cosine"].abs().max() <= 1 + 1e-9
    for metric, paper in t2.PAPER_TABLE2.items():
        row = table[table.index.str.contains({"cos_W_Qbar": "attention", "cos_V_PhiBT": "value",
                                              "cos_W_O_Bbar": "output"}[metric])].iloc[0]
        assert row["paper"] == pytest.approx(paper)
        assert row["ours_min_cosine"] == pytest.approx(df[df["metric"] == metric]["value"].min())
    assert pd.isna(table.loc["positional (P vs Delta)", "paper"])
    md = (out / "table2.md").read_text()
    assert md.startswith("# Table 2 (BPE tokenizer)") and "| 0.999914 |" in md
    ceiling = df[df["analysis"] == "toy_batch_ceiling"].set_index("metric")["value"]
    out_row = table.loc["output (W_O vs Bbar)"]
    assert out_row["batch_ceiling"] == pytest.approx(ceiling["batch_ceiling_W_O_Bbar"])
    assert 0 < out_row["batch_ceiling"] < 1  # the first batch is not the whole training set
    assert (run_dir / "rows" / "batch_ceiling.parquet").exists()
    assert not (run_dir / "rows" / "noise_floor.parquet").exists()
    printed = capsys.readouterr().out
    assert "tokenizer=bpe" in printed and "0.999914" in printed
    first, last = map(float, re.search(r"training loss \(interval means\): (\d+\.\d+) -> "
                                       r"(\d+\.\d+)", printed).groups())
    loss = df[df["metric"] == "loss"].sort_values("step")["value"]
    assert first == pytest.approx(loss.iloc[0], abs=1e-4) and last < first
    assert "batch_ceiling: cosine of the first-batch" in md and "noise" not in md
    assert "tokenizer bpe:300 (paper bpe:10000)" in printed
    assert (out / "table2.png").stat().st_size > 0


def test_figure4_curves_and_printed_comparison(scripts, tmp_path, monkeypatch, capsys):
    f4 = scripts["toy_figure4"]
    monkeypatch.setattr(f4, "CPU", {**f4.CPU, **TINY, "epochs": 4, "log_every": 1})
    run_dir, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    assert f4.main(["--run-dir", str(run_dir), "--results", str(out)]) == 0
    curves = pd.read_csv(out / "figure4.csv")
    assert set(curves["metric"]) == {*f4.CURVES, "loss"}
    cos = curves[curves["metric"].isin(f4.CURVES)]
    assert cos[["min", "max", "mean"]].abs().max().max() <= 1 + 1e-9  # float rounding at 1
    assert ((cos["min"] <= cos["mean"] + 1e-12) & (cos["mean"] <= cos["max"] + 1e-12)).all()
    assert curves["epoch"].max() == 4 and (curves["epoch"] > 0).all()
    assert cos[cos["metric"] != "cos_P_Delta"]["epoch"].min() == 0.5  # logged every step
    loss = curves[curves["metric"] == "loss"].sort_values("epoch")["mean"]
    assert (loss > 0).all()
    printed = capsys.readouterr().out
    first, last = map(float, re.search(r"ours (\d+\.\d+) -> (\d+\.\d+)", printed).groups())
    assert first == pytest.approx(loss.iloc[0], abs=5e-4)
    assert last == pytest.approx(loss.iloc[-1], abs=5e-4)
    assert "(paper: 8.00 -> 5.35 at |V| = 3000)" in printed
    end = re.search(r"at the end: +ours (\d+\.\d+) +\(paper: > 0.7", printed)
    final = cos[(cos["epoch"] == 4) & cos["metric"].isin(["cos_W_Qbar", "cos_V_PhiBT",
                                                          "cos_W_O_Bbar"])]["min"].min()
    assert float(end.group(1)) == pytest.approx(final, abs=5e-5)
    assert (out / "figure4.png").stat().st_size > 0
