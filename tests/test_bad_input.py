"""Bad input to every command: one line naming what was wrong and what is valid, exit code 2,
no traceback, and nothing written."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from pythia_probe.cli import run_main
from pythia_probe.corpus.__main__ import main as corpus_main
from pythia_probe.plots import main as plots_main
from pythia_probe.stats import batch_stats
from pythia_probe.stats.__main__ import main as stats_main
from pythia_probe.sweep.__main__ import main as sweep_main
from pythia_probe.testing.repos import build_pythia_like_repo
from pythia_probe.toy.train import main as toy_main

COMMANDS = {"corpus": corpus_main, "stats": stats_main, "sweep": sweep_main, "toy": toy_main,
            "plots": plots_main}
NO_CUDA = not torch.cuda.is_available()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    (d / "wrong_field.jsonl").write_text(json.dumps({"body": "x"}) + "\n")
    (d / "int_text.jsonl").write_text(json.dumps({"text": 3}) + "\n")
    pq.write_table(pa.table({"body": ["x"]}), d / "no_column.parquet")
    (d / "corrupt.safetensors").write_bytes(b"\x00" * 64)
    batch_stats(torch.randint(0, 90, (8, 9)), 90).save(d / "stats.safetensors")
    build_pythia_like_repo(d, "org/tiny", (0, 2), with_main=False)
    return d


CASES = [
    ("corpus", ["inspect", "--dataset", "{d}/missing.txt"], "missing.txt does not exist"),
    ("corpus", ["inspect", "--docs", "0"], "--docs >= 1"),
    ("corpus", ["generate", "--out", "{d}/x.csv"], "must name a .txt file"),
    ("corpus", ["inspect", "--dataset", "{d}/wrong_field.jsonl"], "no text field 'text'"),
    ("corpus", ["inspect", "--dataset", "{d}/int_text.jsonl"], "is int, not a string"),
    ("corpus", ["inspect", "--dataset", "{d}/no_column.parquet"], "columns present: ['body']"),
    ("stats", ["compute", "--seq-len", "0"], "--seq-len must be >= 1"),
    ("stats", ["compute", "--tokenizer", "word:many"], "word:K needs an integer"),
    ("stats", ["compute", "--out", "{d}/s.txt"], "must end in .safetensors"),
    ("stats", ["top", "--stats", "{d}/missing.safetensors"], "missing.safetensors"),
    ("stats", ["top", "--stats", "{d}/corrupt.safetensors"], "corrupt.safetensors"),
    ("sweep", ["--model", "{d}/org/tiny", "--stats", "{d}/none.safetensors"],
     "no such statistics file"),
    ("sweep", ["--model", "{d}/org/tyni/", "--stats", "{d}/stats.safetensors"], "org/tyni"),
    ("sweep", ["--model", "{d}/org/tiny", "--stats", "{d}/stats.safetensors", "--steps", "3"],
     "nearest"),
    ("sweep", ["--heads", "x"], "--heads 'x'"),
    ("sweep", ["--top-k", "0"], "--top-k '0': valid: full, or an integer"),
    ("stats", ["compute", "--top-k", "0"], "--top-k '0': valid: full, or an integer K >= 1"),
    ("sweep", ["--top-k", "auto"], "--top-k auto is retired (it meant the full vocabulary): "
                                   "use --top-k full"),
    ("stats", ["compute", "--top-k", "auto"], "--top-k auto is retired"),
    ("sweep", ["--analyses", "embeding"], "unknown analysis"),
    ("toy", ["--layers", "0", "--out", "{d}/toy"], "--layers must be >= 1"),
    ("toy", ["--tokenizer", "word", "--out", "{d}/toy"], "word:K or bpe:K"),
    ("plots", ["--results", "{d}/no_results"], "no *.parquet result shards"),
]
if NO_CUDA:  # a device this machine lacks: one line in every command, dry run included
    CASES += [("stats", ["compute", "--device", "cuda"], "no CUDA device"),
              ("sweep", ["--device", "cuda", "--dry-run"], "no CUDA device"),
              ("sweep", ["--demo", "--device", "cuda", "--work", "{d}/demo"], "no CUDA device"),
              ("toy", ["--device", "cuda", "--out", "{d}/toy"], "no CUDA device")]


@pytest.mark.parametrize("command,argv,says", CASES,
                         ids=[f"{c}:{' '.join(a)[:40]}" for c, a, _ in CASES])
def test_one_line_and_exit_2(files, tmp_path, monkeypatch, capsys, command, argv, says):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHIA_PROBE_TRACEBACK", raising=False)
    before = sorted(p.name for p in files.iterdir())
    argv = [a.format(d=files) for a in argv]
    assert run_main(lambda: COMMANDS[command](argv), command) == 2
    err = capsys.readouterr().err  # log lines (a warning) may come first; the error is one line
    errors = [line for line in err.splitlines() if line.startswith(f"{command}: error: ")]
    assert len(errors) == 1 and err.endswith(errors[0] + "\n") and says in errors[0], err
    assert "Traceback" not in err
    assert sorted(p.name for p in files.iterdir()) == before  # nothing written
    assert not any(tmp_path.iterdir())


def test_empty_text_and_random_bytes_parquet_are_one_line_and_nothing_else(tmp_path, capfd):
    """An empty .txt says "empty corpus" (as `corpus inspect` does), not a --seq-len below 0;
    a .parquet of random bytes is one line, without the datasets library's own line before."""
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "random.parquet").write_bytes(bytes(range(256)) * 8)
    for name, says in (("empty.txt", "empty corpus: "), ("random.parquet", "cannot read ")):
        argv = ["compute", "--dataset", str(tmp_path / name), "--out",
                str(tmp_path / "s.safetensors"), "--log-level", "warning"]
        assert run_main(lambda argv=argv: stats_main(argv), "stats") == 2
        err = capfd.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"stats: error: {says}"), err
        assert str(tmp_path / name) in err and "below 0" not in err
    # at the default log level too: the batch plan's INFO line is logged once the corpus is
    # known not empty (it came before the error line)
    for name, says in (("empty.txt", "empty corpus: "), ("random.parquet", "cannot read ")):
        argv = ["compute", "--dataset", str(tmp_path / name), "--out",
                str(tmp_path / "s.safetensors")]
        assert run_main(lambda argv=argv: stats_main(argv), "stats") == 2
        err = capfd.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"stats: error: {says}"), err
