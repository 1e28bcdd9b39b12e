"""The sweep's structure as the README promises it: one config parsed at the entry point and
split into parts each component takes; no knowledge of the statistics file's layout; ranks
from the entry point only; one word ("targets") for the matrices the cosines compare with."""

import ast
import inspect
from dataclasses import fields
from pathlib import Path

import pytest

from pythia_probe import sweep
from pythia_probe.sweep import config

PACKAGE = Path(__file__).resolve().parents[1] / "pythia_probe"
SWEEP = PACKAGE / "sweep"


def _source(path: Path) -> str:
    return path.read_text()


def test_only_the_entry_point_and_config_know_the_whole_flag_set():
    """Components take parts (SourceConfig, ScoringConfig, ...), never the 30-flag SweepConfig."""
    whole = ("flags.py", "config.py", "__init__.py", "__main__.py")  # flags.py: the flag set itself
    users = sorted(p.name for p in SWEEP.glob("*.py")
                   if "SweepConfig" in _source(p) and p.name not in whole)
    assert users == []
    for p in SWEEP.glob("*.py"):
        if p.name in ("config.py", "__main__.py", "__init__.py"):
            continue
        for node in ast.walk(ast.parse(_source(p))):
            if isinstance(node, ast.FunctionDef):
                hints = [ast.unparse(a.annotation) for a in node.args.args if a.annotation]
                assert "SweepConfig" not in hints, f"{p.name}:{node.name}"


def test_every_flag_lands_in_exactly_one_part():
    cfg = sweep.SweepConfig(model="org/x", stats="s.safetensors", out="o", device="cpu")
    parts = cfg.split()
    flat = {}
    for part in (parts.source, parts.statistics, parts.scoring, parts.plan, parts.output):
        for f in fields(part):
            flat.setdefault(f.name, []).append(type(part).__name__)
    assert all(len(owners) == 1 for owners in flat.values()), flat
    renamed = {"model": "models"}
    for f in fields(cfg):
        assert renamed.get(f.name, f.name) in flat, f"flag {f.name} in no part"


def test_the_sweep_does_not_know_the_statistics_file_layout():
    """What the file stores and how big it is are the stats package's answers."""
    for p in SWEEP.glob("*.py"):
        text = _source(p)
        for word in ("EAGER_LIMIT", "safe_open", "16384", "* 8 *"):
            assert word not in text, f"{p.name} uses {word}"


def test_ranks_come_from_the_entry_point_not_the_environment():
    for p in [*SWEEP.glob("*.py"), PACKAGE / "logs.py", PACKAGE / "demo.py"]:
        assert "os.environ" not in _source(p), p.name
    assert "rank" not in {f.name for f in fields(sweep.SweepConfig)}
    assert "world_size" not in {f.name for f in fields(sweep.SweepConfig)}


def test_theory_means_theorem_4_1_only():
    """"theory" is Theorem 4.1 (pythia_probe.theory); the statistics a cosine compares with are
    "targets" everywhere in the analyses and the sweep."""
    for p in [*SWEEP.glob("*.py"), *(PACKAGE / "analysis").glob("*.py")]:
        code = "\n".join(line for line in _source(p).splitlines()
                         if "Theorem" not in line and "pythia_probe.theory" not in line)
        assert "theor" not in code.lower(), p.name


def test_error_classes_live_in_errors():
    from pythia_probe import arch, errors, results

    assert results.ResultsError is errors.ResultsError
    assert arch.UnsupportedConfigError is errors.UnsupportedConfigError
    assert arch.WeightShapeError is errors.WeightShapeError
    for module in (arch, results, sweep.runner, config):
        own = [n for n, c in inspect.getmembers(module, inspect.isclass)
               if issubclass(c, Exception) and c.__module__ == module.__name__]
        assert own == [], (module.__name__, own)


@pytest.mark.parametrize("argv,says", [
    (["--demo", "--steps", "0,1"], "does not take --steps"),
    (["--demo", "--model", "x", "--dtype", "float32"], "does not take --dtype, --model"),
    (["--demo", "--max-rank", "5"], "does not take --max-rank"),
])
def test_demo_refuses_flags_it_would_ignore(argv, says, monkeypatch):
    from pythia_probe import demo
    from pythia_probe.sweep.__main__ import main as sweep_main

    monkeypatch.setattr(demo, "run_demo", lambda *a, **k: pytest.fail("the demo ran"))
    with pytest.raises(ValueError, match=says):
        sweep_main(argv)
