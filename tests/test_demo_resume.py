"""--demo's training killed by a real signal mid-training resumes from its newest checkpoint:
the checkpoints and the final table equal an uninterrupted run's."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from pythia_probe import demo
from pythia_probe.results import read_results

SMALL = dict(n_stories=150, seq_len=32, n_layers=2, d_model=32, n_heads=4, d_mlp=64,
             batch_size=16, max_step=8, save_every=16, lr=1e-2, warmup=4)
KEY = ["step", "analysis", "layer", "head", "metric"]
#: trains SMALL into argv[1] under the commands' signal handling, stopping for good right after
#: the checkpoint of step 4 (of 8) is saved, so that the signal lands mid-training
SCRIPT = """
import sys, time
from pythia_probe import demo
from pythia_probe.cli import run_main
save = demo.save_train_state
def slow(out, opt, g, losses, step, cfg):
    save(out, opt, g, losses, step, cfg)
    if step == 4:
        print("step 4 saved", flush=True)
        time.sleep(600)
demo.save_train_state = slow
cfg = demo.DemoConfig(**{small!r})
raise SystemExit(run_main(lambda: demo.build_demo_model(cfg, sys.argv[1], progress=False) and 0,
                          "demo"))
"""

pytestmark = pytest.mark.usefixtures("one_thread")


def table(out: Path) -> pd.DataFrame:
    return read_results(out / "run").drop(columns="run_id").sort_values(
        KEY, na_position="first").reset_index(drop=True)


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """An uninterrupted training run (work folder ``clean/w``)."""
    root = tmp_path_factory.mktemp("clean")
    assert demo.build_demo_model(demo.DemoConfig(**SMALL), root / "w" / "demo-neox",
                                 progress=False)["trained"]
    return root


def interrupt(model: Path, signum: int) -> None:
    """Train into ``model`` in a subprocess and stop it with ``signum`` after step 4 of 8."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT.format(small=SMALL), str(model)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "step 4 saved"
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == (-signum if signum == signal.SIGKILL else 128 + signum)
    if signum != signal.SIGKILL:
        assert err.strip().splitlines()[-1] == "demo: interrupted, rerun to resume"
    assert {p.name for p in model.glob("step*")} == {"step0", "step1", "step2", "step4"}


def resumed_as_if_never_stopped(model: Path, clean: Path) -> None:
    """The training in ``model`` (stopped after step 4, then rerun) has the uninterrupted
    run's weights at every checkpoint and its loss history."""
    other = clean / "w" / "demo-neox"
    losses = [load_file(d / demo.STATE_FILE)["losses"] for d in (model, other)]
    assert len(losses[0]) == SMALL["max_step"] and torch.equal(*losses)  # none lost at the stop
    for step in demo.checkpoint_steps(SMALL["max_step"], SMALL["save_every"]):
        a, b = (load_file(d / f"step{step}" / "model.safetensors") for d in (model, other))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), step


def assert_resume_plan(model: Path, work: Path) -> None:
    plan = demo.plan_line(demo.DemoConfig(**SMALL), model, work)
    assert "for 8 steps" in plan and "(resuming from step 4), 5 checkpoints (0, 1, 2, 4, 8)" \
        in plan


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_demo_training_resumes_after_a_signal(tmp_path, clean, signum):
    """The rerun trains steps 4..8 only, to the same weights at every checkpoint and the same
    loss history as the uninterrupted run (SIGKILL: the next test, which reruns the whole
    demo)."""
    model = tmp_path / "demo-neox"
    interrupt(model, signum)
    assert_resume_plan(model, tmp_path)
    info = demo.build_demo_model(demo.DemoConfig(**SMALL), model, progress=False)
    assert info["trained"]
    resumed_as_if_never_stopped(model, clean)


@pytest.mark.slow
def test_killed_demo_rerun_gives_the_uninterrupted_table(tmp_path, clean, monkeypatch, capsys):
    """SIGKILL mid-training, then `--demo` again: the training resumes from step 4 to the
    uninterrupted run's weights and losses, the final table equals a clean run's; the plan is
    printed before the training."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = tmp_path / "w" / "demo-neox"
    interrupt(model, signal.SIGKILL)
    assert_resume_plan(model, tmp_path / "w")
    for root in (tmp_path, clean):
        assert demo.run_demo(root / "r", demo.DemoConfig(**SMALL), work=root / "w",
                             progress=False) == 0
        if root == tmp_path:
            out = capsys.readouterr().out
            assert 0 <= out.index("demo plan: ") < out.index("trained 8 steps")
    resumed_as_if_never_stopped(model, clean)
    pd.testing.assert_frame_equal(table(tmp_path / "r"), table(clean / "r"))


def test_a_state_of_other_settings_is_not_resumed(tmp_path):
    """A state file left by a run of other settings is ignored: training starts at step 0."""
    cfg = demo.DemoConfig(**SMALL)
    tok, tokens, _ = demo.build_data(cfg)
    demo.train(cfg, tmp_path, tokens, n_vocab=len(tok), progress=False)
    assert demo.load_train_state(tmp_path, cfg)[0] == SMALL["max_step"]
    other = demo.DemoConfig(**{**SMALL, "lr": 2e-2})
    assert demo.load_train_state(tmp_path, other) is None
