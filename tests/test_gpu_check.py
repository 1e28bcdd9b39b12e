"""The prepared GPU check runs at small size on the CPU, and flags a disagreeing device."""

import importlib
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def gpu_check():
    sys.path.insert(0, str(BENCH))
    try:
        yield importlib.import_module("gpu_check")
    finally:
        sys.path.remove(str(BENCH))


def test_small_check_runs_on_cpu_and_writes_one_table(gpu_check, tmp_path, capsys):
    out = tmp_path / "table.md"
    assert gpu_check.main(["--small", "--device", "cpu", "--out", str(out)]) == 0
    text = out.read_text()
    assert text.strip() == capsys.readouterr().out.strip()
    for check in ("kernels: Qbar", "statistics: d_vocab 2,000", "sweep step: seconds",
                  "factored step: seconds", "factored step vs dense targets"):
        assert check in text
    assert "| NO |" not in text


def test_a_device_that_disagrees_is_flagged(gpu_check, monkeypatch):
    real = gpu_check.batch_stats

    def off_by_one(tokens, V, device):
        st = real(tokens, V, device=device)
        if device != "cpu" or getattr(off_by_one, "calls", 0):
            st.store.qbar.vals *= 1 + 1e-6  # the factored statistics: Qbar's non-zeros
        off_by_one.calls = getattr(off_by_one, "calls", 0) + 1
        return st

    monkeypatch.setattr(gpu_check, "batch_stats", off_by_one)
    rows = gpu_check.check_kernels(gpu_check.SMALL, "cpu")
    bad = [r for r in rows if not r["ok"]]
    assert [r["check"] for r in bad] == ["kernels: Qbar max rel. difference"]
