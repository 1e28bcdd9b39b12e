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
import torch

from pythia_probe.results import make_rows, read_manifest, read_shard, validate
from pythia_probe.toy.icrecall.curvature import LABELS
from pythia_probe.toy.icrecall.experiment import metric_rows
from pythia_probe.toy.icrecall.report import key, parse_key, save, wide
from pythia_probe.toy.icrecall.task import Prompts

ANALYSES = Path(__file__).resolve().parents[1] / "analyses"
NAMES = ("icrecall_main", "icrecall_dynamics", "icrecall_kpairs", "icrecall_samples",
         "icrecall_pretrained", "icrecall_saddle", "icrecall_summary")
ATTN = ["attn_s1", "attn_a1", "attn_s2", "attn_a2", "attn_s_query", "attn_last"]
PROBS = ["relation_acc", "relation_acc_confusing", "answer_acc", "relation_prob",
         "relation_prob_confusing", "relation_sampled", "answer_sampled", "pair_gap_max",
         "offpair_mass"]
SMALL = ["--n-test", "100"]
TINY = {  # script -> argv that runs in a few seconds
    "icrecall_main": ["--seeds", "1", "--n-test", "200", "--methods", "pgd"],
    "icrecall_dynamics": ["--seeds", "1", "--steps", "40", "--n-test", "200", "--n-monitor",
                          "100", "--log-every", "10", "--draws", "1", "--stall-steps", "5"],
    "icrecall_kpairs": ["--ks", "3", "--seeds", "1", "--n-test", "200", "--d-model", "256",
                        "--n-train", "4"],
    "icrecall_samples": ["--ns", "200,400", "--Ns", "2,4", "--seeds", "2", "--steps", "20",
                         "--n-test", "100"],
    "icrecall_pretrained": ["--d-model", "32", "--d-hidden", "64", "--epochs", "2", "--seeds",
                            "1", "--methods", "pgd", "--n-test", "200"],
    "icrecall_saddle": ["--designs", "andprod_default,product_beta30", "--seeds", "1", "--steps",
                        "20", "--n-test", "100", "--draws", "1", "--stall-steps", "5"],
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


def _check_outcomes(w: pd.DataFrame, attn: list[str] = ATTN, probs: list[str] = PROBS) -> None:
    assert len(w) >= 1
    for m in probs:
        assert w[m].between(0, 1).all(), m
    assert (w[attn].sum(axis=1) - 1).abs().max() < 1e-4  # the relation-step row is a softmax
    assert (w["n_all"] > 0).all() and (w["n_confusing"] <= w["n_all"]).all()


def test_main_writes_outcomes_controls_pattern_and_manifest(runs):
    w = _table(runs, "main", "icrecall_main")
    assert list(w["method"]) == ["pgd"] and list(w["seed"]) == ["0"]
    _check_outcomes(w)
    assert int(w["n_all"].iloc[0]) == 200
    assert (runs / "pattern.png").stat().st_size > 0
    assert read_manifest(runs / "manifest_main")["config"]["n_test"] == 200
    c = _table(runs, "controls", "icrecall_controls").set_index("state")
    assert set(c.index) == {"uniform", "stuck", "one_pair", "ideal"}
    # the discriminating measure separates the confused states from the ideal row
    assert c.loc["uniform", "relation_prob_confusing"] < 0.5
    assert c.loc["one_pair", "relation_prob_confusing"] < 0.9 < c.loc["ideal",
                                                                     "relation_prob_confusing"]
    assert c.loc["uniform", "relation_acc"] > 0.9  # while argmax does not


def test_dynamics_ablation_arms_states_and_stalls(runs, scripts):
    df = read_shard(runs / "dynamics.parquet")
    hist = df[df["analysis"] == "icrecall_dynamics"]
    arms = set(scripts["icrecall_dynamics"].ARMS)
    assert {parse_key(r)["arm"] for r in hist["settings"]} == arms
    loss = hist[(hist["metric"] == "loss") & hist["step"].notna()]
    assert (loss["value"] >= 0).all() and loss["step"].max() <= 40
    s = _table(runs, "dynamics", "icrecall_dynamics_summary")
    _check_outcomes(s)
    stalled = s[s["escaped"] == 0]
    assert stalled["stall_label_code"].between(0, len(LABELS) - 1).all()
    assert (stalled["stall_grad_norm"] >= 0).all()
    assert (stalled["stall_perturb_escapes"] <= stalled["stall_perturb_draws"]).all()
    st = _table(runs, "dynamics", "icrecall_dynamics_states")
    assert {"init_eig1", "after_large_eig1", "one_sided"} <= set(st.columns)
    assert (st["init_eig1"] <= st["init_eig2"]).all()
    level = df[df["metric"] == "escape_level"]["value"]
    assert list(level) == [0.95]


def test_kpairs_rows_cover_k_pairs(runs):
    w = _table(runs, "kpairs", "icrecall_kpairs")
    assert list(w["k"]) == ["3"]
    _check_outcomes(w, ATTN[:4] + ["attn_s3", "attn_a3", "attn_s_query", "attn_last"])
    lo, hi = w["pair_mass_min"].iloc[0], w["pair_mass_max"].iloc[0]
    assert 0 <= lo <= hi <= 1


def test_samples_smallest_N_capacity_and_fit(runs, scripts):
    df = read_shard(runs / "samples.parquet")
    w = wide(df[df["analysis"] == "icrecall_samples"])
    assert sorted({(int(n), int(N)) for n, N in zip(w["n"], w["N"], strict=True)}) == [
        (200, 2), (200, 4), (400, 2), (400, 4)]
    _check_outcomes(w, probs=[m for m in PROBS if not m.startswith("answer")])
    assert "answer_acc" not in w and "answer_sampled" not in w  # relation-only runs
    cap = wide(df[df["analysis"] == "icrecall_samples_capacity"])
    assert set(cap["d"]) == {"scaled", "fixed"} and set(cap["n"]) == {"200", "400"}
    scaled = cap[cap["d"] == "scaled"].set_index(["n", "state"])["d_model"]
    assert scaled[("400", "ideal")] > scaled[("200", "ideal")]  # d grows with n
    best = wide(df[df["analysis"] == "icrecall_samples_smallest_N"])
    w[["n", "N", "seed"]] = w[["n", "N", "seed"]].astype(int)
    expect = scripts["icrecall_samples"].smallest_N(w, 0.99)
    for (n, seed), v in expect.items():
        row = best[(best["n"] == str(n)) & (best["seed"] == str(seed))].iloc[0]
        assert row["reached_target"] == float(v == v)
        assert (v != v) or row["smallest_N_at_target"] == v
    fit = df[df["analysis"] == "icrecall_samples_fit"].set_index("metric")["value"]
    assert fit["loglog_slope_lo"] <= fit["loglog_slope"] <= fit["loglog_slope_hi"]


def test_smallest_N_needs_every_larger_N(scripts):
    w = pd.DataFrame({"n": [10] * 4 + [20] * 2, "seed": [0] * 6, "N": [1, 2, 4, 8, 1, 2],
                      "relation_prob_confusing": [1.0, 0.5, 0.995, 1.0, 0.2, 0.3]})
    got = scripts["icrecall_samples"].smallest_N(w, 0.99)
    assert got[(10, 0)] == 4 and math.isnan(got[(20, 0)])


def test_growth_fit_recovers_a_power_law_and_counts_censored(scripts):
    fit = scripts["icrecall_samples"].growth_fit
    best = {(n, s): 2.0 * (n / 100) ** 0.5 for n in (100, 10000, 1000000) for s in range(3)}
    f = fit(best, cap=1e6)
    assert abs(f["loglog_slope"] - 0.5) < 1e-9 and f["loglog_slope_hi"] - f["loglog_slope_lo"] \
        < 1e-9 and f["censored"] == 0
    best[(100, 0)] = float("nan")
    f = fit(best, cap=1e6)
    assert f["censored"] == 1 and f["loglog_slope"] < 0.5  # the cap counts at the smallest n


def test_escape_step_is_first_step_that_stays_above(scripts):
    h = [{"step": s, "relation_prob_confusing": p} for s, p in
         [(0, 0.5), (10, 0.97), (20, 0.9), (30, 0.96), (40, 0.99)]]
    f = scripts["icrecall_dynamics"].first_step_at
    assert f(h, "relation_prob_confusing", 0.95) == 30
    assert math.isnan(f(h, "relation_prob_confusing", 0.995))


def test_one_sided_training_sets(scripts):
    one_sided = scripts["icrecall_dynamics"].one_sided
    mk = lambda amb: Prompts(*(torch.zeros(len(amb), 3, dtype=torch.long),) * 2,  # noqa: E731
                             torch.zeros(len(amb), dtype=torch.long), torch.tensor(amb))
    assert one_sided(mk([[True, False], [False, False]]))
    assert not one_sided(mk([[True, False], [False, True]]))


def test_pretrained_records_memory_recall_and_controls(runs):
    df = read_shard(runs / "pretrained.parquet")
    mem = df[df["analysis"] == "icrecall_pretrained_memory"].set_index("metric")["value"]
    assert 0 <= mem["memory_answer_recall"] <= 1 and 0 <= mem["memory_relation_consistent"] <= 1
    assert mem["pretrain_final_loss"] >= 0
    _check_outcomes(_table(runs, "pretrained", "icrecall_pretrained"))
    assert len(_table(runs, "pretrained", "icrecall_controls")) == 4


def test_saddle_covers_designs_methods_and_stalls(runs):
    w = _table(runs, "saddle", "icrecall_saddle")
    assert set(w["design"]) == {"andprod_default", "product_beta30"}
    assert set(w["method"]) == {"gd", "pgd"}
    _check_outcomes(w)
    st = w[(w["method"] == "gd") & (w["escaped"] == 0)]
    assert st["stall_label_code"].notna().all()
    csv = pd.read_csv(runs / "saddle.csv")
    assert len(csv) == len(w) and set(csv["stall_label"].dropna()) <= set(LABELS)


def test_summary_of_tiny_runs_puts_ours_beside_paper(runs):
    s = pd.read_csv(runs / "summary.csv")
    assert list(s["item"]) == [1, 2, 3, 4, 5, 6]
    assert set(s["reproduces"]) <= {"yes", "no", "partly"}
    assert "v* = (a, a, 1/2-a, 1/2-a, 0, 0)" in s.loc[0, "paper"]
    assert s.loc[0, "ours"].startswith("PGD: pattern passes on ")
    assert s["measure"].notna().all() and s["rule"].str.contains(">=|<=").all()
    md = (runs / "summary.md").read_text()
    assert md.count("- paper: ") == 6 and md.count("- ours: ") == 6
    assert "| andprod_default |" in md and "## Controls: reference rows" in md
    assert "| gd |" in md and "| pgd |" in md  # the 2x2 ablation table


# ---- verdict rules on hand-made tables ----------------------------------------------------------

GOOD = {"pair_gap_max": 0.01, "offpair_mass": 0.01, "pair_mass_min": 0.49,
        "pair_mass_max": 0.5, "relation_prob_confusing": 0.999, "relation_prob": 0.999,
        "n_all": 100000, "n_confusing": 30000, "relation_acc": 1.0, "relation_acc_confusing": 1.0,
        "answer_acc": 0.999, "relation_sampled": 0.9999, "relation_sampled_confusing": 0.9998,
        "answer_sampled": 0.9995}
# the reference rows as the first review measured them (issue #12), on 5,000 prompts
UNIFORM = {**GOOD, "pair_gap_max": 0.0, "offpair_mass": 1 / 3, "relation_prob_confusing": 0.068,
           "relation_acc": 0.9868, "relation_sampled": 0.068, "n_all": 5000, "n_confusing": 1700}
STUCK = {**GOOD, "pair_gap_max": 0.0, "offpair_mass": 0.186, "relation_prob_confusing": 0.750,
         "relation_acc": 0.9998, "relation_sampled": 0.915, "n_all": 5000, "n_confusing": 1700}
ONE_PAIR = {**STUCK, "offpair_mass": 0.0, "pair_mass_min": 0.0, "pair_mass_max": 1.0}


def _write(out: Path, name: str, analysis: str, runs: list[tuple[dict, dict]]) -> None:
    """runs: (settings for the run_id key, metrics) -> out/name.parquet."""
    save([metric_rows(m, analysis, 1, settings=key(**kv)) for kv, m in runs], name, out)


@pytest.mark.parametrize("state", [UNIFORM, STUCK, ONE_PAIR])
def test_confused_states_fail_both_rules_that_argmax_would_pass(scripts, state):
    sm = scripts["icrecall_summary"]
    one = pd.DataFrame([state])
    assert sm.pattern_verdict(one)[0] == "no" and sm.accuracy_verdict(one)[0] == "no"
    assert state["relation_acc"] >= 0.98  # argmax alone would not tell them apart


@pytest.mark.parametrize("change,verdicts", [
    ({}, ["yes", "yes"]),
    ({"pair_gap_max": 0.08}, ["partly", "yes"]),  # within twice the tolerance on every seed
    ({"offpair_mass": 0.3}, ["no", "yes"]),  # 1 of 3 seeds pass
    ({"relation_prob_confusing": 0.9}, ["no", "yes"]),
    ({"relation_sampled": 0.99}, ["yes", "no"]),
    ({"relation_sampled": 0.999, "n_all": 10**7}, ["yes", "partly"]),  # Wilson bound < 0.999
    ({"answer_sampled": 0.9}, ["yes", "no"]),
])
def test_items_1_2_verdicts(scripts, tmp_path, change, verdicts):
    bad_gd = {**GOOD, "pair_gap_max": 0.5, "relation_sampled": 0.5}  # GD is reported, not judged
    pgd = [({"method": "pgd", "seed": 0}, GOOD)]
    pgd += [({"method": "pgd", "seed": s}, {**GOOD, **change}) for s in (1, 2)]
    _write(tmp_path, "main", "icrecall_main", pgd + [({"method": "gd", "seed": 0}, bad_gd)])
    rows = scripts["icrecall_summary"].item1_2(tmp_path)
    assert [r["reproduces"] for r in rows] == verdicts
    passing = 3 if verdicts[0] == "yes" else 1
    assert rows[0]["ours"].startswith(f"PGD: pattern passes on {passing}/3 seeds")
    assert "GD for comparison: pattern passes on 0/1 seeds; max within-pair gap 0.500" in \
        rows[0]["rule"]


def test_half_the_seeds_make_partly(scripts):
    sm = scripts["icrecall_summary"]
    w = pd.DataFrame([GOOD, GOOD, STUCK, UNIFORM])
    assert sm.pattern_verdict(w)[0] == "partly" and sm.accuracy_verdict(w)[0] == "partly"
    assert sm.pattern_verdict(w.iloc[[0, 2, 3]])[0] == "no"


def test_controls_sentence_counts_rejected_states(scripts, tmp_path):
    _write(tmp_path, "controls", "icrecall_controls",
           [({"memory": "c", "state": s}, {**m, "relation_prob_confusing_lo": 0.0,
                                            "relation_prob_confusing_hi": 1.0})
            for s, m in (("uniform", UNIFORM), ("stuck", STUCK), ("ideal", GOOD))])
    sm = scripts["icrecall_summary"]
    w = sm._load(tmp_path, "controls", "icrecall_controls")
    assert "reject 2/2 reference states" in sm.control_failures(w)
    lines = sm.controls_lines(w, "x")
    assert lines[4].startswith("| uniform | 0.0680") and lines[-2].startswith("| ideal |")


def _dyn(escaped: bool, label: str | None = None, escapes: int = 0, one_sided: bool = False,
         **kw) -> dict:
    m = {"escaped": float(escaped), "escape_step": 10.0, "final_loss": 1e-3,
         "relation_prob_confusing": 0.99 if escaped else 0.75, "one_sided": float(one_sided),
         **kw}
    if not escaped:  # curvature values that curvature.label maps to ``label``
        eig1, plus = {"strict saddle": (-1e-3, -1e-4), "one-sided saddle": (-1e-3, 1e-5),
                      "minimum": (1e-3, 1e-5)}[label]
        m.update({"stall_label_code": float(LABELS.index(label)), "stall_eig1": eig1,
                  "stall_tol": 1e-14, "stall_grad_norm": 1e-4, "stall_escape_radius": 0.2,
                  "stall_line_minus": -1e-3, "stall_line_plus": plus,
                  "stall_perturb_escapes": float(escapes), "stall_perturb_draws": 5.0})
    return m


@pytest.mark.parametrize("gd_label,escapes,pgd_ok,verdict", [
    ("strict saddle", 4, True, "yes"),
    ("one-sided saddle", 4, True, "partly"),   # not a strict saddle
    ("strict saddle", 1, True, "partly"),      # the perturbation does not escape it
    ("strict saddle", 4, False, "no"),         # PGD no better than GD
])
def test_item_3_verdicts(scripts, tmp_path, gd_label, escapes, pgd_ok, verdict):
    runs = [({"arm": "gd", "seed": s}, _dyn(False, gd_label, escapes)) for s in range(2)]
    runs += [({"arm": "pgd", "seed": s}, _dyn(pgd_ok, gd_label, escapes)) for s in range(2)]
    runs += [({"arm": "gd", "seed": 9}, _dyn(False, "minimum", 0, one_sided=True))]  # excluded
    _write(tmp_path, "dynamics", "icrecall_dynamics_summary", runs)
    save([make_rows([{"metric": "escape_level", "value": 0.95}], model="icrecall",
                    analysis="icrecall_dynamics_settings"),
          read_shard(tmp_path / "dynamics.parquet")], "dynamics", tmp_path)
    (row,) = scripts["icrecall_summary"].item3(tmp_path)
    assert row["reproduces"] == verdict
    assert "gd: escaped 0/3" in row["ours"] and ">= 0.95" in row["rule"]


def _samples(tmp_path, per_n: dict[int, list[float]], fit: dict) -> None:
    best = [{"metric": "smallest_N_at_target", "value": v, "settings": key(n=n, seed=s)}
            for n, vals in per_n.items() for s, v in enumerate(vals) if v == v]
    best += [{"metric": "reached_target", "value": float(v == v), "settings": key(n=n, seed=s)}
             for n, vals in per_n.items() for s, v in enumerate(vals)]
    settings = [{"metric": "target", "value": 0.99}, {"metric": "d_scale", "value": 6.0},
                {"metric": "max_N", "value": 128.0}]
    save([make_rows(best, model="icrecall", analysis="icrecall_samples_smallest_N"),
          make_rows([{"metric": k, "value": v} for k, v in fit.items()], model="icrecall",
                    analysis="icrecall_samples_fit"),
          make_rows(settings, model="icrecall", analysis="icrecall_samples_settings")],
         "samples", tmp_path)


@pytest.mark.parametrize("slope,lo,hi,verdict", [(0.0, -0.1, 0.1, "yes"), (0.3, 0.1, 0.5, "partly"),
                                                 (0.8, 0.5, 1.1, "no")])
def test_item_4_polylog_rule(scripts, tmp_path, slope, lo, hi, verdict):
    fit = {"loglog_slope": slope, "loglog_slope_lo": lo, "loglog_slope_hi": hi,
           "polylog_slope": 1.0, "polylog_slope_lo": 0.0, "polylog_slope_hi": 2.0,
           "censored": 1.0}
    _samples(tmp_path, {1000: [8, 8, 16], 100000: [16, float("nan"), 8]}, fit)
    (row,) = scripts["icrecall_summary"].item4(tmp_path)
    assert row["reproduces"] == verdict  # bound: (log n)^2's slope 2 ln(ln 1e5/ln 1e3)/ln 100
    assert "<= 0.222" in row["rule"] and "n=100000: median 16" in row["ours"]
    assert "16/never/8" in row["ours"]


def test_item_4_fails_when_most_seeds_never_reach_the_target(scripts, tmp_path):
    fit = {"loglog_slope": 0.0, "loglog_slope_lo": 0.0, "loglog_slope_hi": 0.0,
           "polylog_slope": 0.0, "polylog_slope_lo": 0.0, "polylog_slope_hi": 0.0,
           "censored": 4.0}
    _samples(tmp_path, {1000: [float("nan")] * 2, 100000: [float("nan")] * 2}, fit)
    (row,) = scripts["icrecall_summary"].item4(tmp_path)
    assert row["reproduces"] == "no" and "median never" in row["ours"]


@pytest.mark.parametrize("change,verdict", [({}, "yes"), ({"relation_sampled": 0.9}, "partly"),
                                            ({"offpair_mass": 0.5, "answer_sampled": 0.1}, "no")])
def test_item_5_needs_pattern_and_accuracy(scripts, tmp_path, change, verdict):
    runs = [({"method": "pgd", "seed": 0}, {**GOOD, **change})]
    frames = [metric_rows({"memory_answer_recall": 0.875}, "icrecall_pretrained_memory", 1,
                          settings=key(part="memory")),
              *[metric_rows(m, "icrecall_pretrained", 1, settings=key(**kv)) for kv, m in runs]]
    save(frames, "pretrained", tmp_path)
    (row,) = scripts["icrecall_summary"].item5(tmp_path)
    assert row["reproduces"] == verdict
    assert "memory's own answer recall 0.8750" in row["ours"]


@pytest.mark.parametrize("k3,k4,verdict", [
    (GOOD, GOOD, "yes"),
    ({**GOOD, "pair_gap_max": 0.08}, GOOD, "partly"),
    ({**GOOD, "pair_gap_max": 0.5}, {**GOOD, "offpair_mass": 0.3}, "no"),
    (ONE_PAIR, ONE_PAIR, "no"),  # attention on one pair: no gap, no off-pair mass, but P(conf)
])
def test_item_6_judges_only_k_above_2(scripts, tmp_path, k3, k4, verdict):
    bad2 = {**GOOD, "pair_gap_max": 0.9, "relation_acc": 0.1}  # k = 2 is not judged here
    _write(tmp_path, "kpairs", "icrecall_kpairs",
           [({"k": 2, "seed": 0}, bad2), ({"k": 3, "seed": 0}, k3), ({"k": 4, "seed": 0}, k4)])
    (row,) = scripts["icrecall_summary"].item6(tmp_path)
    assert row["reproduces"] == verdict
    assert row["ours"].startswith("k=2: pattern passes on 0/1 seeds; max within-pair gap 0.900")
    assert " | k=4: " in row["ours"]


def test_combine_verdicts(scripts):
    f = scripts["icrecall_summary"].combine
    assert f("yes", "yes") == "yes" and f("yes", "no") == "partly"
    assert f("partly", "no") == "partly" and f("no") == "no" and f() == "no"


def test_summary_main_without_tables_fails_and_with_one_writes_it(scripts, tmp_path, capsys):
    assert scripts["icrecall_summary"].main(["--out", str(tmp_path)]) == 1
    assert "no result tables" in capsys.readouterr().out
    _write(tmp_path, "main", "icrecall_main", [({"method": "pgd", "seed": 0}, GOOD)])
    assert scripts["icrecall_summary"].main(["--out", str(tmp_path)]) == 0
    s = pd.read_csv(tmp_path / "summary.csv")
    assert list(s["reproduces"]) == ["yes", "yes"]
    printed = capsys.readouterr().out
    assert "## 1. pairwise pattern at '?': reproduces **yes**" in printed
    assert "- paper: >= 0.999 relation, near-perfect answer" in printed
