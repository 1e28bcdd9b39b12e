"""Command-line entry points turn user errors into one line and exit code 2."""

import subprocess
import sys

import pytest

from pythia_probe.cli import run_main


def _bad():
    raise FileNotFoundError("corpus file x.txt does not exist")


def test_user_error_is_one_line_and_exit_2(capsys, monkeypatch):
    monkeypatch.delenv("PYTHIA_PROBE_TRACEBACK", raising=False)
    assert run_main(_bad, "prog") == 2
    err = capsys.readouterr().err
    assert err == "prog: error: FileNotFoundError: corpus file x.txt does not exist\n"
    assert run_main(lambda: 0, "prog") == 0


def test_traceback_on_request_and_bugs_are_not_hidden(monkeypatch):
    monkeypatch.setenv("PYTHIA_PROBE_TRACEBACK", "1")
    with pytest.raises(FileNotFoundError):
        run_main(_bad, "prog")
    monkeypatch.delenv("PYTHIA_PROBE_TRACEBACK")
    with pytest.raises(TypeError):
        run_main(lambda: None + 1, "prog")


def test_module_entry_point_prints_no_traceback(tmp_path):
    out = subprocess.run([sys.executable, "-m", "pythia_probe.corpus", "inspect",
                          str(tmp_path / "missing.txt")], capture_output=True, text=True)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr and "missing.txt does not exist" in out.stderr
