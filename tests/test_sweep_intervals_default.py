"""Issue 19 item 2: the sweep asks for document groups by default (its own statistics carry the
ceiling and intervals), the G + 1 scorings share one forward pass in the plan's arithmetic, and
the plan says whether the rows will have the scale columns."""

import pandas as pd
import pytest

from pythia_probe.analysis import get_analyses
from pythia_probe.errors import BadInputError
from pythia_probe.planner.step import StepShape, memory_plan, with_groups
from pythia_probe.planner.sweep import intervals_line
from pythia_probe.stats.groups import DEFAULT_GROUPS
from pythia_probe.stats.recipe import Recipe, cache_path
from pythia_probe.sweep.config import ScoringConfig, SweepConfig


def test_the_sweeps_recipe_keeps_groups_by_default():
    parts = SweepConfig(steps="0").split()
    assert parts.statistics.groups == DEFAULT_GROUPS >= 2
    assert parts.scoring.intervals
    assert Recipe().groups == DEFAULT_GROUPS
    none = SweepConfig(steps="0", groups=0).split().statistics
    assert none.groups == 0 and none.used()["groups"] == 0


def test_groups_of_one_are_refused_in_one_line():
    with pytest.raises(BadInputError, match="--groups must be 0"):
        SweepConfig(steps="0", groups=1)


def test_groups_name_another_statistics_file(monkeypatch):
    from pythia_probe.stats import recipe as recipe_mod

    monkeypatch.setattr(recipe_mod, "recipe_shards", lambda r: [])
    fp = {"sha256": "ab", "d_vocab": 10, "scheme": "bpe"}
    a, b = (cache_path(Recipe(groups=g), fp, "/x", []) for g in (10, 0))
    assert a != b and "-G10-" in a.name and "-G" not in b.name


def test_interval_scorings_share_the_forward_pass_in_the_plan():
    shape = StepShape(5000, 64, 3, 4, 256, 10**6)
    plan = memory_plan(shape, get_analyses(["embedding", "attention"]), mode="dense")
    forward = 5000 * 3 * (2 * 64 * 64 + 2 * 64 * 256)
    assert plan.shared_macs >= forward
    G = 10
    grouped = with_groups(plan, G)
    own = plan.dense_macs - plan.shared_macs
    assert own > 0
    assert grouped.dense_macs == pytest.approx(plan.shared_macs + (G + 1) * own)
    assert grouped.dense_macs < (G + 1) * plan.dense_macs
    assert grouped.sparse_macs == (G + 1) * plan.sparse_macs
    assert any("sharing one forward pass" in line for line in grouped.lines())
    assert with_groups(plan, 0) == plan


@pytest.mark.parametrize("intervals,groups,word", [(True, 10, "on, from G = 10"),
                                                   (True, 0, "keep no document groups"),
                                                   (False, 10, "off (--no-intervals)")])
def test_the_plan_says_whether_rows_get_the_scale(intervals, groups, word):
    sc = ScoringConfig(("embedding",), intervals=intervals)
    assert word in intervals_line(sc, groups)


def test_a_step_that_fits_only_without_intervals_is_refused_naming_the_flag():
    from pythia_probe.errors import ResourceError
    from pythia_probe.planner.sweep import check_step_fits

    shape = StepShape(5000, 64, 3, 4, 256, 10**6)
    plan = memory_plan(shape, get_analyses(["embedding", "attention"]), mode="dense")
    grouped = with_groups(plan, 10)
    sc = ScoringConfig(("embedding", "attention"))
    budget = (plan.total * 1.01, "a test's budget")
    check_step_fits(plan, sc, budget)  # fits without the 12 more target sets
    with pytest.raises(ResourceError, match="--no-intervals") as err:
        check_step_fits(grouped, sc, budget)
    assert f"{plan.targets / 1e9:.2f} GB of targets" in str(err.value)


def test_one_set_at_a_time_is_chosen_where_only_it_fits():
    from pythia_probe.planner.step import one_set_at_a_time
    from pythia_probe.planner.sweep import check_step_fits

    plan = with_groups(memory_plan(StepShape(5000, 64, 3, 4, 256, 10**6),
                                   get_analyses(["embedding", "attention"]), mode="dense"), 10)
    alone = one_set_at_a_time(plan)
    assert alone.targets == pytest.approx(3 * plan.targets / 13) and not alone.together
    assert alone.dense_macs > plan.dense_macs  # a forward pass per scoring
    sc = ScoringConfig(("embedding", "attention"))
    assert check_step_fits(plan, sc, (plan.total, "x")) is plan
    got = check_step_fits(plan, sc, ((plan.total + alone.total) / 2, "x"))
    assert got == alone and any("one replicate set at a time" in x for x in got.lines())


def test_a_sweep_holding_one_replicate_set_at_a_time_writes_the_same_table(tmp_path,
                                                                          monkeypatch):
    """A budget between the two plans: the runner picks one set at a time (a forward pass per
    set), records it, and the table equals the run holding every set at once, bit for bit."""
    import torch

    from pythia_probe.planner import sweep as sweep_plan
    from pythia_probe.planner.step import one_set_at_a_time
    from pythia_probe.results import read_manifest, read_results
    from pythia_probe.stats import batch_stats
    from pythia_probe.sweep.__main__ import main as sweep_main
    from pythia_probe.testing.repos import build_pythia_like_repo, tiny_config

    torch.manual_seed(0)
    repo = build_pythia_like_repo(tmp_path / "hub", "org/tiny", (0, 4), tiny_config(),
                                  {0: ("safetensors", 1), 4: ("safetensors", 1)},
                                  with_main=False)
    tokens = torch.randint(0, 90, (40, 17), generator=torch.Generator().manual_seed(1))
    stats = batch_stats(tokens, 90, groups=4).save(tmp_path / "stats.safetensors")
    argv = ["--model", str(repo), "--stats", str(stats), "--steps", "all", "--analyses",
            "embedding,attention", "--dtype", "float64", "--no-plots", "--no-progress"]
    assert sweep_main([*argv, "--out", str(tmp_path / "together")]) == 0
    real = sweep_plan.check_step_fits
    monkeypatch.setattr(sweep_plan, "check_step_fits", lambda plan, sc, budget=None: real(
        plan, sc, ((plan.total + one_set_at_a_time(plan).total) / 2, "between the plans")))
    assert sweep_main([*argv, "--out", str(tmp_path / "alone")]) == 0
    assert read_manifest(tmp_path / "alone")["targets_choice"]["together"] is False
    assert "together" not in read_manifest(tmp_path / "alone")["config"]["scoring"]
    a, b = (read_results(tmp_path / d).drop(columns=["run_id"]) for d in ("together", "alone"))
    assert a["ceiling"].notna().all() and a["ci_low"].notna().all()
    # issue 26's scale: every row its null's SD, a bool test, the corrected ceiling
    assert (a["chance_sd"] > 0).all() and a["above_chance"].notna().all()
    r = a["ceiling_half"]
    assert (a["ceiling"] == (2 * r / (1 + r)) ** 0.5).all() and (a["ceiling"] > r).all()
    has = a["ceiling"] > a["chance"]
    assert a.loc[has, "effect"].notna().all() and a.loc[~has, "effect"].isna().all()
    pd.testing.assert_frame_equal(a, b)
