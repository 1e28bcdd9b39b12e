"""The Pythia step schedule and every form of the --steps grammar, including the errors."""

import pytest

from pythia_probe.hub import steps
from pythia_probe.hub.steps import PYTHIA_STEPS, StepError, parse_steps


def test_schedule():
    assert len(PYTHIA_STEPS) == 154 and len(set(PYTHIA_STEPS)) == 154
    assert PYTHIA_STEPS[:11] == (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
    assert PYTHIA_STEPS[11:] == tuple(range(1000, 143001, 1000))
    assert steps.revision(143000) == "step143000" and steps.step_of("step143000") == 143000
    assert steps.step_of("main") is None


def test_range_is_every_available_step():
    got = parse_steps("1000-143000")
    assert got == list(range(1000, 143001, 1000)) and len(got) == 143
    assert parse_steps("0-1000") == [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000]


def test_stride_list_and_presets():
    assert parse_steps("1000-143000:5000") == list(range(1000, 143001, 5000))
    assert parse_steps("0,1,2,4,512") == [0, 1, 2, 4, 512]
    assert parse_steps("512, 4 ,4") == [4, 512]
    assert parse_steps("early") == [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    assert parse_steps("all") == list(PYTHIA_STEPS)
    log = parse_steps("log")
    assert log[0] == 0 and log[-1] == 143000 and 1000 in log and 131000 in log
    assert len(log) == len(set(log)) and set(log) <= set(PYTHIA_STEPS) and len(log) < 30
    assert parse_steps("early,143000") == [*parse_steps("early"), 143000]


def test_log_against_brute_force_on_random_schedules():
    import random

    rng = random.Random(0)
    for _ in range(50):
        avail = sorted(rng.sample(range(0, 5000), 20))
        ref = {avail[0], avail[-1]}
        for k in range(13):
            if 2**k <= avail[-1]:
                ref.add(min(avail, key=lambda s, k=k: (abs(s - 2**k), s)))
        assert steps.log_steps(avail) == sorted(ref)


@pytest.mark.parametrize(
    "spec, match",
    [
        ("1500", r"step 1500 is not available.*nearest valid steps: 1000, 2000"),
        ("3", r"step 3 .*nearest valid steps: 2, 4"),
        ("150000", r"nearest valid steps: 143000"),
        ("1000-143000:1500", r"step 2500 is not available.*2000, 3000"),
        ("1001-2000", r"step 1001 .*1000, 2000"),
        ("2000-1000", "empty range"),
        ("1000-2000:0", "stride must be positive"),
        ("first", "cannot parse.*early, all, log"),
        ("1,,2", "empty item"),
        ("", "empty item"),
    ],
)
def test_errors_name_nearest_valid_steps(spec, match):
    with pytest.raises(StepError, match=match):
        parse_steps(spec)


def test_custom_available_and_hub_branches():
    assert parse_steps("10-30", available=[0, 10, 20, 30, 40]) == [10, 20, 30]

    class Ref:
        def __init__(self, name):
            self.name = name

    class FakeApi:
        def list_repo_refs(self, model_id):
            return type("R", (), {"branches": [Ref("main"), Ref("step20"), Ref("step3")]})()

    assert steps.available_steps("someone/model", api=FakeApi()) == [3, 20]
    assert steps.available_steps("EleutherAI/pythia-70m") == list(PYTHIA_STEPS)
    with pytest.raises(StepError, match="no step"):
        FakeApi.list_repo_refs = lambda self, m: type("R", (), {"branches": [Ref("main")]})()
        steps.available_steps("someone/model", api=FakeApi())


def test_available_steps_names_model_and_hub_when_listing_fails():
    class DeadHub:
        endpoint = "http://127.0.0.1:9"

        def list_repo_refs(self, model_id):
            raise OSError("Name or service not known")

    with pytest.raises(ConnectionError, match=r"EleutherAI/pythia-1.4b on http://127.0.0.1:9.*"
                                              r"Name or service not known"):
        steps.available_steps("EleutherAI/pythia-1.4b", api=DeadHub())
