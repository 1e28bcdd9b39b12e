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


def test_scale_and_revision_columns_are_nullable_floats_and_old_shards_read_null(tmp_path):
    """chance, ceiling, ci_low, ci_high (float64) and revision_status (string): null until
    computed; a shard written before they existed reads with them null."""
    df = _rows()
    for col in ("chance", "ceiling", "ci_low", "ci_high", "revision_status"):
        assert col in results.COLUMNS and df[col].isna().all()
    assert results.ARROW_SCHEMA.field("ci_low").type == pa.float64()
    assert results.ARROW_SCHEMA.field("revision_status").type == pa.string()
    filled = df.assign(chance=0.01, ceiling=0.9, ci_low=df["value"] - 0.1,
                       ci_high=df["value"] + 0.1, revision_status="ok")
    back = results.read_shard(results.write_shard(filled, tmp_path / "new.parquet"))
    pd.testing.assert_frame_equal(back, results.validate(results._coerce(filled)))
    old = pa.Table.from_pandas(df.drop(columns=list(results.LATER_COLUMNS)),
                               preserve_index=False)
    pq.write_table(old, tmp_path / "old.parquet")
    read = results.read_shard(tmp_path / "old.parquet")
    assert read[list(results.LATER_COLUMNS)].isna().all().all()
    assert read["value"].tolist() == df["value"].tolist()
    with pytest.raises(ResultsError, match="ci_low > ci_high"):
        results.validate(filled.assign(ci_low=1.0, ci_high=0.0))


@pytest.mark.parametrize("text,says", [
    ("[1, 2]", "a JSON list, not an object"), ('{"config": 3}', "'config' is not an object"),
    ('{"run_id": 7}', "'run_id' is not a string"), ("{", "not valid JSON"),
    ("[" * 100_000 + "]" * 100_000, "not valid JSON"),
])
def test_a_manifest_of_the_wrong_shape_is_one_error_naming_the_file(tmp_path, text, says):
    (tmp_path / "manifest.json").write_text(text)
    with pytest.raises(ResultsError, match=says) as err:
        results.read_manifest(tmp_path)
    assert str(tmp_path / "manifest.json") in str(err.value)


def test_the_scale_of_issue_26_round_trips_and_is_checked(tmp_path):
    """chance_sd, ceiling_half, effect (float64) and above_chance (nullable bool): written
    and read back as they were; a negative chance_sd, an infinite effect or an above_chance
    that is not a bool is one error naming the column."""
    df = _rows().assign(chance=0.1, chance_sd=[0.01, 0.0, None], ceiling=0.9,
                        ceiling_half=0.8, effect=[0.5, -0.2, float("nan")],
                        above_chance=[True, False, None])
    assert results.ARROW_SCHEMA.field("above_chance").type == pa.bool_()
    p = results.write_shard(df, tmp_path / "s.parquet")
    assert pq.read_table(p).schema.field("above_chance").type == pa.bool_()
    back = results.read_shard(p)
    assert back["above_chance"].tolist()[:2] == [True, False] and back["above_chance"].isna()[2]
    assert back["effect"].tolist()[:2] == [0.5, -0.2] and back["chance_sd"].tolist()[0] == 0.01
    with pytest.raises(ResultsError, match="'chance_sd' has negative"):
        results.write_shard(df.assign(chance_sd=-0.1), tmp_path / "x.parquet")
    with pytest.raises(ResultsError, match="infinite effect"):
        results.write_shard(df.assign(effect=float("inf")), tmp_path / "x.parquet")
    with pytest.raises(ResultsError, match="'above_chance' holds 'yes'"):
        results.make_rows([{"metric": "m", "value": 0.1, "above_chance": "yes"}],
                          model="m", analysis="a")
    assert not (tmp_path / "x.parquet").exists()
