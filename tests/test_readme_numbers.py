"""Every number the README states about committed results is generated from the committed
tables (analyses/readme_numbers.py) and checked here: a README block that no longer says what
its table holds fails, naming the block."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def script(analyses_script):
    return analyses_script("readme_numbers")


def test_the_readme_states_what_the_committed_tables_hold(script):
    text = (ROOT / "README.md").read_text()
    found = script.blocks_in(text)
    assert sorted(found) == sorted(script.BLOCKS)  # every block is in the README, once each
    for name, render in script.BLOCKS.items():
        assert found[name] == render(ROOT / "results"), f"README block {name!r} is stale"


def test_a_stale_block_is_caught_and_rewritten(script, tmp_path, capsys):
    good = script.rewrite((ROOT / "README.md").read_text(), ROOT / "results")
    bad = good.replace(script.blocks_in(good)["toy"], "Table 1: 0.999999 everywhere.")
    readme = tmp_path / "README.md"
    readme.write_text(bad)
    assert script.main(["--readme", str(readme)]) == 1
    assert "stale: toy" in capsys.readouterr().out
    assert script.main(["--readme", str(readme), "--write"]) == 0
    assert readme.read_text() == good
