"""The IC-recall reproduction scripts (analyses/icrecall_*.py) at tiny settings, and the verdict
rules of analyses/icrecall_summary.py on hand-made tables."""

from __future__ import annotations

import importlib
import math
import os
import sys
from pathlib import Path

import pandas as pd
import pytest

from pythia_probe.results import make_rows, read_manifest, read_shard, validate, write_manifest
from pythia_probe.toy.icrecall.experiment import metric_rows
from pythia_probe.toy.icrecall.report import key, save, wide
from pythia_probe.toy.icrecall.task import TaskConfig, make_kb, sample_prompts

ANALYSES = Path(__file__).resolve().parents[1] / "analyses"
NAMES = ("icrecall_main", "icrecall_dynamics", "icrecall_kpairs", "icrecall_samples",
         "icrecall_pretrained", "icrecall_design", "icrecall_summary")
ATTN = ["attn_s1", "attn_a1", "attn_s2", "attn_a2", "attn_s_query", "attn_last"]
PROBS = ["relation_acc", "relation_acc_confusing", "answer_acc", "relation_prob",
         "relation_prob_confusing", "pair_gap_max", "offpair_mass"]
TINY = {  # script -> argv that runs in ~1-2 s
    "icrecall_main": ["--seeds", "1", "--n-test", "200", "--methods", "pgd"],
    "icrecall_dynamics": ["--seeds", "1", "--steps", "40", "--n-test", "200"],
    "icrecall_kpairs": ["--ks", "3", "--seeds", "1", "--n-test", "200", "--d-model", "256",
                        "--n-train", "4"],
    "icrecall_samples": ["--ns", "200,400", "--Ns", "2,4", "--seeds", "1", "--steps", "20",
                         "--n-test", "100"],
    "icrecall_pretrained": ["--d-model", "32", "--d-hidden", "64", "--epochs", "2", "--seeds",
                            "1", "--methods", "pgd", "--n-test", "200"],
    "icrecall_design": ["--seeds", "1", "--steps", "20", "--n-test", "100"],
}


@pytest.fixture(scope="module")
def scripts():
    sys.path.insert(0, str(ANALYSES))
    try:
        yield {n: importlib.import_module(n) for n in NAMES}
    finally:
        sys.path.remove(str(ANALYSES))


@pytest.fixture(scope="module")
def runs(scripts, tmp_path_factory):
    """Every script run once at TINY settings; they write to ./results/icrecall, so run in tmp."""
    root, cwd, printed = tmp_path_factory.mktemp("icrecall"), os.getcwd(), {}
    os.chdir(root)
    try:
        for name, argv in TINY.items():
            assert scripts[name].main(argv) == 0
        printed["summary_rc"] = scripts["icrecall_summary"].main([])
    finally:
        os.chdir(cwd)
    return root / "results" / "icrecall"


def _table(out: Path, name: str, analysis: str) -> pd.DataFrame:
    df = read_shard(out / f"{name}.parquet")
    validate(df)
    assert set(df["model"]) == {"icrecall"}
    return wide(df[df["analysis"] == analysis])


def _check_outcomes(w: pd.DataFrame, attn: list[str] = ATTN) -> None:
    assert len(w) >= 1
    for m in PROBS:
        assert w[m].between(0, 1).all(), m
    assert (w[attn].sum(axis=1) - 1).abs().max() < 1e-4  # the relation-step row is a softmax
    assert (w["n_all"] > 0).all() and (w["n_confusing"] <= w["n_all"]).all()


def test_main_writes_outcomes_pattern_and_manifest(runs):
    w = _table(runs, "main", "icrecall_main")
    assert list(w["method"]) == ["pgd"] and list(w["seed"]) == ["0"]
    _check_outcomes(w)
    assert int(w["n_all"].iloc[0]) == 200
    assert (runs / "pattern.png").stat().st_size > 0
    assert read_manifest(runs / "manifest_main")["config"]["n_test"] == 200


def test_dynamics_history_summary_and_saddle_check(runs):
    df = read_shard(runs / "dynamics.parquet")
    hist = df[df["analysis"] == "icrecall_dynamics"]
    assert set(hist["run_id"]) == {key(method="gd", seed=0), key(method="pgd", seed=0)}
    loss = hist[(hist["metric"] == "loss") & hist["step"].notna()]
    assert (loss["value"] >= 0).all() and loss["step"].max() <= 40
    s = _table(runs, "dynamics", "icrecall_dynamics_summary")
    _check_outcomes(s)
    assert (s["check_grad_norm"] >= 0).all() and (s["check_path_barrier"] >= 0).all()
    esc = s["escape_step"].dropna()
    assert esc.between(0, 40).all()
    snap = [f"snapshot_end_{a}" for a in ATTN]
    end = wide(hist).set_index("method")[snap].sum(axis=1)
    assert (end - 1).abs().max() < 1e-4
    level = df[df["metric"] == "escape_level"]["value"]
    assert list(level) == [0.95]


def test_kpairs_rows_cover_k_pairs(runs):
    w = _table(runs, "kpairs", "icrecall_kpairs")
    assert list(w["k"]) == ["3"]
    _check_outcomes(w, ATTN[:4] + ["attn_s3", "attn_a3", "attn_s_query", "attn_last"])
    lo, hi = w["pair_mass_min"].iloc[0], w["pair_mass_max"].iloc[0]
    assert 0 <= lo <= hi <= 1


def test_samples_smallest_N_is_one_of_the_Ns_and_consistent(runs, scripts):
    df = read_shard(runs / "samples.parquet")
    w = wide(df[df["analysis"] == "icrecall_samples"])
    assert sorted({(int(n), int(N)) for n, N in zip(w["n"], w["N"], strict=True)}) == [
        (200, 2), (200, 4), (400, 2), (400, 4)]
    _check_outcomes(w)
    best = wide(df[df["analysis"] == "icrecall_samples_smallest_N"])
    assert sorted(best["n"].astype(int)) == [200, 400]
    w[["n", "N", "seed"]] = w[["n", "N", "seed"]].astype(int)
    expect = scripts["icrecall_samples"].smallest_N(w, 0.99)
    for n, v in zip(best["n"].astype(int), best.get("smallest_N_at_target"), strict=True):
        assert (math.isnan(v) and math.isnan(expect[(n, 0)])) or v == expect[(n, 0)]
        assert math.isnan(v) or v in (2, 4)


def test_smallest_N_needs_every_larger_N(scripts):
    w = pd.DataFrame({"n": [10] * 4 + [20] * 2, "seed": [0] * 6, "N": [1, 2, 4, 8, 1, 2],
                      "relation_acc": [1.0, 0.5, 0.995, 1.0, 0.2, 0.3]})
    got = scripts["icrecall_samples"].smallest_N(w, 0.99)
    assert got[(10, 0)] == 4 and math.isnan(got[(20, 0)])


def test_escape_step_is_first_step_that_stays_above(scripts):
    h = [{"step": s, "relation_prob_confusing": p} for s, p in
         [(0, 0.5), (10, 0.97), (20, 0.9), (30, 0.96), (40, 0.99)]]
    assert scripts["icrecall_dynamics"].first_step_at(h, "relation_prob_confusing", 0.95) == 30
    assert scripts["icrecall_design"]._escape(h, 0.95) == 30
    assert math.isnan(scripts["icrecall_design"]._escape(h, 0.995))


def test_pretrained_records_memory_recall(runs):
    df = read_shard(runs / "pretrained.parquet")
    mem = df[df["analysis"] == "icrecall_pretrained_memory"].set_index("metric")["value"]
    assert 0 <= mem["memory_answer_recall"] <= 1 and 0 <= mem["memory_relation_consistent"] <= 1
    assert mem["pretrain_final_loss"] >= 0
    _check_outcomes(_table(runs, "pretrained", "icrecall_pretrained"))


def test_design_covers_every_design_and_method(runs, scripts):
    w = _table(runs, "design", "icrecall_design")
    assert set(w["design"]) == set(scripts["icrecall_design"].DESIGNS)
    assert set(w["method"]) == {"gd", "pgd"}
    _check_outcomes(w)
    csv = pd.read_csv(runs / "design.csv")
    assert len(csv) == len(w) and csv["attn_s1"].between(0, 1).all()


def test_summary_of_tiny_runs_puts_ours_beside_paper(runs):
    s = pd.read_csv(runs / "summary.csv")
    assert list(s["item"]) == [1, 2, 3, 4, 5, 6]
    assert set(s["reproduces"]) <= {"yes", "no", "partly"}
    assert "v* = (a, a, 1/2-a, 1/2-a, 0, 0)" in s.loc[0, "paper"]
    assert s.loc[0, "ours"].startswith("PGD: max within-pair gap")
    md = (runs / "summary.md").read_text()
    assert md.count("- paper: ") == 6 and md.count("- ours: ") == 6
    assert "| andprod_default | pgd |" in md


# ---- verdict rules on hand-made tables ----------------------------------------------------------

GOOD = {"pair_gap_max": 0.01, "offpair_mass": 0.01, "pair_mass_min": 0.49,
        "pair_mass_max": 0.5, "relation_prob_confusing": 0.999, "relation_prob": 0.999,
        "n_all": 1000, "n_confusing": 300, "relation_acc": 1.0, "relation_acc_confusing": 1.0,
        "answer_acc": 0.999}


def _write(out: Path, name: str, analysis: str, runs: list[tuple[dict, dict]]) -> None:
    """runs: (settings for the run_id key, metrics) -> out/name.parquet."""
    save([metric_rows(m, analysis, 1, run_id=key(**kv)) for kv, m in runs], name, out)


@pytest.mark.parametrize("change,verdicts", [
    ({}, ["yes", "yes"]),
    ({"pair_gap_max": 0.08}, ["partly", "yes"]),
    ({"offpair_mass": 0.3}, ["no", "yes"]),
    ({"relation_prob_confusing": 0.9}, ["no", "yes"]),
    ({"relation_acc": 0.99}, ["yes", "no"]),
    ({"answer_acc": 0.9}, ["yes", "no"]),
])
def test_items_1_2_verdicts(scripts, tmp_path, change, verdicts):
    bad_gd = {**GOOD, "pair_gap_max": 0.5, "relation_acc": 0.5}  # GD is reported, not judged
    _write(tmp_path, "main", "icrecall_main", [({"method": "pgd", "seed": 0}, GOOD),
                                               ({"method": "pgd", "seed": 1}, {**GOOD, **change}),
                                               ({"method": "gd", "seed": 0}, bad_gd)])
    rows = scripts["icrecall_summary"].item1_2(tmp_path)
    assert [r["reproduces"] for r in rows] == verdicts
    assert "(2 runs)" in rows[0]["ours"] and "GD for comparison: max within-pair gap 0.500" in \
        rows[0]["rule"]


def _dyn(escape: float | None, **kw) -> dict:
    m = {"final_loss": 1e-3, "relation_prob_confusing": 0.99, "check_path_barrier": 0.0,
         "check_path_end_minus_start": -0.1, "check_grad_norm": 1e-3, **kw}
    return m if escape is None else {**m, "escape_step": escape}


@pytest.mark.parametrize("gd_escape,pgd_escapes,verdict", [
    (None, [10, 12], "yes"),   # GD never escapes (inf), every PGD seed does
    (100, [10, 12], "yes"),    # 100 >= 5 x 11
    (40, [10, 12], "no"),      # GD only 4x later
])
def test_item_3_verdicts(scripts, tmp_path, gd_escape, pgd_escapes, verdict):
    runs = [({"method": "gd", "seed": 0}, _dyn(gd_escape))]
    runs += [({"method": "pgd", "seed": s}, _dyn(e)) for s, e in enumerate(pgd_escapes)]
    _write(tmp_path, "dynamics", "icrecall_dynamics_summary", runs)
    (row,) = scripts["icrecall_summary"].item3(tmp_path)
    assert row["reproduces"] == verdict
    assert "PGD: escaped 2/2 seeds" in row["ours"]
    assert ("1 GD seeds that never escaped" in row["ours"]) == (gd_escape is None)


@pytest.mark.parametrize("n_train", [1, 2])  # seed 1: one-sided at N = 1, both pairs at N = 2
def test_item_3_failed_pgd_seed_is_explained_by_its_training_set(scripts, tmp_path, n_train):
    runs = [({"method": "gd", "seed": 0}, _dyn(None)), ({"method": "pgd", "seed": 0}, _dyn(10)),
            ({"method": "pgd", "seed": 1}, _dyn(None))]
    _write(tmp_path, "dynamics", "icrecall_dynamics_summary", runs)
    write_manifest(tmp_path / "manifest_dynamics", {"n_train": n_train})
    amb = sample_prompts(make_kb(TaskConfig()), n_train, seed=1).ambiguous
    one_sided = bool(amb[:, 0].sum() == 0 or amb[:, 1].sum() == 0)
    (row,) = scripts["icrecall_summary"].item3(tmp_path)
    assert row["reproduces"] == ("partly" if one_sided else "no")
    assert one_sided == (n_train == 1)
    assert (f"PGD seed 1 never escaped; its {n_train} training prompts have "
            f"{int(amb[:, 0].sum())}") in row["ours"]


@pytest.mark.parametrize("n_max_N,verdict", [(8, "yes"), (16, "yes"), (32, "no")])
def test_item_4_polylog_rule(scripts, tmp_path, n_max_N, verdict):
    best = [{"metric": "smallest_N_at_target", "value": v, "run_id": key(n=n, seed=s)}
            for n, vals in ((1000, [8, 8, 16]), (100000, [n_max_N] * 3))
            for s, v in enumerate(vals)]
    save([make_rows(best, model="icrecall", analysis="icrecall_samples_smallest_N"),
          make_rows([{"metric": "target", "value": 0.99}], model="icrecall",
                    analysis="icrecall_samples_settings")], "samples", tmp_path)
    (row,) = scripts["icrecall_summary"].item4(tmp_path)
    assert row["reproduces"] == verdict  # bound: 8 * (log 1e5 / log 1e3)^2 = 22.2
    assert "= 2.78 x" in row["rule"] and f"n=100000: median {n_max_N}, max {n_max_N}" in \
        row["ours"]


@pytest.mark.parametrize("change,verdict", [({}, "yes"), ({"relation_acc": 0.9}, "partly"),
                                            ({"offpair_mass": 0.5, "answer_acc": 0.1}, "no")])
def test_item_5_needs_pattern_and_accuracy(scripts, tmp_path, change, verdict):
    runs = [({"method": "pgd", "seed": 0}, {**GOOD, **change})]
    frames = [metric_rows({"memory_answer_recall": 0.875}, "icrecall_pretrained_memory", 1,
                          run_id=key(part="memory")),
              *[metric_rows(m, "icrecall_pretrained", 1, run_id=key(**kv)) for kv, m in runs]]
    save(frames, "pretrained", tmp_path)
    (row,) = scripts["icrecall_summary"].item5(tmp_path)
    assert row["reproduces"] == verdict
    assert "memory's own answer recall 0.8750" in row["ours"]


@pytest.mark.parametrize("k3,k4,verdict", [
    (GOOD, GOOD, "yes"),
    ({**GOOD, "pair_gap_max": 0.08}, GOOD, "partly"),
    ({**GOOD, "pair_gap_max": 0.5}, {**GOOD, "offpair_mass": 0.3}, "no"),
])
def test_item_6_judges_only_k_above_2(scripts, tmp_path, k3, k4, verdict):
    bad2 = {**GOOD, "pair_gap_max": 0.9, "relation_acc": 0.1}  # k = 2 is not judged here
    _write(tmp_path, "kpairs", "icrecall_kpairs",
           [({"k": 2, "seed": 0}, bad2), ({"k": 3, "seed": 0}, k3), ({"k": 4, "seed": 0}, k4)])
    (row,) = scripts["icrecall_summary"].item6(tmp_path)
    assert row["reproduces"] == verdict
    assert row["ours"].startswith("k=2: max within-pair gap 0.900") and " | k=4: " in row["ours"]


def test_all_combines_verdicts(scripts):
    f = scripts["icrecall_summary"]._all
    assert f([True, True]) is True and f([True, False]) == "partly"
    assert f(["partly", False]) == "partly" and f([False]) is False and f([]) is False


def test_summary_main_without_tables_fails_and_with_one_writes_it(scripts, tmp_path, capsys):
    assert scripts["icrecall_summary"].main(["--out", str(tmp_path)]) == 1
    assert "no result tables" in capsys.readouterr().out
    _write(tmp_path, "main", "icrecall_main", [({"method": "pgd", "seed": 0}, GOOD)])
    assert scripts["icrecall_summary"].main(["--out", str(tmp_path)]) == 0
    s = pd.read_csv(tmp_path / "summary.csv")
    assert list(s["reproduces"]) == ["yes", "yes"]
    printed = capsys.readouterr().out
    assert "## 1. pairwise pattern at '?': reproduces **yes**" in printed
    assert "- paper: >= 0.999 relation, >= 0.995 answer" in printed
