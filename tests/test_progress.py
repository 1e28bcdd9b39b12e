"""The job's one progress display: its time estimate comes from measured rates only."""

import pytest

from pythia_probe import progress
from pythia_probe.progress import JobProgress, Stage


@pytest.fixture
def clock(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    return now


def test_eta_from_measured_rates_and_the_stage_a_stage_resembles(clock):
    job = JobProgress([Stage("pass 1", 1000, "tok"), Stage("pass 2", 1000, "tok", like="pass 1"),
                       Stage("sweep", 10, "step")], disable=True)
    update = job.stage("pass 1")
    assert job.eta() is None  # nothing measured yet
    clock[0] += 2.0
    update(200)  # 100 tok/s
    assert job.stages["pass 1"].rate == pytest.approx(100.0)
    assert job.eta() is None  # the sweep's rate is unknown until a step has run
    clock[0] += 8.0
    update(800)
    update = job.stage("pass 2")
    clock[0] += 1.0
    update(400)  # pass 2 runs at 400 tok/s: its own rate replaces pass 1's
    assert job.stages["pass 2"].rate == pytest.approx(400.0)
    update = job.stage("sweep")
    clock[0] += 30.0
    update(1)  # 30 s per step measured
    assert job.eta() == pytest.approx(9 * 30.0)
    job.close()


def test_unknown_total_gives_no_estimate(clock):
    job = JobProgress([Stage("pass 1", None, "tok")], disable=True)
    update = job.stage("pass 1")
    clock[0] += 1
    update(10)
    assert job.eta() is None
    update = job.stage("pass 1", total=20)
    assert job.eta() == pytest.approx(1.0)


def test_no_empty_bar_before_the_first_stage(capsys):
    """The display appears when a stage starts, not as an empty bar during the planning."""
    job = JobProgress([Stage("sweep", 3, "step")])
    assert capsys.readouterr().err == ""
    job.counter("sweep").update(1)
    job.close()
    assert "[1/1] sweep" in capsys.readouterr().err
    JobProgress([Stage("sweep", 3, "step")]).close()
    assert capsys.readouterr().err == ""
