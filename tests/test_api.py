"""The Python API checks its keywords as the command checks its flags (issue 29.2), and every
``pp.*`` function answers a folder or file that is not what it expects with one user error
(issue 28.7)."""

import json

import pandas as pd
import pytest

import pythia_probe as pp
from pythia_probe.api import sweep_config
from pythia_probe.cli import parse_configs
from pythia_probe.errors import BadInputError, MissingFileError, ResultsError, UserError
from pythia_probe.summary import summary_table
from pythia_probe.sweep.config import SweepConfig


@pytest.mark.parametrize("keywords, says", [
    ({"retries": "2"}, r"run_sweep\(retries='2'\): --retries takes an integer, not str"),
    ({"intervals": "false"}, r"--intervals takes True or False, not str"),
    ({"plots": 0}, r"--plots takes True or False, not int"),
    ({"max_disk_gb": "3"}, r"--max-disk-gb takes a number, not str"),
    ({"analyses": {"embedding": 1}}, r"--analyses takes a comma-separated string or a list"),
    ({"model": None}, r"--model takes a comma-separated string or a list, not NoneType"),
    ({"dtype": "float16"}, r"argument --dtype: invalid choice: 'float16'"),
    ({"top_k": "many"}, r"--top-k 'many': valid: full, or an integer K >= 1"),
    ({"retries": -1}, r"--retries, --prefetch and --max-rank must be >= 0"),
    ({"stepz": "0"}, r"unknown flags \['stepz'\]"),
    ({"out": __file__}, r"--out .*test_api.py is a file: give a results folder"),
])
def test_wrong_keywords_are_the_commands_one_line_errors(keywords, says):
    with pytest.raises(BadInputError, match=says):
        pp.run_sweep(**{"model": "EleutherAI/pythia-70m", **keywords})


def test_keywords_build_the_config_the_command_line_builds():
    """Lists where the command takes a comma-separated list, numbers for numbers, switches
    as True/False: the same SweepConfig as the command's flags, and that command line."""
    cfg, argv = sweep_config({"model": ["org/a", "org/b"], "steps": [0, 2, 4], "top_k": 5000,
                              "analyses": ["embedding", "attention"], "intervals": False,
                              "heads": [2, 13], "max_disk_gb": 3, "progress": True,
                              "out": "o", "device": "cpu"})
    assert argv == ["--model=org/a,org/b", "--steps=0,2,4", "--top-k=5000",
                    "--analyses=embedding,attention", "--no-intervals", "--heads=2,13",
                    "--max-disk-gb=3", "--out=o", "--device=cpu"]
    [fields] = parse_configs([SweepConfig], ["--model", "org/a,org/b", "--steps", "0,2,4",
                                             "--top-k", "5000", "--analyses",
                                             "embedding,attention", "--no-intervals",
                                             "--heads", "2,13", "--max-disk-gb", "3", "--out",
                                             "o", "--device", "cpu"], "sweep")
    assert cfg == SweepConfig(**fields)
    assert cfg.intervals is False and cfg.top_k == "5000" and cfg.models == ("org/a", "org/b")


def test_pp_statistics_of_what_is_no_statistics_is_one_user_error(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "manifest.json").write_text(json.dumps({"run_id": "r", "config": {}}))
    with pytest.raises(ResultsError, match="names no statistics file"):
        pp.statistics(tmp_path / "run")
    (tmp_path / "run" / "manifest.json").write_text(json.dumps(
        {"run_id": "r", "config": {}, "statistics_by_model": {"a": [1]}}))
    with pytest.raises(ResultsError, match="names no statistics file"):
        pp.statistics(tmp_path / "run", model="a")
    with pytest.raises(BadInputError, match="give model= one of \\['a'\\]"):
        pp.statistics(tmp_path / "run", model="b")
    with pytest.raises(MissingFileError, match="no such statistics file or results folder"):
        pp.statistics(tmp_path / "nothing")
    with pytest.raises(BadInputError, match="a folder without manifest.json"):
        pp.statistics(tmp_path)
    (tmp_path / "x.txt").write_text("not statistics")
    with pytest.raises(UserError, match="x.txt"):
        pp.statistics(tmp_path / "x.txt")


def test_pp_read_results_and_summary_table_of_what_is_no_table_are_user_errors(tmp_path):
    with pytest.raises(ResultsError, match="no such folder"):
        pp.read_results(tmp_path / "nothing")
    (tmp_path / "step0.parquet").write_text("garbage")
    with pytest.raises(ResultsError, match="cannot read results shard .*step0.parquet"):
        pp.read_results(tmp_path)
    with pytest.raises(ResultsError, match="cannot read results shard"):
        pp.read_results(tmp_path / "step0.parquet")
    with pytest.raises(ResultsError, match=r"lacks the columns \['model', 'settings'"):
        summary_table(pd.DataFrame({"x": [1]}))


def test_pp_run_sweep_of_a_model_without_the_asked_checkpoints_is_one_user_error(tmp_path,
                                                                                 capsys):
    """A folder holding no step*/ folders, or --steps selecting none of a model's steps: it
    was a ValueError from the plan (max() of no downloads) after the statistics' choice; now
    one line naming the folder or the steps it has, before anything is written."""
    from pythia_probe.cli import run_main
    from pythia_probe.errors import StepError
    from pythia_probe.sweep.__main__ import main as sweep_main
    from pythia_probe.testing.repos import build_pythia_like_repo

    empty, out = tmp_path / "empty", tmp_path / "o"
    empty.mkdir()
    late = build_pythia_like_repo(tmp_path, "org/late", (1000, 2000), with_main=False)
    cases = [(str(empty), "all", rf"--model {empty} has no checkpoints \(no step\*/ folders "
                                 rf"in {empty}\)"),
             (str(late), "early", rf"--steps early selects none of the 2 steps {late} has "
                                  r"\(1000, 2000\)"),
             (f"{empty},{late}", "early", rf"--steps early selects no step of any of the "
                                          rf"models \({empty} has no checkpoints; {late} has "
                                          r"steps 1000, 2000\)")]
    for model, steps, says in cases:
        with pytest.raises(StepError, match=says):
            pp.run_sweep(model=model, steps=steps, out=str(out), dry_run=True)
        assert run_main(lambda m=model, s=steps: sweep_main(
            ["--model", m, "--steps", s, "--out", str(out), "--dry-run"]), "sweep") == 2
        [line] = capsys.readouterr().err.strip().splitlines()
        assert line.startswith("sweep: error: --") and "Traceback" not in line
    assert not out.exists()
