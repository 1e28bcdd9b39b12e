"""analyses/ and benchmarks/ scripts parse their flags like the commands (issue 17 item 4): a
frozen config dataclass through :mod:`pythia_probe.cli`, never a hand-written argparse parser."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p for d in ("analyses", "benchmarks") for p in (ROOT / d).glob("*.py")
                 if not p.name.startswith("_"))


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return names


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_script_flags_from_a_config_dataclass(path):
    names = _imports(path)
    assert "argparse" not in names, f"{path.name} builds its own argparse parser"


def test_the_scripts_are_found():
    assert len(SCRIPTS) >= 8
