"""What a sweep writes besides its shards (issue 19 items 1 and 4): the revision ledger
(``OUT/revisions.parquet``, written before any weight is read, its status on every row, suspect
steps named in a warning), and at the end the summary (``OUT/summary.parquet``, printed) and
the paper's figures (``OUT/plots``, unless --no-plots)."""

import shutil

import pandas as pd
import pytest
import torch

from pythia_probe.hub.revisions import read_ledger
from pythia_probe.results import read_results
from pythia_probe.stats import batch_stats
from pythia_probe.summary import summary_table
from pythia_probe.sweep import execute
from pythia_probe.sweep.__main__ import main as sweep_main
from pythia_probe.testing.repos import build_pythia_like_repo, tiny_config

STEPS = (0, 1, 2, 4)
V = 90
SHARD1 = "model-00001-of-00002.safetensors"

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """step1 = step0 (duplicate); step2's first shard is the final model's (suspect, pythia#206)
    while its second differs; step4 is the final step (main = step4)."""
    root = tmp_path_factory.mktemp("report")
    layouts = {0: ("safetensors", 1), 2: ("safetensors", 2), 4: ("safetensors", 2)}
    repo = build_pythia_like_repo(root / "hub", "org/tiny", STEPS, tiny_config(), layouts)
    shutil.copyfile(repo / "main" / SHARD1, repo / "step2" / SHARD1)
    tokens = torch.randint(0, V, (40, 17), generator=torch.Generator().manual_seed(1))
    return root, repo, batch_stats(tokens, V).save(root / "stats.safetensors")


def _argv(repo, stats, out, *extra):
    return ["--model", str(repo), "--stats", str(stats), "--out", str(out), "--steps", "all",
            "--analyses", "embedding,attention", "--dtype", "float64", *extra]


def test_ledger_first_status_on_every_row_summary_and_figures_at_the_end(
        setup, tmp_path, monkeypatch, capsys):
    root, repo, stats = setup
    out = tmp_path / "o"
    seen = []
    real = execute.run_step

    def check_ledger_first(loaded, step, scorer, where):
        seen.append((out / "revisions.parquet").is_file())
        return real(loaded, step, scorer, where)

    monkeypatch.setattr(execute, "run_step", check_ledger_first)
    assert sweep_main(_argv(repo, stats, out)) == 0
    captured = capsys.readouterr()
    text = captured.out
    assert seen and all(seen)  # the ledger was on disk before the first step was scored
    ledger = read_ledger(out / "revisions.parquet")
    status = dict(zip(ledger["step"], ledger["status"], strict=True))
    assert status == {0: "ok", 1: "duplicate", 2: "suspect", 4: "ok"}
    assert set(ledger["model"]) == {"tiny"}
    df = read_results(out)
    assert {int(s): v for s, v in df.groupby("step")["revision_status"].unique().map(
        lambda v: list(v)).items()} == {s: [status[s]] for s in STEPS}
    warning = next(line for line in captured.err.splitlines() if "suspect" in line)
    assert "WARNING" in warning and "steps 2 are suspect" in warning and SHARD1 in warning
    assert "revisions of" in text and "2 ok, 1 duplicate, 1 suspect" in text
    # the summary: written and printed, computed from the table, flagged steps left out
    got = pd.read_parquet(out / "summary.parquet")
    pd.testing.assert_frame_equal(got, summary_table(df), check_dtype=False)
    assert set(got["excluded_steps"]) == {"1,2"}
    row = got[(got["metric"] == "cos_post") & (got["layer"] == 1)].iloc[0]
    assert f"{row.peak_value:.3f}" in text and "peak step" in text
    assert text.index("steps done") < text.index("peak step")
    figures = {p.name for p in (out / "plots").iterdir()}
    assert {"figure6.png", "figure7.png", "embedding_cos_post.png"} <= figures
    assert f"drew {len(figures)} figures into {out / 'plots'}" in text


def test_no_plots_draws_nothing_and_dry_run_writes_nothing(setup, tmp_path, capsys):
    root, repo, stats = setup
    assert sweep_main(_argv(repo, stats, tmp_path / "dry", "--dry-run")) == 0
    assert "1 suspect" in capsys.readouterr().out and not (tmp_path / "dry").exists()
    out = tmp_path / "np"
    assert sweep_main(_argv(repo, stats, out, "--no-plots", "--steps", "0,4")) == 0
    assert not (out / "plots").exists() and (out / "summary.parquet").is_file()
    assert list(read_ledger(out / "revisions.parquet")["status"]) == ["ok", "ok"]
