"""analyses/conventions_effect.py: a small case regenerated (each difference alone moves what it
should and nothing else), and the committed results/conventions/effect.md is what the committed
effect.csv holds, at the script's default settings."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--stories", "20", "--seq-len", "10", "--top-k", "25", "--tokenizer-ids", "270",
         "--model-ids", "280", "--words", "40", "--engine", "sparse"]


@pytest.fixture(scope="module")
def script(analyses_script):
    return analyses_script("conventions_effect")


def test_a_small_case(script, tmp_path):
    assert script.main([*SMALL, "--out", str(tmp_path), "--log-level", "warning"]) == 0
    table = pd.read_csv(tmp_path / "effect.csv")
    assert list(zip(table["difference"], table["vocabulary"].str[:3], strict=True)) == [
        (d, {"top": "top", "full": "ful", "word": "wor"}[v]) for d, v in script.ROWS]
    rows = {(r.difference, r.vocabulary): r for r in table.itertuples(index=False)}
    top = rows[("top_k", "top-25")]  # their ranking alone: other ids, the same numbers on both
    assert top.overlap < 1 and all(getattr(top, n) < 1e-12 for n in script.MATRICES)
    kept = rows[("compose", "top-25")]  # kept compositions: Bbar, Phibar are slices either way
    assert kept.Bbar == 0 and kept.Phibar == 0 and kept.overlap == 1
    assert min(kept.PhiBT, kept.Gbar, kept.Qbar, kept.QbarHead) > 0
    for diff in ("windows", "bos", "d_vocab", "authors"):
        assert min(getattr(rows[(diff, "full")], n) for n in script.MATRICES) > 0, diff
    assert rows[("d_vocab", "full")].overlap == 1
    flags = script.Flags(20, 10, 25, 270, 280, 40, str(tmp_path), "sparse")
    assert (tmp_path / "effect.md").read_text() == script.render(table, flags)


def test_the_committed_table_is_the_csv_at_the_default_settings(script):
    out = ROOT / script.Flags().out
    table = pd.read_csv(out / "effect.csv")
    assert (out / "effect.md").read_text() == script.render(table, script.Flags())
    assert len(table) == len(script.ROWS)
    assert asdict(script.Flags())["stories"] >= 1000  # the committed run's scale


@pytest.fixture(scope="module")
def orientations(analyses_script):
    return analyses_script("orientations")


def test_orientations_small_case_and_the_committed_table(orientations, tmp_path):
    """The two orientations' targets differ (their covariance cosine is below 1, a cosine), the
    same pair twice scores 1; the committed md is what the committed csv holds."""
    small = ["--stories", "20", "--seq-len", "10", "--top-k", "25", "--tokenizer-ids", "270",
             "--model-ids", "280"]
    assert orientations.main([*small, "--out", str(tmp_path), "--log-level", "warning"]) == 0
    table = pd.read_csv(tmp_path / "orientations.csv")
    assert len(table) == 2 * 2 * len(orientations.PAIRS)
    assert table["cosine"].between(-1, 1 - 1e-6).all()
    flags = orientations.Flags(20, 10, 25, 270, 280, str(tmp_path))
    assert (tmp_path / "orientations.md").read_text() == orientations.render(table, flags)
    out = ROOT / orientations.Flags().out
    committed = pd.read_csv(out / "orientations.csv")
    assert (out / "orientations.md").read_text() == orientations.render(committed,
                                                                         orientations.Flags())
