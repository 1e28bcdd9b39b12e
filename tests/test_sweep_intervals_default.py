"""Issue 19 item 2: the sweep asks for document groups by default (its own statistics carry the
ceiling and intervals), the G + 1 scorings share one forward pass in the plan's arithmetic, and
the plan says whether the rows will have the scale columns."""

import pytest

from pythia_probe.analysis.plan import StepShape, memory_plan, with_groups
from pythia_probe.errors import BadInputError
from pythia_probe.stats.groups import DEFAULT_GROUPS
from pythia_probe.stats.recipe import Recipe, cache_path
from pythia_probe.sweep.config import ScoringConfig, SweepConfig
from pythia_probe.sweep.plan import intervals_line


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
    plan = memory_plan(shape, ["embedding", "attention"], mode="memory")
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
    from pythia_probe.sweep.plan import check_step_fits

    shape = StepShape(5000, 64, 3, 4, 256, 10**6)
    plan = memory_plan(shape, ["embedding", "attention"], mode="memory")
    grouped = with_groups(plan, 10)
    sc = ScoringConfig(("embedding", "attention"))
    budget = (plan.total * 1.01, "a test's budget")
    check_step_fits(plan, sc, budget)  # fits without the 12 more target sets
    with pytest.raises(ResourceError, match="--no-intervals") as err:
        check_step_fits(grouped, sc, budget)
    assert f"{plan.targets / 1e9:.2f} GB of targets" in str(err.value)
