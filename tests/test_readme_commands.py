"""Every command the README names exists both as ``pythia-probe NAME`` and as ``python -m
pythia_probe.MODULE`` (the README is parsed, nothing is run)."""

import importlib.util
import re
from pathlib import Path

from pythia_probe.__main__ import COMMANDS

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()
#: ``python -m pythia_probe.testing.hub``: the loopback hub the README's hub examples start,
#: a test server rather than a command of the toolkit
NOT_COMMANDS = ("pythia_probe.testing.",)


def runnable(module: str) -> bool:
    """``python -m module`` would find something to run: a module, or a package's __main__."""
    spec = importlib.util.find_spec(module)
    if spec is None:
        return False
    return spec.submodule_search_locations is None or \
        importlib.util.find_spec(module + ".__main__") is not None


def command_of(module: str) -> list[str]:
    return [name for name, target in COMMANDS.items()
            if target in (module, module + ".__main__")]


def test_readme_console_script_names_are_commands():
    named = set(re.findall(r"pythia-probe ([a-z][a-z_]*)", README))
    assert named, "the README names no pythia-probe command"
    assert named <= set(COMMANDS), sorted(named - set(COMMANDS))


def test_readme_modules_run_and_have_a_console_script_name():
    modules = set(re.findall(r"python -m (pythia_probe\.[a-z_.]*[a-z_])", README))
    modules = {m for m in modules if not m.startswith(NOT_COMMANDS)}
    assert {"pythia_probe.sweep", "pythia_probe.summary", "pythia_probe.toy.train"} <= modules
    assert [m for m in sorted(modules) if not runnable(m)] == []
    assert [m for m in sorted(modules) if not command_of(m)] == []


def test_readme_command_table_pairs_name_and_module():
    rows = re.findall(r"^\| `([a-z]+)[^|]*\| `python -m (pythia_probe[a-z_.]*)` \|", README,
                      flags=re.M)
    assert len(rows) >= 6
    for name, module in rows:
        assert COMMANDS.get(name) in (module, module + ".__main__"), (name, module)


def test_a_missing_command_is_caught():
    """The checks can fail: a module that does not exist, one without a console script name."""
    assert not runnable("pythia_probe.no_such_command")
    assert not runnable("pythia_probe.toy")  # a package without __main__
    assert command_of("pythia_probe.demo") == []
