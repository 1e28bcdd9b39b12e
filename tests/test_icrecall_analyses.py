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
from pythia_probe.toy.icrecall import verdicts as V
from pythia_probe.toy.icrecall.curvature import LABELS
from pythia_probe.toy.icrecall.experiment import metric_rows
from pythia_probe.toy.icrecall.intervals import wilson
from pythia_probe.toy.icrecall.report import key, parse_key, save, wide
from pythia_probe.toy.icrecall.task import Prompts

ANALYSES = Path(__file__).resolve().parents[1] / "analyses"
NAMES = ("icrecall_main", "icrecall_dynamics", "icrecall_escape", "icrecall_kpairs",
         "icrecall_samples", "icrecall_pretrained", "icrecall_saddle", "icrecall_summary")
ATTN = ["attn_s1", "attn_a1", "attn_s2", "attn_a2", "attn_s_query", "attn_last"]
PROBS = ["relation_acc", "relation_acc_confusing", "answer_acc", "relation_prob",
         "relation_prob_confusing", "relation_sampled", "answer_sampled", "pair_gap_max",
         "offpair_mass"]
SMALL = ["--n-test", "100"]
SAMPLES = ["--ns", "200,400", "--Ns", "2,4", "--seeds", "2", "--steps", "20", "--n-test", "100"]
TINY = [  # (script, argv) that runs in a few seconds
    ("icrecall_main", ["--seeds", "1", "--n-test", "200", "--methods", "pgd"]),
    ("icrecall_dynamics", ["--seeds", "1", "--steps", "40", "--n-test", "200", "--n-monitor",
                           "100", "--log-every", "10", "--draws", "1", "--stall-steps", "5"]),
    ("icrecall_escape", ["--seeds", "2", "--max-steps", "60", "--check-every", "10",
                         "--confirm", "20", "--n-monitor", "20"]),
    ("icrecall_escape", ["--first-seed", "2", "--seeds", "1", "--append", "--max-steps", "60",
                         "--check-every", "10", "--confirm", "20", "--n-monitor", "20"]),
    ("icrecall_kpairs", ["--ks", "2,3", "--seeds", "1", "--n-test", "200", "--d-model", "256",
                         "--n-train", "4"]),
    ("icrecall_samples", SAMPLES),
    ("icrecall_samples", [*SAMPLES, "--d-rule", "fixed", "--reuse",
                          "results/icrecall/samples.parquet"]),
    ("icrecall_pretrained", ["--d-model", "32", "--d-hidden", "64", "--epochs", "2", "--seeds",
                             "1", "--methods", "pgd", "--n-test", "200", "--long-steps", "30"]),
    ("icrecall_saddle", ["--designs", "andprod_default,product_beta30", "--seeds", "1",
                         "--steps", "20", "--n-test", "100", "--draws", "1", "--stall-steps",
                         "5"]),
]


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
        for name, argv in TINY:
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
    assert sorted(w["k"]) == ["2", "3"]
    k3 = w[w["k"] == "3"]
    _check_outcomes(k3, ATTN[:4] + ["attn_s3", "attn_a3", "attn_s_query", "attn_last"])
    lo, hi = k3["pair_mass_min"].iloc[0], k3["pair_mass_max"].iloc[0]
    assert 0 <= lo <= hi <= 1


def test_escape_rows_per_arm_and_seed(runs):
    w = _table(runs, "escape", "icrecall_escape")
    assert sorted({(a, s) for a, s in zip(w["arm"], w["seed"], strict=True)}) == sorted(
        (a, str(s)) for a in ("gd", "large_only", "perturb_only", "pgd") for s in (0, 1, 2))
    assert len(w) == 12  # seed 2 appended to seeds 0 and 1, nothing doubled
    assert read_manifest(runs / "manifest_escape")["seeds_in_table"] == [0, 1, 2]
    assert set(w["censored"]) <= {0.0, 1.0}
    done = w[w["censored"] == 0]
    assert (done["escape_step"] + 20 <= done["steps_run"]).all()  # held for confirm steps
    assert w.loc[w["censored"] == 1, "escape_step"].isna().all()
    assert (w["steps_run"] <= 60).all()
    st = read_shard(runs / "escape.parquet")
    st = st[st["analysis"] == "icrecall_escape_settings"].set_index("metric")["value"]
    assert st["max_steps"] == 60 and st["confirm"] == 20 and st["level"] == 0.95


def test_escape_append_refuses_other_settings(scripts, runs, monkeypatch):
    from pythia_probe.errors import BadInputError

    monkeypatch.chdir(runs.parents[1])
    with pytest.raises(BadInputError, match="--append: .* other settings"):
        scripts["icrecall_escape"].main(["--first-seed", "3", "--seeds", "1", "--append",
                                         "--max-steps", "80", "--n-monitor", "20"])


def test_samples_smallest_N_capacity_fit_and_the_fixed_d_rule(runs):
    from pythia_probe.toy.icrecall.growth import smallest_N

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
    for (n, seed), v in smallest_N(w, 0.99).items():
        row = best[(best["n"] == str(n)) & (best["seed"] == str(seed))].iloc[0]
        assert row["reached_target"] == float(v == v)
        assert (v != v) or row["smallest_N_at_target"] == v
    fit = df[df["analysis"] == "icrecall_samples_fit"].set_index("metric")["value"]
    assert fit["loglog_slope_lo"] <= fit["loglog_slope"] <= fit["loglog_slope_hi"]
    # fixed d: one memory (the largest n's d) at every n; the largest n's runs are the scaled
    # table's, copied because every setting is equal, and equal to a rerun
    fixed = read_shard(runs / "samples_fixed_d.parquet")
    fcap = wide(fixed[fixed["analysis"] == "icrecall_samples_capacity"])
    assert set(fcap["d"]) == {"fixed"} and fcap["d_model"].nunique() == 1
    assert fcap["d_model"].iloc[0] == scaled[("400", "ideal")]
    fw = wide(fixed[fixed["analysis"] == "icrecall_samples"])
    keys = ["n", "N", "seed"]
    a = w.astype({k: str for k in keys}).set_index(keys)["relation_prob_confusing"]
    b = fw.set_index(keys)["relation_prob_confusing"]
    assert (a.xs("400", level="n") == b.xs("400", level="n")).all()


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


def test_pretrained_records_memory_recall_controls_and_the_long_run(runs):
    df = read_shard(runs / "pretrained.parquet")
    mem = df[df["analysis"] == "icrecall_pretrained_memory"].set_index("metric")["value"]
    assert 0 <= mem["memory_answer_recall"] <= 1 and 0 <= mem["memory_relation_consistent"] <= 1
    assert mem["pretrain_final_loss"] >= 0
    _check_outcomes(_table(runs, "pretrained", "icrecall_pretrained"))
    assert len(_table(runs, "pretrained", "icrecall_controls")) == 4
    _check_outcomes(_table(runs, "pretrained", "icrecall_pretrained_long"))
    ideal = df[df["analysis"] == "icrecall_pretrained_long_ideal"]["value"]
    assert len(ideal) == 1 and ideal.iloc[0] > 0
    assert read_manifest(runs / "manifest_pretrained")["config"]["rows"] == 0.5


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
    assert set(s["reproduces"]) <= {"yes", "no", "partly", "undecided"}
    assert "v* = (a, a, 1/2-a, 1/2-a, 0, 0)" in s.loc[0, "paper"]
    assert s.loc[0, "ours"].startswith("PGD: pattern passes on ")
    assert s["measure"].notna().all() and s["rule"].str.contains(">=|<=").all()
    assert "time to escape per seed" in s.loc[2, "ours"] and "sign test" in s.loc[2, "ours"]
    assert "seeds 0-2" in s.loc[2, "ours"]
    assert "fixed d" in s.loc[3, "ours"] and "target 0.995" in s.loc[3, "ours"]
    assert "judged relative to the k = 2 control" in s.loc[5, "rule"]
    md = (runs / "summary.md").read_text()
    assert md.count("- paper: ") == 6 and md.count("- ours: ") == 6
    assert "| andprod_default |" in md and "## Controls: reference rows" in md
    assert "| gd |" in md and "| pgd |" in md  # the 2x2 ablation table
    assert "intervals are 95% over seeds" in md


# ---- the summary's items on hand-made tables ------------------------------------------------

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


def _write(out: Path, name: str, analysis: str, runs: list[tuple[dict, dict]], extra=()) -> None:
    """runs: (settings, metrics) -> out/name.parquet (plus ``extra`` frames)."""
    save([metric_rows(m, analysis, 1, settings=key(**kv)) for kv, m in runs] + list(extra),
         name, out)


@pytest.mark.parametrize("state", [UNIFORM, STUCK, ONE_PAIR])
def test_confused_states_fail_both_rules_that_argmax_would_pass(state):
    one = pd.DataFrame([state])
    assert V.pattern_verdict(one)[0] == "no" and V.accuracy_verdict(one)[0] == "no"
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
    assert rows[0]["ours"].startswith(f"PGD: pattern passes on {passing}/3 seeds [")
    assert "GD for comparison: pattern passes on 0/1 seeds" in rows[0]["rule"]
    assert "(max 0.500)" in rows[0]["rule"]
    assert "mean over seeds [t 95%]" in rows[1]["ours"]  # no interval pools prompts across seeds


def test_half_the_seeds_make_partly():
    w = pd.DataFrame([GOOD, GOOD, STUCK, UNIFORM])
    assert V.pattern_verdict(w)[0] == "partly" and V.accuracy_verdict(w)[0] == "partly"
    assert V.pattern_verdict(w.iloc[[0, 2, 3]])[0] == "no"


def test_controls_sentence_counts_rejected_states(scripts, tmp_path):
    _write(tmp_path, "controls", "icrecall_controls",
           [({"memory": "c", "state": s}, {**m, "relation_prob_confusing_lo": 0.0,
                                            "relation_prob_confusing_hi": 1.0})
            for s, m in (("uniform", UNIFORM), ("stuck", STUCK), ("ideal", GOOD))])
    sm = scripts["icrecall_summary"]
    w = sm.load(tmp_path, "controls", "icrecall_controls")
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


def _escape_tables(out: Path, pgd: list[float], gd: list[float], label: str, escapes: int,
                   cap: float = 50000) -> None:
    """escape.parquet (time to escape per arm and seed; nan = censored at cap) and
    dynamics.parquet (GD stalled at step 3000 in the seeds where it took longer)."""
    runs = []
    for arm, vals in (("pgd", pgd), ("gd", gd)):
        runs += [({"arm": arm, "seed": s}, {"escape_step": v, "censored": float(v != v),
                                            "steps_run": cap if v != v else v + 1000,
                                            "one_sided": 0.0})
                 for s, v in enumerate(vals)]
    st = [{"metric": k, "value": v} for k, v in
          {"level": 0.95, "confirm": 1000.0, "max_steps": cap}.items()]
    _write(out, "escape", "icrecall_escape", runs,
           [make_rows(st, model="icrecall", analysis="icrecall_escape_settings")])
    dyn = [({"arm": arm, "seed": s}, _dyn(not (v != v or v > 3000), label, escapes))
           for arm, vals in (("pgd", pgd), ("gd", gd)) for s, v in enumerate(vals)]
    save([metric_rows(m, "icrecall_dynamics_summary", 3000, settings=key(**kv))
          for kv, m in dyn], "dynamics", out)


FAST = ([10.0] * 6, [9000.0, 20000.0, 50.0, 100.0, 30000.0, 4000.0])  # p = 0.0625 one-sided
SLOW = ([10.0, 10.0, 10.0, 50.0, 100.0, 10.0], [9000.0, 20000.0, 30000.0, 50.0, 100.0, 10.0])
# SLOW: 3 of 6 earlier, 3 tied: p = 0.25, not significant


@pytest.mark.parametrize("times,label,escapes,verdict", [
    (FAST, "strict saddle", 4, "yes"),
    (FAST, "one-sided saddle", 4, "partly"),  # earlier by the test, the stalls no strict saddles
    (FAST, "strict saddle", 1, "partly"),  # the perturbation does not escape the stalls
    (FAST, "one-sided saddle", 1, "partly"),  # PGD faster, but not by the claimed mechanism
    # not significant is no refutation: strict saddles that perturbations escape are 'partly'
    (SLOW, "strict saddle", 4, "partly"),
    # the ablations refute the mechanism: no strict saddle, perturbations rarely escape
    (SLOW, "one-sided saddle", 1, "no"),
])
def test_item_3_is_judged_from_the_ablations(scripts, tmp_path, times, label, escapes, verdict):
    _escape_tables(tmp_path, *times, label, escapes)
    (row,) = scripts["icrecall_summary"].item3(tmp_path)
    assert row["reproduces"] == verdict
    assert row["ours"].startswith("grounds (the ablations); curvature at GD's step-3000 stalls")
    n = sum(v > 3000 for v in times[1])  # GD stalls at step 3000: 4 (FAST), 3 (SLOW)
    strict = n if label == "strict saddle" else 0
    assert f"{strict} of {n} strict saddles" in row["ours"]
    assert f"there escape {n * escapes}/{5 * n} draws" in row["ours"]
    assert "pgd vs gd:" in row["ours"] and "exact sign test p = " in row["ours"]
    assert "slower, not stuck" in row["ours"]  # every GD run escapes before the cap
    assert "exact McNemar" in row["ours"] and ">= 0.95" in row["rule"]
    assert ("is not significant, which alone refutes nothing" in row["ours"]) == (times is SLOW)
    assert "never read as a refutation" in row["rule"]


def test_item_3_reports_the_curvature_at_zero(scripts, tmp_path):
    _escape_tables(tmp_path, *FAST, "one-sided saddle", 1)
    states = [metric_rows({"init_eig1": e, "init_tol": 1e-12, "init_grad_norm": g,
                           "init_line_minus": -2.0, "init_line_plus": -2.0,
                           "init_escape_radius": 0.1}, "icrecall_dynamics_states", 0,
                          settings=key(seed=s)) for s, (e, g) in enumerate(
                              [(-20.0, 1.0), (-22.0, 2.0), (-30.0, 1.5)])]
    frames = [read_shard(tmp_path / "dynamics.parquet"), *states]
    save(frames, "dynamics", tmp_path)
    (row,) = scripts["icrecall_summary"].item3(tmp_path)
    assert ("at W_PP = 0 (the start): 3 of 3 seeds a strict saddle, lowest eigenvalue median "
            "-22.0, |grad| median 1.50") in row["ours"]


def test_item_3_says_stuck_when_gd_is_censored(scripts, tmp_path):
    nan = float("nan")
    _escape_tables(tmp_path, [10.0] * 6, [nan, nan, 50.0, nan, 100.0, nan], "strict saddle", 4)
    (row,) = scripts["icrecall_summary"].item3(tmp_path)
    assert "2/6 escape by step 50000 (4 stuck to the cap)" in row["ours"]
    assert "gd >50000/>50000/50/>50000/100/>50000" in row["ours"]


def _samples(out: Path, name: str, law, d: str, ns=(1000, 100000), top=None) -> None:
    """A samples table (runs, settings and ideal-row capacity): seed s at n reaches P(conf)
    top(n, s) (default 0.999) from N = law(n, s) on, 0.9 below (never when law gives nan)."""
    runs = []
    for n in ns:
        for s in range(4):
            star = law(n, s)
            for N in (2, 4, 8, 16, 32, 64, 128):
                p = (top(n, s) if top else 0.999) if star == star and N >= star else 0.9
                runs.append(({"n": n, "N": N, "seed": s}, {**GOOD, "relation_prob_confusing": p}))
    cap = [metric_rows({"d_model": 1897.0, "relation_prob_confusing": 0.999},
                       "icrecall_samples_capacity", 0, settings=key(n=n, d=d, state="ideal"))
           for n in ns]
    st = make_rows([{"metric": "d_scale", "value": 6.0}, {"metric": "max_N", "value": 128.0}],
                   model="icrecall", analysis="icrecall_samples_settings")
    _write(out, name, "icrecall_samples", runs, [*cap, st])


def _half_below(n, s):
    """Half the seeds at the largest n top out at 0.99: they never reach 0.995."""
    return 0.99 if n == 100000 and s < 2 else 0.999


@pytest.mark.parametrize("law,top,verdict", [
    (lambda n, s: 8, None, "yes"),
    (lambda n, s: 2 * (n / 1000) ** 0.5, None, "no"),  # N* ~ sqrt(n): faster than polylog
    (lambda n, s: float("nan") if n == 100000 and s < 2 else 8, None, "undecided"),
    (lambda n, s: 8, _half_below, "partly"),  # yes up to 0.99, undecided at 0.995
])
def test_item_4_judged_on_the_fixed_d_memory_over_thresholds(scripts, tmp_path, law, top,
                                                              verdict):
    _samples(tmp_path, "samples", lambda n, s: 2 * (n / 1000) ** 0.5, "scaled")  # not judged
    _samples(tmp_path, "samples_fixed_d", law, "fixed", top=top)
    (row,) = scripts["icrecall_summary"].item4(tmp_path)
    assert row["reproduces"] == verdict
    assert "fixed d (one memory sized for the largest n" in row["ours"]
    assert "margin is fixed by construction" in row["ours"]
    assert row["ours"].count("target 0.995") == 2  # both memories, every threshold
    if verdict != "yes":
        assert "-> undecided" in row["ours"] or "-> no" in row["ours"]
    if top is not None:
        fixed = row["ours"].split(" | ")[0]
        assert "target 0.99: median N* 8/8" in fixed and "-> yes" in fixed
        assert "target 0.995: median N* 8/unknown" in fixed
        assert "2 of 8 (n, seed) never reach it -> undecided" in fixed


def test_item_4_where_the_grid_floor_binds(scripts, tmp_path):
    """N* = 2 (the smallest N tried) at every n reads 'undecided', not 'yes'; steep growth from
    the floor at the smallest n still reads 'no' (a smaller true N* there only steepens it)."""
    _samples(tmp_path, "samples_fixed_d", lambda n, s: 2, "fixed", ns=(1000, 10000, 100000))
    (row,) = scripts["icrecall_summary"].item4(tmp_path)
    assert row["reproduces"] == "undecided"
    assert "5 seeds" not in row["ours"] and "polylog bound (log-log slope of (log n)^2) 0.222: " \
        in row["ours"]
    assert ("target 0.95: median N* 2/2/2, slope 0.00 [0.00, 0.00], 0 of 12 (n, seed) never "
            "reach it; the median sits on the grid floor (N* = 2: at most 2) at n = "
            "1000/10000/100000, which rules out 'yes' and 'no' -> undecided") in row["ours"]
    assert "the grid floor" in row["rule"]
    _samples(tmp_path, "samples_fixed_d", lambda n, s: {1000: 2, 10000: 16, 100000: 128}[n],
             "fixed", ns=(1000, 10000, 100000))
    (row,) = scripts["icrecall_summary"].item4(tmp_path)
    assert row["reproduces"] == "no"
    assert "at n = 1000, which rules out 'yes' -> no" in row["ours"]


def test_slopes_print_without_a_negative_zero(scripts):
    two = sys.modules["icrecall_summary_parts"]._two  # imported by the summary script
    assert [two(x) for x in (-0.0, -0.004, 0.004, -0.02, 0.901)] == \
        ["0.00", "0.00", "0.00", "-0.02", "0.90"]


def test_item_4_without_a_fixed_d_memory_is_undecided(scripts, tmp_path):
    _samples(tmp_path, "samples", lambda n, s: 8, "scaled")
    (row,) = scripts["icrecall_summary"].item4(tmp_path)
    assert row["reproduces"] == "undecided"
    assert "not decidable from these runs" in row["ours"]


@pytest.mark.parametrize("change,verdict", [({}, "yes"), ({"relation_sampled": 0.9}, "partly"),
                                            ({"offpair_mass": 0.5, "answer_sampled": 0.1}, "no")])
def test_item_5_needs_pattern_and_accuracy(scripts, tmp_path, change, verdict):
    runs = [({"method": "pgd", "seed": 0}, {**GOOD, **change})]
    frames = [metric_rows({"memory_answer_recall": 0.875}, "icrecall_pretrained_memory", 1,
                          settings=key(part="memory")),
              *[metric_rows(m, "icrecall_pretrained", 1, settings=key(**kv)) for kv, m in runs],
              metric_rows({**GOOD, "final_train_loss": 2e-4}, "icrecall_pretrained_long", 20000,
                          settings=key(method="pgd", seed=0)),
              metric_rows({"ideal_row_train_loss": 1e-4}, "icrecall_pretrained_long_ideal",
                          20000)]
    save(frames, "pretrained", tmp_path)
    (row,) = scripts["icrecall_summary"].item5(tmp_path)
    assert row["reproduces"] == verdict
    assert "memory's own answer recall 0.8750" in row["ours"]
    assert "PGD seed 0 trained 20000 steps" in row["ours"]
    assert "training loss 2.0e-04 (the ideal row's on the same prompts 1.0e-04)" in row["ours"]
    pattern = {"yes": "yes", "partly": "yes", "no": "no"}[verdict]
    assert f"; pattern rule ({pattern}): P(conf) < 0.9900 on 0/1 seeds" in row["ours"]
    assert "P(conf) discriminates on the memory" in row["rule"]


@pytest.mark.parametrize("ideal,uniform,verdict,discriminates", [
    ({"relation_sampled": 0.9988, "n_all": 20000}, 0.9757, "no", False),
    ({}, 0.9757, "yes", False),
    ({}, 0.30, "yes", True),
    ({"relation_prob_confusing": 0.98}, 0.30, "yes", False),  # the ideal row misses it too
])
def test_item_5_says_what_the_memory_allows_whatever_the_attention(scripts, tmp_path, ideal,
                                                                    uniform, verdict,
                                                                    discriminates):
    pre = [metric_rows(m, "icrecall_controls", 1, settings=key(state=st))
           for st, m in (("ideal", {**GOOD, **ideal}),
                         ("uniform", {**UNIFORM, "relation_prob_confusing": uniform}))]
    runs = [metric_rows(GOOD, "icrecall_pretrained", 1, settings=key(method="pgd", seed=0))]
    save(pre + runs, "pretrained", tmp_path)
    _write(tmp_path, "controls", "icrecall_controls", [({"state": "uniform"}, UNIFORM)])
    (row,) = scripts["icrecall_summary"].item5(tmp_path)
    n = ideal.get("n_all", GOOD["n_all"])
    lo = wilson(round(ideal.get("relation_sampled", GOOD["relation_sampled"]) * n), n)[0]
    assert f"the ideal row's own sampled relation {ideal.get('relation_sampled', 0.9999):.5f}" \
        f" (Wilson lower bound {lo:.5f}; item-2 rule: {verdict})" in row["ours"]
    assert ("caps the sampled accuracy" in row["ours"]) == (verdict != "yes")
    i = ideal.get("relation_prob_confusing", GOOD["relation_prob_confusing"])
    assert (f"reference rows on this memory: uniform row P(conf) {uniform:.4f}, ideal row "
            f"{i:.4f}; the constructed memory's uniform row: 0.0680: ") in row["ours"]
    assert ("P(conf) discriminates (attention spread over" in row["ours"]) == discriminates
    assert ("P(conf) does not discriminate" in row["ours"]) == (not discriminates)


@pytest.mark.parametrize("k2,k3,verdict,absolute", [
    (GOOD, GOOD, "yes", "yes"),
    # the k = 2 control itself leaves 0.079 off the pairs: k = 3 doing the same passes
    ({**GOOD, "offpair_mass": 0.079}, {**GOOD, "offpair_mass": 0.07}, "yes", "partly"),
    ({**GOOD, "offpair_mass": 0.079}, {**GOOD, "offpair_mass": 0.3}, "no", "no"),
    # P(conf) below the control's: attention on fewer pairs
    ({**GOOD, "relation_prob_confusing": 0.9973}, ONE_PAIR, "no", "no"),
])
def test_item_6_is_judged_relative_to_the_k2_control(scripts, tmp_path, k2, k3, verdict,
                                                       absolute):
    _write(tmp_path, "kpairs", "icrecall_kpairs",
           [({"k": 2, "seed": s}, k2) for s in range(2)]
           + [({"k": 3, "seed": s}, k3) for s in range(2)])
    (row,) = scripts["icrecall_summary"].item6(tmp_path)
    assert row["reproduces"] == verdict
    assert row["ours"].startswith("k=2: pattern passes on 2/2 seeds")  # by construction
    assert f"(absolute rule: {absolute}); sampled accuracy" in row["ours"].split(" | k=3: ")[1]
    reason = row["ours"].split(f"; why '{verdict}': ")[1]  # the reason is in the summary
    assert reason.startswith("k=3: P(conf) < 0.9900 on ")
    assert ("the within-pair equality generalises" in reason) == (k3["pair_gap_max"] <= 0.05)
    fails_tell = k3["relation_prob_confusing"] < 0.99
    assert ("what fails is telling the relation" in reason) == fails_tell
    assert f"on {2 if fails_tell else 0}/2 seeds" in reason


def test_item_6_reason_names_the_failing_part(scripts, tmp_path):
    """Equal weight within pairs but P(conf) short: the reason says so, from the table."""
    _write(tmp_path, "kpairs", "icrecall_kpairs",
           [({"k": 2, "seed": s}, GOOD) for s in range(2)]
           + [({"k": 3, "seed": s}, {**GOOD, "relation_prob_confusing": 0.95 + s / 100})
              for s in range(2)])
    (row,) = scripts["icrecall_summary"].item6(tmp_path)
    assert row["reproduces"] == "no"
    assert ("why 'no': k=3: P(conf) < 0.9900 on 2/2 seeds (min 0.9500), within-pair gap > "
            "0.050 on 0/2, mass on s_query+'?' > 0.050 on 0/2; the within-pair equality "
            "generalises (every seed's gap <= 0.050 at every k > 2); what fails is telling the "
            "relation on confusing prompts: P(conf) below the limit 0.9900 on 2/2 runs") \
        in row["ours"]


def test_combine_verdicts():
    f = V.combine
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
