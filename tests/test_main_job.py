"""The main job as a user types it (README): `python -m pythia_probe.sweep --steps
0,1,2,4,8,16,32,64,128,256,512,1000-143000` (the paper's figure steps and the later grid) with no
other flag, against a loopback hub holding EleutherAI/pythia-1.4b (all 154 step branches, a tiny
GPT-NeoX with Pythia's 50,304 embedding rows and a tokenizer in the real one's format) and
Skylion007/openwebtext. Statistics are built on first use from the paper's recipe and cached;
a rerun recomputes nothing.

Two things are set for the test machine and said here: the memory budget (a 24 GB CPU machine)
and ``--top-k 300`` (the default is the full vocabulary on every machine), so 143 steps are
scored in seconds rather than minutes; otherwise the code path is the one a user runs."""

import json

import pytest
import torch

from pythia_probe.analysis.cosine import materialised_cosine
from pythia_probe.arch import NeoXConfig, NeoXWeights, single_token_residuals
from pythia_probe.hub.revisions import read_ledger
from pythia_probe.results import read_manifest, read_results
from pythia_probe.stats import CorpusStats
from pythia_probe.sweep import statistics
from pythia_probe.sweep.__main__ import main as sweep_main
from pythia_probe.testing.endpoint import use_endpoint
from pythia_probe.testing.hub import HubServer
from pythia_probe.testing.repos import build_pythia_main_job_hub
from pythia_probe.tokenizer import load_tokenizer, tokenizer_fingerprint

K = 300
EARLY = [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
STEPS = EARLY + list(range(1000, 143001, 1000))
ARGV = ["--steps", "0,1,2,4,8,16,32,64,128,256,512,1000-143000", "--top-k", str(K)]

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


@pytest.fixture(scope="module")
def hub_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("mainjob-hub")
    build_pythia_main_job_hub(root)
    return root


def test_main_job_as_typed_then_a_rerun_recomputes_nothing(hub_root, tmp_path, monkeypatch,
                                                          capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHIA_PROBE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(statistics, "memory_budget", lambda device: (19.2e9, "24 GB machine"))
    with HubServer(hub_root) as hub, use_endpoint(hub.endpoint):
        assert sweep_main(ARGV) == 0
        first = capsys.readouterr().out
        out = tmp_path / "runs" / "pythia-1.4b"  # git-ignored, never beside committed results
        df = read_results(out)
        assert sorted(df["step"].unique()) == STEPS
        assert set(df["analysis"]) == {"embedding", "attention_lnfold", "attention"}
        assert df["value"].between(-1, 1).all()
        m = read_manifest(out)
        assert m["status"] == "complete" and m["config"]["model"] == "EleutherAI/pythia-1.4b"
        assert f"the {K:,} most frequent tokens" in m["vocabulary"]["reason"]
        assert m["statistics"]["recipe"] == {"dataset": "Skylion007/openwebtext", "docs": 100000,
                                             "min_chars": 512, "seq_len": 128, "top_k": K,
                                             "split": "train", "text_field": "text",
                                             "data_dir": None, "groups": 10,
                                             "conventions": "paper", "d_vocab": None}
        # the scale of every cell, on by default: chance, ceiling and the jackknife interval
        assert df[["chance", "ceiling", "ci_low", "ci_high"]].notna().all().all()
        assert ((df["ci_low"] <= df["value"]) & (df["value"] <= df["ci_high"])).all()
        assert "ceiling and intervals: on, from G = 10 document groups" in first
        assert "vocabulary: the 300 most frequent tokens" in first  # the plan came first
        assert first.index("download") < first.index("rank 0: 154 steps done")
        assert first.index("rank 0: 154 steps done") < first.index("peak step")  # the summary
        assert (out / "summary.parquet").is_file() and (out / "plots" / "figure6.png").is_file()
        ledger = read_ledger(out / "revisions.parquet")
        assert dict(zip(ledger["step"], ledger["status"], strict=True)) == {
            s: "duplicate" if s == 1 else "ok" for s in STEPS}  # step1 serves step0's weights
        stats = CorpusStats.load(m["statistics"]["file"])
        assert m["statistics"]["file"].startswith(str(tmp_path / "cache" / "stats"))
        assert m["statistics"]["stats_id"] == stats.stats_id
        tok = load_tokenizer(hub_root / "EleutherAI" / "pythia-1.4b" / "step1000")
        assert stats.meta["tokenizer"]["sha256"] == tokenizer_fingerprint(tok)["sha256"]
        assert stats.d_vocab == K and stats.T == 128
        assert stats.meta["policy"]["min_chars"] == 512 and stats.meta["counts"]["docs"] > 0
        assert set(df["stats_id"]) == {stats.stats_id}

        gets = len(hub.requests("GET"))
        shards = {p: p.stat().st_mtime_ns for p in (out / "shards").iterdir()}
        stats_mtime = (tmp_path / m["statistics"]["file"]).stat().st_mtime_ns
        assert sweep_main([*ARGV, "--no-plots"]) == 0  # the figures were drawn by the first run
        again = hub.requests("GET")[gets:]
        assert not [r for r in again if r["path"].endswith((".bin", ".parquet"))], again
        assert {p: p.stat().st_mtime_ns for p in (out / "shards").iterdir()} == shards
        assert (tmp_path / m["statistics"]["file"]).stat().st_mtime_ns == stats_mtime
        assert "154 done" in capsys.readouterr().out
    assert df.groupby("step").size().nunique() == 1  # every step has every row
    # one number recomputed literally: step 143000, layer 1, post stream vs PhiBT (float64)
    folder = hub_root / "EleutherAI" / "pythia-1.4b" / "step143000"
    c = NeoXConfig.from_dict(json.loads((folder / "config.json").read_text()))
    w = NeoXWeights(torch.load(folder / "pytorch_model.bin", weights_only=True), c)
    E = single_token_residuals(w, stats.token_ids, dtype=torch.float64)["post"][1]
    got = df.set_index(["step", "analysis", "layer", "metric"])["value"]
    assert got[(143000, "embedding", 2, "cos_post")] == pytest.approx(  # block 1 = layer 2
        materialised_cosine(E, stats.PhiBT), rel=1e-4)
