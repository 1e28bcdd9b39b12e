"""Trainer: SGD semantics, exact resume, tidy rows, schedule arithmetic, CLI validation."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

from pythia_probe import theory
from pythia_probe.linalg import frobenius_cosine
from pythia_probe.results import read_manifest, read_results, validate
from pythia_probe.stats.reference import reference_stats
from pythia_probe.toy import leading, paper
from pythia_probe.toy import train as tt
from pythia_probe.toy.model import AttnOnlyTransformer, ToyConfig

D_VOCAB, T, N = 12, 6, 16


def corpus() -> torch.Tensor:
    return torch.randint(0, D_VOCAB, (N, T + 1), generator=torch.Generator().manual_seed(3))


def config(out: Path, epochs: int, **kw) -> tt.TrainConfig:
    base = dict(layers=2, tokenizer=f"word:{D_VOCAB}", seq_len=T, n_seqs=N, lr=0.5, epochs=epochs,
                batch_size=4, log_every=2, checkpoint_every=2, out=str(out))
    return tt.TrainConfig(**{**base, **kw})


def run_train(cfg: tt.TrainConfig, start: AttnOnlyTransformer | None = None, start_step=0):
    seqs = corpus()
    sched = tt.make_schedule(cfg, N)
    stats = reference_stats(tt.theory_batch(seqs, sched), D_VOCAB)
    model = start or AttnOnlyTransformer(ToyConfig(D_VOCAB, T, cfg.layers))
    tt.train(model, seqs, stats, cfg, sched, tt.TrainRun(Path(cfg.out), start_step, "r"))
    return model


def test_resumed_run_equals_uninterrupted(tmp_path):
    full = run_train(config(tmp_path / "full", epochs=3))
    run_train(config(tmp_path / "cut", epochs=1))
    step, state = tt.latest_checkpoint(tmp_path / "cut")
    assert step == 4
    resumed = AttnOnlyTransformer(ToyConfig(D_VOCAB, T, 2))
    resumed.load_state_dict(state)
    run_train(config(tmp_path / "cut", epochs=3), start=resumed, start_step=step)
    for name, p in full.state_dict().items():
        assert torch.equal(p, resumed.state_dict()[name]), name
    keys = ["step", "metric", "layer"]
    a = read_results(tmp_path / "full").sort_values(keys).reset_index(drop=True)
    b = read_results(tmp_path / "cut").sort_values(keys).reset_index(drop=True)
    assert len(a) == len(b) > 0
    assert (a["value"] == b["value"]).all()


def test_rows_are_tidy_and_cover_every_layer(tmp_path):
    run_train(config(tmp_path, epochs=2))
    df = validate(read_results(tmp_path))
    assert sorted(df["step"].unique()) == [2, 4, 6, 8]
    last = df[df["step"] == 8]
    for metric in ("cos_W_Qbar", "cos_V_PhiBT", "cos_P_Delta", "relerr_W_Qbar"):
        assert sorted(last.loc[last["metric"] == metric, "layer"]) == [1, 2]  # 1-based
    w_o = last[last["metric"] == "cos_W_O_Bbar"]
    assert len(w_o) == 1 and w_o["layer"].isna().all()
    assert (df["model"] == tt.MODEL_NAME).all() and df["value"].map(math.isfinite).all()
    # step 2: W is still exactly zero (its leading term starts at s = 3): no cosine is written
    step2 = df[df["step"] == 2]
    assert "cos_W_Qbar" not in set(step2["metric"])


def test_first_step_is_plain_sgd(tmp_path):
    cfg = config(tmp_path, epochs=1, batch_size=0, log_every=1, checkpoint_every=1)
    seqs = corpus()
    model = AttnOnlyTransformer(ToyConfig(D_VOCAB, T, 2), dtype=torch.float64)
    loss = tt.sgd_step(model, list(model.parameters()), seqs, cfg.lr, micro_batch=4)
    assert loss == pytest.approx(math.log(D_VOCAB))
    Bbar = reference_stats(seqs, D_VOCAB)["Bbar"]
    torch.testing.assert_close(model.W_O.detach(), cfg.lr * Bbar, rtol=1e-10, atol=1e-14)


def test_micro_batches_equal_one_batch():
    seqs = corpus()
    models = [AttnOnlyTransformer(ToyConfig(D_VOCAB, T, 2), dtype=torch.float64) for _ in range(2)]
    for micro, m in zip((0, 4), models, strict=True):
        for _ in range(4):
            tt.sgd_step(m, list(m.parameters()), seqs, 0.5, micro_batch=micro)
    for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-14)


def test_schedule_shuffles_per_epoch_and_full_batch_is_identity():
    sched = tt.Schedule(n_seqs=10, batch=3, epochs=2, seed=0, log_every=1, checkpoint_every=1)
    assert sched.steps_per_epoch == 3 and sched.total_steps == 6
    first = torch.cat([sched.batch_indices(s) for s in range(3)])
    assert len(set(first.tolist())) == 9
    assert not torch.equal(sched.permutation(0), sched.permutation(1))
    full = tt.Schedule(10, 10, 1, 0, 1, 1)
    assert torch.equal(full.batch_indices(0), torch.arange(10))


def test_config_errors():
    with pytest.raises(ValueError, match="tokenizer"):
        tt.TrainConfig(tokenizer="spm")
    with pytest.raises(ValueError, match="lr"):
        tt.TrainConfig(lr=-1.0)
    with pytest.raises(ValueError, match="--batch-size 10 exceeds --n-seqs 5"):
        tt.TrainConfig(batch_size=10, n_seqs=5)
    with pytest.raises(ValueError, match="word:K or bpe:K"):
        tt.TrainConfig(tokenizer="word")
    with pytest.raises(ValueError, match="multiple of log_every"):
        tt.make_schedule(tt.TrainConfig(n_seqs=8, batch_size=2, log_every=3,
                                        checkpoint_every=4), 8)


def cli_args(out: Path, epochs: int, *extra: str) -> list[str]:
    return ["--dataset", "builtin", "--stories", "40", "--n-seqs", "16", "--seq-len", "24",
            "--layers", "2", "--batch-size", "8", "--epochs", str(epochs), "--lr", "0.3",
            "--log-every", "2", "--out", str(out), *extra]


def test_cli_end_to_end_and_resume(tmp_path, capsys):
    assert tt.main(cli_args(tmp_path / "full", 3)) == 0
    assert tt.main(cli_args(tmp_path / "cut", 1)) == 0
    first_id = read_manifest(tmp_path / "cut")["run_id"]
    assert tt.main(cli_args(tmp_path / "cut", 3)) == 0
    resumed_manifest = read_manifest(tmp_path / "cut")
    assert resumed_manifest["earlier_run_ids"] == [first_id]
    assert resumed_manifest["resumed_from_step"] == 2
    assert tt.main(cli_args(tmp_path / "cut", 3)) == 0  # finished: nothing rewritten
    assert read_manifest(tmp_path / "cut") == resumed_manifest
    cfg, full, stats, data = tt.load_run(tmp_path / "full")
    _, resumed, _, _ = tt.load_run(tmp_path / "cut")
    assert cfg.epochs == 3 and data.tokens.shape == (16, 25)
    for name, p in full.state_dict().items():
        assert torch.equal(p, resumed.state_dict()[name]), name
    df = read_results(tmp_path / "full")
    assert sorted(df.loc[df["analysis"] == tt.ANALYSIS, "step"].unique()) == [2, 4, 6]
    assert df["stats_id"].notna().all()
    first = reference_stats(data.tokens[tt.make_schedule(cfg, 16).batch_indices(0)],
                            data.d_vocab)
    torch.testing.assert_close(stats["Bbar"], first["Bbar"])
    # the batch ceiling: each first-batch leading term against the whole training set's
    ceiling = df[df["analysis"] == "toy_batch_ceiling"].set_index("metric")["value"]
    whole = reference_stats(data.tokens, data.d_vocab)
    assert len(ceiling) == 4
    for w, suffix in paper.PAIRS.items():
        term = theory.LEADING_TERM[w]
        want = frobenius_cosine(first[term], whole[term])
        assert ceiling[f"batch_ceiling_{suffix}"] == pytest.approx(want, abs=1e-5), w
        assert want < 1 - 1e-4  # 8 of 16 sequences: the batch differs from the whole set
    printed = capsys.readouterr().out
    assert "batch ceiling" in printed and "noise floor" not in printed
    assert "0.999496" in printed and "lr 0.3 (paper 0.005)" in printed
    assert f"{ceiling['batch_ceiling_W_O_Bbar']:.6f}" in printed


def test_cli_refuses_to_resume_with_other_settings(tmp_path):
    assert tt.main(cli_args(tmp_path, 1)) == 0
    with pytest.raises(ValueError, match="different settings.*lr"):
        tt.main([*cli_args(tmp_path, 2), "--lr", "0.1"])


LAUNCHERS = {
    "accelerate": ["-m", "accelerate.commands.launch", "--cpu", "--num_processes", "2",
                   "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                   "--main_process_port", "0", "-m", "pythia_probe.toy.train"],
    "torchrun": ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                 "-m", "pythia_probe.toy.train"],
}


@pytest.mark.slow
@pytest.mark.parametrize("launcher", list(LAUNCHERS))
def test_data_parallel_matches_single_process(tmp_path, launcher):
    """Two CPU processes (gloo) under `accelerate launch` or `torchrun` give the single-process
    weights: ranks come from the Ranks built at the entry point, one share of each batch each."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, *LAUNCHERS[launcher], *cli_args(tmp_path / "ddp", 2)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("Table 1: min over logged steps") == 1  # rank 0 alone reports
    assert tt.main(cli_args(tmp_path / "one", 2)) == 0
    _, ddp, _, _ = tt.load_run(tmp_path / "ddp")
    _, one, _, _ = tt.load_run(tmp_path / "one")
    # Two processes sum each batch's gradient in another order than one process: float32
    # (unit roundoff u = 2^-24 ~ 6e-8) rounding of those sums, carried through the run's steps,
    # moves entries by a few u times the tensor's own scale, so an entry near 0 can differ far
    # more than rtol allows. Compared per tensor against its scale: within 170 u (1e-5) of it,
    # far below what a wrong share of a batch gives (order 1), whatever the machine's load.
    for name, p in one.state_dict().items():
        q = ddp.state_dict()[name]
        scale = float(p.abs().max())
        assert float((q - p).abs().max()) <= 1e-5 * scale, (name, float((q - p).abs().max()),
                                                            scale)
    assert float(one.V.detach().abs().max()) > 0
    keys = ["step", "metric", "layer"]
    a = read_results(tmp_path / "ddp").sort_values(keys).reset_index(drop=True)
    b = read_results(tmp_path / "one").sort_values(keys).reset_index(drop=True)
    assert a[keys].equals(b[keys])
    loss_a, loss_b = (x.loc[x["metric"] == "loss", "value"].to_numpy() for x in (a, b))
    assert loss_a == pytest.approx(loss_b, rel=1e-5)  # the rank losses are averaged


def test_zero_layers_and_a_truncated_checkpoint_are_one_line_errors(tmp_path, capsys):
    from pythia_probe.cli import run_main
    from pythia_probe.errors import CorruptFileError
    assert run_main(lambda: tt.main(cli_args(tmp_path / "z", 1, "--layers", "0")), "p") == 2
    assert "layers must be >= 1" in capsys.readouterr().err
    assert not (tmp_path / "z").exists()  # refused before any file was written
    out = tmp_path / "run"
    assert tt.main(cli_args(out, 1)) == 0
    ckpt = next((out / "checkpoints").glob("step*.safetensors"))
    assert [p.name for p in (out / "checkpoints").iterdir()] == [ckpt.name]  # no temp files
    ckpt.write_bytes(ckpt.read_bytes()[:50])
    with pytest.raises(CorruptFileError, match=f"{ckpt.name} is unreadable"):
        tt.main(cli_args(out, 2))


def test_runs_saved_under_the_old_field_names_still_load():
    """Manifests written before the flag vocabulary was unified (data, vocab, builtin_stories,
    max_docs) translate to today's fields, so committed runs resume and reload unchanged."""
    old = {"data": "builtin", "tokenizer": "bpe", "vocab": 1000, "builtin_stories": 400,
           "max_docs": None, "seq_len": 64, "lr": 0.03, "d_vocab": 1000}
    cfg = tt.TrainConfig(**tt.saved_config(old))
    assert (cfg.dataset, cfg.tokenizer, cfg.stories, cfg.docs) == ("builtin", "bpe:1000", 400,
                                                                   None)
    assert cfg.data_config().tokenizer == "bpe" and cfg.data_config().d_vocab == 1000
    assert tt.saved_config({"tokenizer": "word:50", "dataset": "x"})["tokenizer"] == "word:50"


def test_training_flushes_subnormals_without_changing_the_weights(tmp_path):
    """train() flushes subnormal floats on CPU (speed); the weights equal plain SGD steps taken
    without flushing, to float32 rounding."""
    cfg = config(tmp_path, epochs=2, lr=0.03)
    flushed = run_train(cfg)
    plain = AttnOnlyTransformer(ToyConfig(D_VOCAB, T, cfg.layers))
    seqs, sched = corpus(), tt.make_schedule(cfg, N)
    for step in range(sched.total_steps):
        tt.sgd_step(plain, list(plain.parameters()), seqs[sched.batch_indices(step)], cfg.lr)
    assert float(flushed.W.detach().abs().max()) > 0
    for name, p in plain.state_dict().items():
        torch.testing.assert_close(flushed.state_dict()[name], p, rtol=1e-5, atol=1e-30, msg=name)
    assert torch.tensor(1e-40).item() != 0  # the flush ended with training


def test_disk_full_while_a_checkpoint_serialises_is_one_line(tmp_path, monkeypatch, capsys):
    """safetensors reports a full disk in its own exception type: one line naming the file."""
    from safetensors import SafetensorError

    from pythia_probe import fileio
    from pythia_probe.cli import run_main
    from pythia_probe.toy import resume

    def full(tensors, path, metadata=None):
        raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: "
                              "StorageFull, message: \"No space left on device\" })")
    monkeypatch.setattr(resume, "save_file", full)
    monkeypatch.setattr(fileio, "free_bytes", lambda path: 512)
    assert run_main(lambda: tt.main(cli_args(tmp_path / "run", 1)), "toy") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0]
    assert "disk full writing" in err[0] and "theory.safetensors" in err[0], err
    assert "512 bytes free" in err[0]
    assert not list((tmp_path / "run").glob(".*.tmp"))


@pytest.mark.parametrize("manifest", ['[1, 2]', '{"config": 5}', '{"run_id": "x"}',
                                      '{"config": {}, "earlier_run_ids": "x"}'])
def test_a_resume_manifest_of_the_wrong_shape_is_one_line(tmp_path, capsys, manifest):
    from pythia_probe.cli import run_main

    out = tmp_path / "run"
    assert tt.main(cli_args(out, 1)) == 0
    (out / "manifest.json").write_text(manifest)
    capsys.readouterr()
    assert run_main(lambda: tt.main(cli_args(out, 2)), "toy") == 2
    err = capsys.readouterr().err.strip().splitlines()
    # the shared reader (results.read_manifest) or the toy check (resume.run_manifest) refuses it
    assert len(err) == 1 and re.search(
        re.escape(f"{out / 'manifest.json'} is not a ") + "(toy )?run manifest", err[0]), err


def test_default_output_folders_are_outside_the_committed_results():
    """runs/ is git-ignored; results/ holds committed tables."""
    from pythia_probe.toy.icrecall.__main__ import RunFlags

    ignored = (Path(__file__).resolve().parents[1] / ".gitignore").read_text().split()
    assert "/runs/" in ignored
    for out in (tt.TrainConfig().out, RunFlags().out):
        assert Path(out).parts[0] == "runs", out


def test_a_cosine_outside_its_range_is_refused_not_written(tmp_path, monkeypatch):
    from pythia_probe.errors import OutOfRangeError

    a = torch.ones(3, 3)
    assert leading.checked_cosine(a, a, "x") == pytest.approx(1.0)
    assert math.isnan(leading.checked_cosine(a, torch.zeros(3, 3), "x"))  # no direction: no row
    monkeypatch.setattr(leading, "frobenius_cosine", lambda a, b: 2.5e54)  # e.g. corrupt statistics
    with pytest.raises(OutOfRangeError, match="cosine of W_O layer None is 2.5e"):
        run_train(config(tmp_path, epochs=1))
    assert not (tmp_path / "rows").exists()
