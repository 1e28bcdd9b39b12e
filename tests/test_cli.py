"""Command-line entry points turn user errors into one line and exit code 2; bugs keep their
traceback."""

import ast
import errno
import subprocess
import sys

import pytest

from pythia_probe import errors
from pythia_probe.cli import run_main
from pythia_probe.errors import user_message


def _bad():
    raise errors.MissingFileError("corpus file x.txt does not exist")


def test_user_error_is_one_line_and_exit_2(capsys, monkeypatch):
    monkeypatch.delenv("PYTHIA_PROBE_TRACEBACK", raising=False)
    assert run_main(_bad, "prog") == 2
    err = capsys.readouterr().err
    assert err == "prog: error: corpus file x.txt does not exist\n"
    assert run_main(lambda: 0, "prog") == 0


def test_multi_line_message_is_printed_on_one_line(capsys):
    def bad():
        raise errors.BadInputError("first line\n  second line")
    assert run_main(bad, "prog") == 2
    assert capsys.readouterr().err == "prog: error: first line second line\n"


@pytest.mark.parametrize("err", [
    errors.BadInputError("x"), errors.MismatchError("x"), errors.CorruptFileError("x"),
    errors.UnsafeFileError("x"), errors.MissingFileError("x"), errors.DiskFullError("x"),
    errors.ResourceError("x"), errors.HubError("x"), errors.DeviceError("x"),
    OSError(errno.ENOSPC, "No space left on device", "out/a.parquet"),
    PermissionError(errno.EACCES, "Permission denied", "/root/x"),
])
def test_every_user_error_kind_is_one_line(err):
    assert user_message(err) is not None


@pytest.mark.parametrize("err", [ValueError("bug"), KeyError("k"), TypeError("t"),
                                 OSError(22, "Invalid argument"), RuntimeError("r")])
def test_plain_exceptions_are_bugs(err):
    """A bare ValueError / OSError without a file is a bug: its traceback must show."""
    assert user_message(err) is None
    def boom():
        raise err
    with pytest.raises(type(err)):
        run_main(boom, "prog")


def test_builtin_bases_are_kept():
    assert issubclass(errors.BadInputError, ValueError)
    assert issubclass(errors.MissingFileError, FileNotFoundError)
    assert issubclass(errors.HubError, ConnectionError)
    assert issubclass(errors.DiskFullError, OSError)


def test_traceback_on_request_and_bugs_are_not_hidden(monkeypatch):
    monkeypatch.setenv("PYTHIA_PROBE_TRACEBACK", "1")
    with pytest.raises(errors.MissingFileError):
        run_main(_bad, "prog")
    monkeypatch.delenv("PYTHIA_PROBE_TRACEBACK")
    with pytest.raises(TypeError):
        run_main(lambda: None + 1, "prog")


def test_module_entry_point_prints_no_traceback(tmp_path):
    out = subprocess.run([sys.executable, "-m", "pythia_probe.corpus", "inspect", "--dataset",
                          str(tmp_path / "missing.txt")], capture_output=True, text=True)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr and "missing.txt does not exist" in out.stderr


def test_log_level_flag_and_rank_aware_lines(capsys, monkeypatch):
    """--log-level on every command; messages go to stderr (stdout is the results') with the
    rank under a multi-process launch."""
    import logging

    from pythia_probe import logs
    from pythia_probe.cli import parse_config
    from pythia_probe.plots import PlotsConfig

    log = logging.getLogger("pythia_probe.test")
    parse_config(PlotsConfig, ["--results", "x", "--log-level", "warning"], "p")
    log.info("hidden")
    log.warning("shown")
    out, err = capsys.readouterr()
    assert out == "" and "shown" in err and "hidden" not in err
    monkeypatch.setenv("RANK", "1")  # the environment is not where the rank comes from
    monkeypatch.setenv("WORLD_SIZE", "2")
    logs.setup("info")
    log.info("no rank given")
    assert "[rank" not in capsys.readouterr().err
    logs.set_rank(1)  # what ranks.from_env does at the entry point
    log.info("from a rank")
    assert "[rank 1] from a rank" in capsys.readouterr().err
    writes = []  # a line and its end in one write: two ranks' lines never merge (issue 30)
    with monkeypatch.context() as m:
        m.setattr("sys.stderr", type("W", (), {"write": lambda _, s: writes.append(s),
                                               "flush": lambda _: None})())
        log.warning("whole")
    writes = [w for w in writes if w]
    assert len(writes) == 1 and writes[0].endswith("[rank 1] whole\n"), writes
    with pytest.raises(SystemExit):
        parse_config(PlotsConfig, ["--results", "x", "--log-level", "loud"], "p")
    logs.set_rank(None)
    logs.setup("info")


def test_one_console_script_runs_every_command(capsys):
    import shutil

    from pythia_probe.__main__ import COMMANDS
    from pythia_probe.__main__ import main as probe

    assert set(COMMANDS) == {"sweep", "stats", "corpus", "toy", "icrecall", "plots", "summary",
                             "revisions"}
    assert probe(["corpus", "inspect", "--docs", "3", "--top", "2"]) == 0
    assert "documents read: 3" in capsys.readouterr().out
    assert probe(["stats", "compute", "--seq-len", "0"]) == 2
    assert "pythia-probe stats: error: --seq-len must be >= 1" in capsys.readouterr().err
    assert probe(["nope"]) == 2 and probe(["--help"]) == 0
    exe = shutil.which("pythia-probe")
    if exe is None:
        pytest.skip("the console script is not installed (pip install -e .)")
    out = subprocess.run([exe, "sweep", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "--steps" in out.stdout


def _help(main, argv, capsys) -> str:
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("command", ["sweep", "stats", "corpus", "toy", "icrecall", "plots"])
def test_every_command_has_version_and_names_itself_as_invoked(command, capsys):
    from pythia_probe import __version__
    from pythia_probe.__main__ import COMMANDS
    from pythia_probe.__main__ import main as probe

    assert probe(["--version"]) == 0 and capsys.readouterr().out == f"pythia-probe {__version__}\n"
    with pytest.raises(SystemExit) as done:
        probe([command, "--version"])
    assert done.value.code == 0 and __version__ in capsys.readouterr().out
    helptext = _help(probe, [command, "--help"], capsys)
    assert helptext.startswith(f"usage: pythia-probe {command}")
    assert "python -m pythia_probe" not in helptext.split("\n")[0]
    import importlib
    module = importlib.import_module(COMMANDS[command])
    assert not _help(module.main, ["--help"], capsys).startswith("usage: pythia-probe")


def test_every_flag_of_the_sweep_shows_its_default(capsys):
    from pythia_probe.sweep.__main__ import main as sweep_main

    text = " ".join(_help(sweep_main, ["--help"], capsys).split())
    for shown in ("--steps STEPS Steps: 1000-143000", "(default: all)",
                  "(default: EleutherAI/pythia-1.4b)", "(default: auto)", "(default: float32)",
                  "(default: 4096)", "(default: off)", "(default: on)",
                  "(default: embedding,attention_lnfold,attention)"):
        assert shown in text, shown


def test_a_subcommand_left_out_or_misspelt_names_the_subcommands(capsys):
    from pythia_probe.stats.__main__ import main as stats_main

    for argv in ([], ["comptue"]):
        with pytest.raises(SystemExit) as done:
            stats_main(argv)
        err = capsys.readouterr().err
        assert done.value.code == 2 and "_command" not in err
        assert "name a command: compute, top" in err


@pytest.mark.parametrize("signum,code", [(2, 130), (15, 143)])
def test_sigint_and_sigterm_are_one_line_with_the_conventional_code(tmp_path, signum, code):
    """A real signal to a running command: one line, exit 128 + signal, no traceback."""
    import os
    import signal
    import time

    script = tmp_path / "slow.py"
    script.write_text("import time\nfrom pythia_probe.cli import run_main\n"
                      "def main():\n    print('ready', flush=True)\n    time.sleep(60)\n"
                      "raise SystemExit(run_main(main, 'slow'))\n")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"
    time.sleep(0.2)
    os.kill(proc.pid, signum)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == code and err == "slow: interrupted, rerun to resume\n"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # this process is unchanged


#: what no command's --help may load (issue 30: each costs seconds on a small machine)
HEAVY = ("torch", "pandas", "transformers", "datasets", "matplotlib")
#: every command's --help, as ``python -m MODULE ARGV`` (subcommands included)
HELP_PATHS = [
    ("pythia_probe.sweep", ["--help"]), ("pythia_probe.stats", ["--help"]),
    ("pythia_probe.stats", ["compute", "--help"]), ("pythia_probe.stats", ["top", "--help"]),
    ("pythia_probe.corpus", ["--help"]), ("pythia_probe.corpus", ["generate", "--help"]),
    ("pythia_probe.corpus", ["inspect", "--help"]), ("pythia_probe.toy.train", ["--help"]),
    ("pythia_probe.toy.icrecall", ["--help"]), ("pythia_probe.plots", ["--help"]),
    ("pythia_probe.summary", ["--help"]), ("pythia_probe.hub.revisions", ["--help"])]


def _loaded(module: str, argv: list[str], light: tuple[str, ...]) -> list[str]:
    """Which of ``light`` ``python -m module *argv`` leaves in a fresh interpreter's
    sys.modules (not a timing: benchmarks/bench_help.py times them)."""
    import subprocess
    import sys

    code = ("import sys, runpy, io, contextlib\n"
            f"sys.argv = ['prog', *{argv!r}]\n"
            "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
            f"    runpy.run_module({module!r}, run_name='__main__', alter_sys=True)\n"
            f"print(sorted(m for m in {light!r} if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    return ast.literal_eval(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("module,argv,light", [
    ("pythia_probe", ["--help"], ("torch", "transformers", "pandas", "numpy", "matplotlib")),
    ("pythia_probe", ["--version"], ("torch", "transformers", "pandas", "numpy")),
    ("pythia_probe.summary", ["--help"], ("torch", "transformers", "matplotlib"))])
def test_help_paths_import_no_torch(module, argv, light):
    """`pythia-probe --help`, `--version` and `summary --help` load none of ``light`` (a fresh
    interpreter's sys.modules, not a timing); every command's --help: the test below."""
    assert _loaded(module, argv, light) == []


@pytest.mark.parametrize("module,argv", HELP_PATHS)
def test_every_commands_help_imports_nothing_heavy(module, argv):
    """Each command's flags live in modules that import no heavy library; what the command
    runs is imported when it runs (``# deferred: --help``, tests/test_imports.py)."""
    assert _loaded(module, argv, HEAVY) == []


@pytest.mark.parametrize("command", ["sweep", "stats", "corpus", "toy", "icrecall", "plots",
                                     "summary", "revisions"])
def test_every_console_script_help_imports_nothing_heavy(command):
    assert _loaded("pythia_probe", [command, "--help"], HEAVY) == []


def test_field_docs_never_parses_from_two_threads_at_once(monkeypatch):
    """``ast.parse`` from two threads at once can raise SystemError on CPython 3.11 (two sweeps
    in one process): field_docs parses under a lock, and once per class."""
    import ast
    import dataclasses
    import threading
    import time

    from pythia_probe import cli

    @dataclasses.dataclass
    class Config:
        alpha: int = 1
        """the first field"""
        beta: str = "b"
        """the second field"""

    inside, most, real_parse = [0], [0], ast.parse

    def slow_parse(*args, **kwargs):
        inside[0] += 1
        most[0] = max(most[0], inside[0])
        time.sleep(0.02)
        try:
            return real_parse(*args, **kwargs)
        finally:
            inside[0] -= 1

    monkeypatch.setattr(cli.ast, "parse", slow_parse)
    monkeypatch.setattr(cli, "_FIELD_DOCS", {})
    got: list[dict[str, str]] = []
    threads = [threading.Thread(target=lambda: got.append(cli.field_docs(Config)))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1
    assert got == [{"alpha": "the first field", "beta": "the second field"}] * 8
