"""Every command checks up front that its output folder (or its output file's folder) can be
created and written, and refuses in one line naming the path the user gave, before any work."""

from pathlib import Path

import pytest

from pythia_probe.__main__ import main
from pythia_probe.fileio import check_writable

RESULTS = Path(__file__).resolve().parents[1] / "results" / "demo" / "run"


@pytest.fixture
def blocked(tmp_path):
    """A folder that cannot be created, even by root: its parent is a regular file."""
    (tmp_path / "file").write_text("not a folder")
    return tmp_path / "file" / "out"


def commands(bad: Path, tmp_path: Path) -> dict[str, list[str]]:
    return {
        "sweep --demo --out": ["sweep", "--demo", "--out", str(bad), "--work", str(tmp_path)],
        "sweep --demo --work": ["sweep", "--demo", "--out", str(tmp_path), "--work", str(bad)],
        "sweep": ["sweep", "--model", str(RESULTS), "--stats", "s.safetensors",
                  "--out", str(bad)],
        "stats compute": ["stats", "compute", "--out", str(bad / "stats.safetensors")],
        "corpus generate": ["corpus", "generate", "--out", str(bad / "stories.txt")],
        "toy": ["toy", "--out", str(bad)],
        "icrecall": ["icrecall", "--out", str(bad)],
        "revisions": ["revisions", "--model", str(tmp_path), "--out", str(bad / "r.parquet")],
        "plots": ["plots", "--results", str(RESULTS), "--out", str(bad)],
        "summary": ["summary", "--results", str(RESULTS), "--out", str(bad)],
    }


@pytest.mark.parametrize("name", list(commands(Path("x"), Path("y"))))
def test_unwritable_output_is_refused_before_any_work(name, blocked, tmp_path, capsys):
    argv = commands(blocked, tmp_path)[name]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    given = argv[argv.index("--work" if name.endswith("--work") else "--out") + 1]
    assert len(err) == 1 and f"{given!r}: cannot create or write" in err[0], err
    assert ".tmp" not in err[0] and err[0].startswith(f"pythia-probe {name.split()[0]}: error:")
    assert [p.name for p in tmp_path.iterdir()] == ["file"]  # nothing trained, nothing written


def test_check_writable_creates_nothing(tmp_path):
    assert check_writable(tmp_path / "a" / "b") == tmp_path / "a" / "b"
    assert check_writable(tmp_path / "c" / "f.txt", is_file=True) == tmp_path / "c"
    (tmp_path / "kept").mkdir()
    assert check_writable(tmp_path / "kept" / "d") == tmp_path / "kept" / "d"
    assert [p.name for p in tmp_path.rglob("*")] == ["kept"]


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc")
def test_the_issue_cases_name_the_path_given(tmp_path, capsys):
    """`--demo --out /proc/demo_out` fails before training; `corpus generate --out
    /proc/stories.txt` names that path, not a temp file beside it."""
    assert main(["sweep", "--demo", "--out", "/proc/demo_out", "--work", str(tmp_path)]) == 2
    assert "--out '/proc/demo_out': cannot create or write" in capsys.readouterr().err
    assert main(["corpus", "generate", "--out", "/proc/stories.txt"]) == 2
    err = capsys.readouterr().err
    assert "--out '/proc/stories.txt': cannot create or write its folder '/proc'" in err
    assert ".tmp" not in err and not any(tmp_path.iterdir())
