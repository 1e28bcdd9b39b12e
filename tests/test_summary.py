"""The summary's peaks, exits and intervals on constructed tables whose answers are known by
hand, and its definitions checked directly on random curves."""

import os

import numpy as np
import pandas as pd
import pytest

from pythia_probe import summary
from pythia_probe.results import NOT_SHARDS, make_rows, write_shard

STEPS = [0, 1, 2, 4, 8, 16, 32]
CURVE = [0.1, 0.2, 0.6, 0.9, 0.5, 0.3, 0.2]  # peak 0.9 at step 4


def curve(values=CURVE, steps=STEPS, layer=1, head=None, model="m", metric="cos_post"):
    return make_rows([{"step": s, "analysis": "embedding", "layer": layer, "head": head,
                       "metric": metric, "value": v} for s, v in zip(steps, values, strict=True)],
                     model=model, stats_id="s")


def one(df) -> pd.Series:
    out = summary.summary_table(df)
    assert len(out) == 1
    return out.iloc[0]


def test_without_chance_the_exit_is_half_the_peak():
    r = one(curve())
    assert (r.peak_step, r.peak_value, r.peak_chance) == (4, 0.9, 0.0)
    assert r.exit_step == 16 and r.exit_value == 0.3  # step 8 (0.5) is still >= 0.45
    assert not r.censored and r.peak_above_chance
    assert r.chance_source == "assumed 0: no chance in the table"
    assert r.interval == summary.NO_INTERVAL and pd.isna(r.peak_step_low)
    assert (r.first_step, r.last_step, r.steps) == (0, 32, 7)


def test_chance_moves_the_exit():
    df = curve().assign(chance=0.2)
    r = one(df)
    assert r.half_above == pytest.approx(0.35) and r.exit_step == 8  # 0.5 - 0.2 < 0.35
    assert r.chance_source == "table"
    mixed = df.copy()
    mixed.loc[mixed["step"] == 0, "chance"] = np.nan
    assert one(mixed).chance_source == "table, 0 where missing"


def test_censored_when_it_never_falls_and_ties_take_the_earliest_step():
    rising = one(curve([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]))
    assert rising.peak_step == 32 and rising.censored and pd.isna(rising.exit_step)
    plateau = one(curve([0.1, 0.9, 0.9, 0.8, 0.7, 0.6, 0.5]))
    assert plateau.peak_step == 1 and plateau.censored  # 0.5 >= 0.45: never below half
    assert summary.format_summary(summary.summary_table(curve([0.1, 0.9, 0.9, 0.8, 0.7, 0.6,
                                                               0.5]))).count("> 32 (censored)")


def test_intervals_from_ci_columns():
    df = curve()
    narrow = one(df.assign(ci_low=df["value"] - 0.05, ci_high=df["value"] + 0.05))
    assert (narrow.peak_step_low, narrow.peak_step_high) == (4, 4)
    wide = one(df.assign(ci_low=df["value"] - 0.2, ci_high=df["value"] + 0.2))
    # peak [0.7, 1.1] overlaps the intervals of 0.6 (step 2) and 0.5 (step 8), not 0.3
    assert (wide.peak_step_low, wide.peak_step_high) == (2, 8)
    # half level 0.45: lower end 0.5 - 0.2 below it at step 8, upper end 0.2 + 0.2 at step 32
    assert (wide.exit_step_low, wide.exit_step, wide.exit_step_high) == (8, 16, 32)
    assert wide.interval == summary.INTERVAL
    assert "16 [8-32]" in summary.format_summary(summary.summary_table(
        df.assign(ci_low=df["value"] - 0.2, ci_high=df["value"] + 0.2)))


def test_peak_not_above_chance_has_no_exit():
    r = one(curve().assign(chance=0.95))
    assert not r.peak_above_chance and pd.isna(r.exit_step) and pd.isna(r.censored)
    df = curve()  # value above chance but its interval reaches it: not above chance either
    r = one(df.assign(chance=0.85, ci_low=df["value"] - 0.1, ci_high=df["value"] + 0.1))
    assert not r.peak_above_chance
    assert "peak not above chance" in summary.format_summary(summary.summary_table(
        curve().assign(chance=0.95)))


def test_suspect_and_duplicate_steps_are_left_out():
    df = curve([0.1, 0.2, 0.6, 0.9, 0.99, 0.3, 0.2]).assign(revision_status="ok")
    df.loc[df["step"] == 8, "revision_status"] = "suspect"  # would be the peak
    df.loc[df["step"] == 1, "revision_status"] = "duplicate"
    r = one(df)
    assert r.peak_step == 4 and r.exit_step == 16 and r.excluded_steps == "1,8"
    assert r.steps == 5
    assert one(curve()).excluded_steps == ""


def test_one_row_per_model_layer_and_head_layers_numbered_from_1():
    df = pd.concat([curve(layer=0), curve(layer=1, metric="cos_attn"),
                    curve(layer=1, head=3, metric="cos_head"),
                    curve([0.5, 0.9, 0.4, 0.1, 0.1, 0.1, 0.1], model="m2", layer=2),
                    make_rows([{"step": s, "analysis": "unembedding", "layer": None,
                                "metric": "cos_WU_Bbar", "value": v}
                               for s, v in zip(STEPS, CURVE, strict=True)], model="m")])
    out = summary.summary_table(df)
    got = {(r.model, r.metric, None if pd.isna(r.layer) else int(r.layer),
            None if pd.isna(r.head) else int(r.head)): int(r.peak_step)
           for r in out.itertuples()}
    # model m held a layer 0, so its layers are shifted to the paper's numbering; m2 is not
    assert got == {("m", "cos_post", 1, None): 4, ("m", "cos_attn", 2, None): 4,
                   ("m", "cos_head", 2, 3): 4, ("m", "cos_WU_Bbar", None, None): 4,
                   ("m2", "cos_post", 2, None): 1}
    text = summary.format_summary(out)
    assert "(1 per-head rows in summary.parquet; --heads prints them)" in text
    assert "m2 embedding cos_post" in text and "cos_head" not in text
    assert "cos_head" in summary.format_summary(out, heads=True)


@pytest.mark.parametrize("seed", range(20))
def test_definitions_hold_on_random_curves(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 15))
    steps = np.sort(rng.choice(1000, n, replace=False))
    value, chance = rng.random(n), rng.random(n) * 0.3
    half = rng.random(n) * 0.1
    r = summary.cell_summary(steps, value, chance, (value - half, value + half))
    above = value - chance
    i = list(steps).index(r["peak_step"])
    assert above[i] == above.max() and np.all(above[:i] < above[i])  # earliest maximum
    if not r["peak_above_chance"]:
        assert r["exit_step"] is None and r["censored"] is None
        return
    after = above[i + 1:]
    below = np.nonzero(after < above[i] / 2)[0]
    if r["censored"]:
        assert below.size == 0 and r["exit_step"] is None
    else:
        j = i + 1 + below[0]
        assert r["exit_step"] == steps[j] and np.all(above[i + 1:j] >= above[i] / 2)
        lo, hi = r["exit_step_low"], r["exit_step_high"]
        assert lo <= r["exit_step"] and (hi is None or r["exit_step"] <= hi)
    assert r["peak_step_low"] <= r["peak_step"] <= r["peak_step_high"]


def test_report_writes_summary_parquet_through_fileio(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    outside = tmp_path / "elsewhere.parquet"
    outside.write_bytes(b"keep")
    (out / summary.SUMMARY).symlink_to(outside)
    old = os.umask(0o027)
    try:
        text = summary.report(curve().assign(chance=0.25), out)
    finally:
        os.umask(old)
    path = out / summary.SUMMARY
    assert outside.read_bytes() == b"keep" and not path.is_symlink()
    assert path.stat().st_mode & 0o777 == 0o640
    back = pd.read_parquet(path)
    assert list(back["peak_step"]) == [4] and list(back["exit_step"]) == [8]
    assert "0.900" in text and "0.250" in text and f"wrote {path}" in text


def test_cli_prints_and_writes(tmp_path, capsys):
    df = pd.concat([curve(), curve(layer=2, metric="cos_post",
                                   values=[0.1, 0.1, 0.1, 0.2, 0.4, 0.8, 0.7])])
    for s in STEPS:
        write_shard(df[df["step"] == s], tmp_path / "run" / "shards" / f"step{s}.parquet")
    for _ in range(2):  # the summary beside the shards is not read back as result rows
        assert summary.main(["--results", str(tmp_path / "run")]) == 0
    text = capsys.readouterr().out
    assert ("m embedding cos_post (scale: value - chance (no ceiling); chance: assumed 0: no "
            "chance in the table; no intervals; above chance: older table without intervals: "
            "the value above chance)") in text
    assert "16 [alike]" not in text and "> 32 (censored)" in text
    back = pd.read_parquet(tmp_path / "run" / summary.SUMMARY)
    assert list(back["peak_step"]) == [4, 16] and list(back["censored"]) == [False, True]
    assert summary.SUMMARY in NOT_SHARDS


# -- the effect scale (issue 26): 0 = chance, 1 = ceiling --------------------------------------
#         steps   0     1     2     4     8     16    32
EVALUE = [0.10, 0.30, 0.80, 0.70, 0.45, 0.30, 0.15]
ECHANCE = [0.10, 0.10, 0.60, 0.55, 0.10, 0.10, 0.10]
# effect  0     .222  .500  .333  .389  .222  .056   -> peak step 2, exit 16
# v - c   0     .20   .20   .15   .35   .20   .05    -> peak step 8, exit 32


def scaled(ceiling=1.0, half=None):
    df = curve(EVALUE).assign(chance=ECHANCE, ceiling=ceiling)
    if half is not None:
        df = df.assign(ci_low=df["value"] - half, ci_high=df["value"] + half)
    return df


def test_peak_and_exit_on_the_effect_where_the_table_has_a_ceiling():
    r = one(scaled())
    assert r.scale == "effect" and (r.peak_step, r.exit_step) == (2, 16)
    assert (r.peak_value, r.peak_chance) == (0.8, 0.6)
    assert r.peak_effect == pytest.approx(0.5) and r.half_above == pytest.approx(0.25)
    # the same curve without a ceiling: judged on value - chance, another peak and exit
    r = one(scaled(ceiling=np.nan))
    assert r.scale == "value - chance" and (r.peak_step, r.exit_step) == (8, 32)
    assert np.isnan(r.peak_effect) and r.half_above == pytest.approx(0.175)


def test_intervals_are_mapped_to_the_effect_as_the_value_is():
    r = one(scaled(half=0.05))
    # effect intervals: step 2 [.375, .625] overlaps steps 4 [.222, .444] and 8 [.333, .444]
    assert (r.peak_step_low, r.peak_step_high) == (2, 8)
    # half level .25: step 4's lower end is below it, the upper end first at step 32 (.167)
    assert (r.exit_step_low, r.exit_step, r.exit_step_high) == (4, 16, 32)
    text = summary.format_summary(summary.summary_table(scaled(half=0.05)))
    assert "scale: effect, 0 = chance, 1 = ceiling" in text and "16 [4-32]" in text
    header, row = text.splitlines()[5:7]
    assert header.split()[4:7] == ["peak", "chance", "effect"]
    assert row.split()[3:6] == ["0.800", "0.600", "0.500"]


def test_the_tables_effect_and_above_chance_columns_are_read():
    df = scaled().assign(effect=[0.0, 0.1, 0.2, 0.9, 0.3, 0.1, 0.0])
    assert one(df).peak_step == 4  # the column, not (value - chance) / (ceiling - chance)
    flagged = scaled(half=0.05).assign(above_chance=[False, True, False, True, True, True,
                                                     False])
    r = one(flagged)  # the peak (step 2) is not flagged: no exit, whatever its interval says
    assert r.peak_step == 2 and not r.peak_above_chance and pd.isna(r.exit_step)
    assert r.above_chance_rule == summary.ABOVE_RULES["table"]
    assert one(scaled(half=0.05)).above_chance_rule == summary.ABOVE_RULES["interval"]
    assert one(scaled(half=0.05)).peak_above_chance  # older table: ci_low .75 > chance .6


def test_mixed_scales_are_each_said():
    df = pd.concat([scaled(), scaled(ceiling=np.nan).assign(layer=2)])
    out = summary.summary_table(df)
    assert list(out["scale"]) == ["effect", "value - chance"]
    text = summary.format_summary(out)
    assert ("scale: effect, 0 = chance, 1 = ceiling and scale: value - chance (no ceiling)"
            in text)


def reference(steps, value, chance, ceiling, low, high):
    """The definitions in plain float64 loops: peak, exit and intervals on the effect."""
    n = len(steps)
    eff = [(value[k] - chance[k]) / (ceiling[k] - chance[k]) for k in range(n)]
    lo = [(low[k] - chance[k]) / (ceiling[k] - chance[k]) for k in range(n)]
    hi = [(high[k] - chance[k]) / (ceiling[k] - chance[k]) for k in range(n)]
    i = 0
    for k in range(n):
        if eff[k] > eff[i]:
            i = k
    out = {"peak_step": steps[i], "peak_effect": eff[i]}
    alike = [steps[k] for k in range(n) if lo[k] <= hi[i] and hi[k] >= lo[i]]
    out["peak_step_low"], out["peak_step_high"] = min(alike), max(alike)
    out["peak_above_chance"] = lo[i] > 0
    if not out["peak_above_chance"]:
        return out

    def first(xs):
        return next((steps[k] for k in range(i + 1, n) if xs[k] < eff[i] / 2), None)

    out["exit_step"], out["exit_step_low"], out["exit_step_high"] = first(eff), first(lo), \
        first(hi)
    out["censored"] = out["exit_step"] is None
    return out


@pytest.mark.parametrize("seed", range(20))
def test_effect_summary_equals_the_reference_on_random_curves(seed):
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(2, 15))
    steps = np.sort(rng.choice(1000, n, replace=False))
    chance = rng.random(n) * 0.5
    ceiling = chance + 0.05 + rng.random(n) * 0.5
    top = 1.2 if seed % 4 else 0.08  # every fourth curve barely above chance
    value = chance + (ceiling - chance) * rng.uniform(-0.3, top, n)
    half = rng.random(n) * 0.05
    got = summary.cell_summary(steps, value, chance, (value - half, value + half), ceiling)
    want = reference(list(steps), value, chance, ceiling, value - half, value + half)
    assert got["scale"] == "effect"
    for key, v in want.items():
        assert got[key] == pytest.approx(v), key
    if not want["peak_above_chance"]:
        assert got["exit_step"] is None and got["censored"] is None
