"""The Pythia suite against a loopback hub: Pythia-shaped models of two sizes sharing one
tokenizer in the real one's format, Skylion007/openwebtext and a FineWeb-shaped
HuggingFaceFW/fineweb (``pythia_probe.testing.repos.build_pythia_suite_hub``).

As in tests/test_main_job.py, two things are set for the test machine: the memory budget (a
24 GB CPU machine) and ``--top-k 300`` (the default is the full vocabulary), so a step is
scored in a fraction of a second."""

import shutil

import pytest

from pythia_probe.results import read_manifest, read_results
from pythia_probe.stats import CorpusStats
from pythia_probe.stats.__main__ import main as stats_main
from pythia_probe.sweep import statistics
from pythia_probe.sweep.__main__ import main as sweep_main
from pythia_probe.testing.endpoint import use_endpoint
from pythia_probe.testing.hub import HubServer
from pythia_probe.testing.repos import build_pythia_suite_hub

K = 300
SMALL, LARGE = "EleutherAI/pythia-70m", "EleutherAI/pythia-160m"

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    root = tmp_path_factory.mktemp("suite-hub")
    return root, build_pythia_suite_hub(root)


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """A fresh tool cache and the test machine's budget (see the module docstring)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHIA_PROBE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(statistics, "memory_budget", lambda device: (19.2e9, "24 GB machine"))
    return tmp_path


def test_fineweb_recipe_reads_the_sample_with_the_paper_document_rule(suite, machine):
    """--recipe fineweb (Figure 8): HuggingFaceFW/fineweb's sample/10BT folder only, the first
    100,000 documents of >= 512 characters, T+1 = 129 tokens: the same statistics as `stats
    compute` with that rule on a local copy of exactly those files."""
    root, built = suite
    out = machine / "fw"
    with HubServer(root) as hub, use_endpoint(hub.endpoint):
        assert sweep_main(["--model", SMALL, "--steps", "0,2", "--recipe", "fineweb",
                           "--top-k", str(K), "--out",
                           str(out), "--no-plots"]) == 0
        parquet = [r["path"] for r in hub.requests("GET") if r["path"].endswith(".parquet")]
    assert parquet and all("/sample/10BT/" in p for p in parquet), parquet
    m = read_manifest(out)
    recipe = m["statistics"]["recipe"]
    assert (recipe["dataset"], recipe["data_dir"]) == ("HuggingFaceFW/fineweb", "sample/10BT")
    assert (recipe["docs"], recipe["min_chars"], recipe["seq_len"]) == (100_000, 512, 128)
    assert m["config"]["statistics"]["recipe"] == "fineweb"
    got = CorpusStats.load(m["statistics"]["file"])
    local = machine / "sample"
    shutil.copytree(root / "datasets" / "HuggingFaceFW" / "fineweb" / "main" / "sample" / "10BT",
                    local)
    tok = root / SMALL / "step0"
    assert stats_main(["compute", "--dataset", str(local), "--docs", "100000", "--min-chars",
                       "512", "--seq-len", "128", "--mode", "first", "--top-k", str(K),
                       "--tokenizer", str(tok), "--out", str(machine / "ref.safetensors"),
                       "--no-progress"]) == 0
    want = CorpusStats.load(machine / "ref.safetensors")
    assert got.meta["counts"] == want.meta["counts"] and got.meta["counts"]["docs"] > 0
    assert (got.Bbar == want.Bbar).all() and (got.Phibar == want.Phibar).all()
    assert set(read_results(out)["stats_id"]) == {got.stats_id}
