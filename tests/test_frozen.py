"""Today's sweep equals the frozen outputs (issue 27: the consolidation changes no number).

tests/data/frozen/<case>.csv were written by tests/data/make_frozen.py before the consolidation
(commit named in tests/data/frozen/README.md): a loopback hub with a Pythia-shaped model, the
paper's recipe on a small OpenWebText, the sweep's defaults at top-200 (paper and authors
conventions) and at the full vocabulary (tests/data/frozen_inputs.py). Here each case is rerun.

Promise: the same cells; stats_id, n, revision_status and above_chance exactly; every float
column within 1e-6 (the cosines are accumulated in float32: 2^-24 x a few hundred terms; a
changed code path may round differently, an unchanged one matches bit for bit, which the test
reports), effect within 1e-5 (a ratio whose denominator is >= 0.9 here)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from data.frozen_inputs import CASES, FLOATS, KEY, build_hub, run_case

FROZEN = Path(__file__).parent / "data" / "frozen"
ATOL = {c: 1e-6 for c in FLOATS} | {"effect": 1e-5}
#: top-k statistics: the frozen values came from the dense float32 targets whose norms were
#: accumulated in float32 (issue 27 item 3 computes them in float64): against the same case in
#: float64 they erred by up to 1.6e-6 (value) and 2.9e-6 (ci_low), today's by 1.8e-7 and 7.4e-7
TOP_K_ATOL = 1e-5
EXACT = ["above_chance", "n", "stats_id", "revision_status"]

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


def _cells(column: pd.Series) -> list:
    """A column's cells comparable across parquet and csv: missing as None, numbers as float."""
    return [None if pd.isna(v) else float(v) if isinstance(v, (int, float, np.number))
            and not isinstance(v, bool) else v for v in column.astype(object)]


@pytest.fixture(scope="module")
def hub_root(tmp_path_factory):
    return build_hub(tmp_path_factory.mktemp("frozen-hub"))


@pytest.mark.parametrize("case", list(CASES))
def test_sweep_equals_frozen_outputs(case, hub_root, tmp_path):
    old = pd.read_csv(FROZEN / f"{case}.csv", dtype={"stats_id": str})
    new = run_case(case, hub_root, tmp_path)
    assert len(new) == len(old)
    for column in KEY:
        assert _cells(new[column]) == _cells(old[column]), column
    for column in EXACT:
        assert _cells(new[column]) == _cells(old[column]), column
    for column in FLOATS:
        a, b = new[column].to_numpy(float), old[column].to_numpy(float)
        assert (np.isnan(a) == np.isnan(b)).all(), column
        worst = np.nanmax(np.abs(a - b), initial=0.0)
        atol = TOP_K_ATOL if "--top-k" in CASES[case] else ATOL[column]
        assert worst <= atol, f"{case} {column}: differs by {worst:.3g}"
