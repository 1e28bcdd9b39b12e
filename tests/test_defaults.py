"""Every command's no-flag run works offline on its built-in default. What a test can afford
runs as is (corpus inspect); the toy trainer's default is checked against the built-in corpus
without training and stats compute runs with fewer stories (benchmarks/bench_defaults.py times
the real no-flag runs). The paper's toy scale is one preset away."""

import dataclasses

import pytest

from pythia_probe.__main__ import main
from pythia_probe.cli import parse_config
from pythia_probe.toy.config import PRESETS, TrainConfig, make_schedule, with_preset
from pythia_probe.toy.data import load_toy_data
from pythia_probe.toy.icrecall.__main__ import CONFIGS

PAPER = dict(dataset="roneneldan/TinyStories", layers=3, tokenizer="word:3000", seq_len=200,
             n_seqs=65536, batch_size=2048, micro_batch=512, epochs=100, lr=0.005,
             out="runs/toy_paper")


def test_toy_default_fits_the_builtin_corpus():
    """The default run's sequences exist in the default built-in corpus (the old default,
    65,536 sequences of 201 tokens, had 14,270) and its schedule is whole batches."""
    cfg = TrainConfig()
    assert cfg.dataset == "builtin" and cfg.preset is None
    data = load_toy_data(cfg.data_config())
    assert tuple(data.tokens.shape) == (cfg.n_seqs, cfg.seq_len + 1)
    sched = make_schedule(cfg, len(data.tokens))
    assert sched.total_steps == cfg.epochs * cfg.n_seqs // cfg.batch_size >= 8


def test_toy_preset_paper_is_table_1_and_typed_flags_win():
    def parsed(*argv):
        return parse_config(TrainConfig, with_preset(list(argv)), "toy")

    assert dataclasses.asdict(parsed("--preset", "paper")) == dataclasses.asdict(
        TrainConfig(**PAPER, preset="paper"))
    assert parsed("--epochs", "3", "--preset=paper").epochs == 3
    assert parsed("--preset", "paper", "--out", "elsewhere").out == "elsewhere"
    assert set(PRESETS) == {"paper"}


def test_toy_unknown_preset_is_one_line(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["toy", "--preset", "papr"])
    assert stop.value.code == 2
    assert "--preset: invalid choice: 'papr' (choose from 'paper')" in capsys.readouterr().err


def test_corpus_inspect_runs_on_its_defaults(capsys):
    assert main(["corpus", "inspect"]) == 0
    assert "2000" in capsys.readouterr().out.replace(",", "")


def test_stats_compute_default_runs_offline_on_the_builtin_corpus(tmp_path, monkeypatch,
                                                                   capsys):
    """Only --stories and --out differ from the no-flag run."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "stats.safetensors"
    assert main(["stats", "compute", "--stories", "300", "--out", str(out)]) == 0
    assert out.stat().st_size > 0 and f"wrote {out}" in capsys.readouterr().out


@pytest.mark.parametrize("cls", [TrainConfig, *CONFIGS])
def test_default_configs_validate(cls):
    cls()  # every flag has a default that passes its own checks
