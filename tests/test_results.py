"""The tidy results table: schema, atomic shards, manifest."""

import json
import os

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pythia_probe import results
from pythia_probe.results import ResultsError


def _rows():
    return results.make_rows(
        [{"layer": l, "metric": "cosine", "value": 0.5 + l / 10} for l in range(3)],
        model="m", step=4, analysis="embedding", run_id="r1")


def test_make_rows_fills_schema():
    df = _rows()
    assert list(df.columns) == results.COLUMNS
    assert df["head"].isna().all() and (df["code_version"] == results.CODE_VERSION).all()
    assert df["layer"].tolist() == [0, 1, 2]


def test_write_read_roundtrip(tmp_path):
    df = _rows()
    p = results.write_shard(df, tmp_path / "step4.parquet")
    back = results.read_shard(p)
    pd.testing.assert_frame_equal(back, df)
    assert len(results.read_results(tmp_path)) == 3


def test_validate_rejects_bad_tables():
    df = _rows()
    with pytest.raises(ResultsError, match="missing"):
        results.validate(df.drop(columns=["metric"]))
    bad = df.copy()
    bad.loc[0, "model"] = None
    with pytest.raises(ResultsError, match="'model' must not be null"):
        results.validate(bad)
    neg = df.copy()
    neg.loc[0, "step"] = -1
    with pytest.raises(ResultsError, match="negative"):
        results.validate(neg)


def test_interrupted_write_leaves_no_shard(tmp_path, monkeypatch):
    def boom(table, where, **kw):
        with open(where, "wb") as f:
            f.write(b"PAR1 partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(pq, "write_table", boom)
    with pytest.raises(KeyboardInterrupt):
        results.write_shard(_rows(), tmp_path / "step4.parquet")
    assert os.listdir(tmp_path) == []


def test_unreadable_shard_is_a_clear_error(tmp_path):
    p = tmp_path / "x.parquet"
    p.write_bytes(b"not parquet")
    with pytest.raises(ResultsError, match="cannot read results shard"):
        results.read_shard(p)
    with pytest.raises(ResultsError, match="no \\*.parquet"):
        results.read_results(tmp_path / "empty")


def test_read_shard_validates_foreign_parquet(tmp_path):
    p = tmp_path / "foreign.parquet"
    pq.write_table(pa.table({"a": [1]}), p)
    with pytest.raises(ResultsError, match="missing"):
        results.read_shard(p)


def test_manifest(tmp_path):
    path = results.write_manifest(tmp_path, {"lr": 0.1, "out": tmp_path}, argv=["x", "--lr"],
                                  run_id="r1", extra={"steps": [1, 2]})
    m = results.read_manifest(tmp_path)
    assert m["argv"] == ["x", "--lr"] and m["config"]["lr"] == 0.1
    assert m["config"]["out"] == str(tmp_path) and m["steps"] == [1, 2]
    assert m["packages"]["torch"].startswith("2.") and m["started"] <= m["ended"]
    assert "git_sha" in m and m["python"].count(".") == 2
    assert json.loads(path.read_text())["run_id"] == "r1"
    with pytest.raises(ResultsError, match="no manifest.json"):
        results.read_manifest(tmp_path / "nope")
