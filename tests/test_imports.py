"""Imports flow one way: entry points on top, then sweep, analyses and statistics, corpus and
tokenizer, and the file/error layer at the bottom; no cycle between parts, no upward edge, and
imports at module top except heavy optional dependencies.

Entry points (``__main__`` modules) may import anything: nothing imports them. The layers,
top to bottom (``|``: independent parts of one layer):
"""

import ast
from pathlib import Path

import grimp
import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "pythia_probe"
LAYERS = [
    "testing | demo | api",
    "sweep",
    "toy | plots",
    "analysis | theory | summary",
    "stats",
    "tokenizer",
    "corpus",
    "hub | builtin_corpus",
    "arch | results | progress | ranks | planner",
    "linalg",
    "cli",
    "logs",
    "fileio",
    "errors | lazy",
]
#: imported inside functions on purpose: each costs seconds at import or is needed only by one
#: command path (multi-process runs, the text forward pass, hub datasets)
HEAVY = {"transformers", "datasets", "accelerate"}
#: the one other allowance: a command's entry point imports what its run needs inside the
#: function that runs it, marked on the line, so that ``--help`` loads no torch (issue 30)
DEFERRED = "# deferred: --help"


def build(package: str):
    """The import graph, imports under ``if TYPE_CHECKING:`` included (they are edges too)."""
    return grimp.build_graph(package, cache_dir=None, exclude_type_checking_imports=False)


@pytest.fixture(scope="module")
def graph():
    g = build("pythia_probe")
    for m in [m for m in g.modules if m.endswith(".__main__")]:
        g.remove_module(m)
    return g


def _part(module: str) -> str:
    return module.split(".")[1] if module.count(".") else ""


def test_every_part_is_in_a_layer(graph):
    placed = {p.strip() for layer in LAYERS for p in layer.split("|")}
    parts = {_part(m) for m in graph.modules} - {""}
    assert parts <= placed, f"place {sorted(parts - placed)} in LAYERS"


def test_no_upward_edge(graph):
    rank = {p.strip(): i for i, layer in enumerate(LAYERS) for p in layer.split("|")}
    bad = []
    for m in graph.modules:
        for imp in graph.find_modules_directly_imported_by(m):
            a, b = _part(m), _part(imp)
            if a and b and a != b and rank[b] <= rank[a]:
                bad.append(f"{m} -> {imp}")
    assert not bad, "imports against the layers:\n" + "\n".join(sorted(bad))


def test_no_cycle_between_modules_of_one_part(graph):
    """Within a part (a package), modules must not import each other in a cycle either."""
    cycles = []
    for m in graph.modules:
        for imp in graph.find_modules_directly_imported_by(m):
            if _part(m) == _part(imp) and m != imp and graph.chain_exists(imp, m):
                cycles.append(f"{m} <-> {imp}")
    assert not cycles, "\n".join(sorted(cycles))


def test_the_graph_sees_imports_under_type_checking(tmp_path, monkeypatch):
    """A cycle closed only by an ``if TYPE_CHECKING:`` import is still a cycle."""
    pkg = tmp_path / "tcpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from tcpkg import b\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from tcpkg import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    g = build("tcpkg")
    assert g.chain_exists("tcpkg.a", "tcpkg.b") and g.chain_exists("tcpkg.b", "tcpkg.a")


def test_imports_at_module_top():
    lazy = []
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        lines = text.splitlines()
        tree = ast.parse(text)
        functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
        for fn in functions:
            for node in ast.walk(fn):
                if isinstance(node, ast.Import | ast.ImportFrom):
                    mod = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
                    if mod.split(".")[0] not in HEAVY and not _deferred(lines, node):
                        lazy.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {mod}")
    assert not lazy, "imports inside functions:\n" + "\n".join(lazy)


def test_deferred_imports_are_in_command_modules_only():
    """``# deferred: --help`` marks imports in the modules of ``pythia-probe``'s commands (the
    functions that run a command), nowhere else."""
    from pythia_probe.__main__ import COMMANDS

    commands = set()
    for module in COMMANDS.values():
        path = PACKAGE.joinpath(*module.split(".")[1:])
        commands.add(path / "__init__.py" if path.is_dir() else path.with_suffix(".py"))
    marked = [path.relative_to(PACKAGE) for path in PACKAGE.rglob("*.py")
              if DEFERRED in path.read_text() and path not in commands]
    assert not marked, f"{DEFERRED} outside the command modules: {marked}"


def _deferred(lines: list[str], node: ast.stmt) -> bool:
    """An import marked ``# deferred: --help`` (on its first or last line)."""
    return any(lines[n - 1].rstrip().endswith(DEFERRED) for n in (node.lineno, node.end_lineno))


def test_importing_a_module_has_no_side_effect():
    """No backend switched, no logging configured, no pyplot loaded by any library module."""
    import subprocess
    import sys

    code = ("import importlib, logging, pkgutil, sys, matplotlib; import pythia_probe as p\n"
            "backend = dict.__getitem__(matplotlib.rcParams, 'backend')\n"
            "for m in pkgutil.walk_packages(p.__path__, 'pythia_probe.'):\n"
            "    if not m.name.rsplit('.', 1)[-1].startswith('_'):  # __main__, C libraries\n"
            "        importlib.import_module(m.name)\n"
            "assert 'matplotlib.pyplot' not in sys.modules, 'pyplot imported'\n"
            "assert dict.__getitem__(matplotlib.rcParams, 'backend') == backend, 'backend set'\n"
            "assert not logging.getLogger('pythia_probe').handlers, 'logging configured'\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]


def test_importing_the_package_is_cheap_and_the_api_loads_on_first_use():
    """``import pythia_probe`` imports nothing heavy; ``pp.run_sweep`` and friends load then."""
    import subprocess
    import sys

    code = ("import sys; import pythia_probe as pp\n"
            "heavy = [m for m in ('torch', 'pandas', 'matplotlib', 'transformers') "
            "if m in sys.modules]\n"
            "assert not heavy, heavy\n"
            "assert callable(pp.run_sweep) and callable(pp.read_results) and "
            "callable(pp.statistics)\n"
            "from pythia_probe.results import read_results\n"
            "assert pp.read_results is read_results\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
