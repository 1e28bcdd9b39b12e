"""The sweep end to end on local step folders: tables, resume, failures, ranks, bad input."""

import json

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from pythia_probe import sweep
from pythia_probe.analysis.cosine import materialised_cosine
from pythia_probe.planner import sweep as sweep_plan
from pythia_probe.results import read_manifest, read_results
from pythia_probe.stats import batch_stats
from pythia_probe.sweep import execute
from pythia_probe.sweep.__main__ import main as sweep_main
from pythia_probe.testing.repos import build_pythia_like_repo, tiny_config

STEPS = (0, 1, 2, 4, 64)
V = 90  # statistic rows; the tiny model has 96 (padding rows, as in Pythia)
KEY = ["step", "analysis", "layer", "head", "metric"]

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    torch.manual_seed(0)
    cfg = tiny_config()
    layouts = {s: ("safetensors", 1) for s in STEPS}
    repo = build_pythia_like_repo(root / "hub", "org/tiny", STEPS, cfg, layouts, with_main=False)
    tokens = torch.randint(0, V, (40, 17), generator=torch.Generator().manual_seed(1))
    stats_path = batch_stats(tokens, V).save(root / "stats.safetensors")
    return root, repo, stats_path


def _argv(repo, stats, out, *extra):
    """No figures (their tests ask for them: test_sweep_report.py)."""
    return ["--model", str(repo), "--stats", str(stats), "--out", str(out), "--steps", "all",
            "--analyses", "embedding,attention,unembedding", "--dtype", "float64",
            "--no-plots", *extra]


def _sorted(df):
    return df.drop(columns=["run_id"]).sort_values(KEY, na_position="first").reset_index(drop=True)


@pytest.fixture(scope="module")
def clean_run(setup):
    root, repo, stats = setup
    out = root / "clean"
    assert sweep_main(_argv(repo, stats, out)) == 0
    return out, read_results(out)


def test_tables_validate_and_match_the_paper_procedure(setup, clean_run):
    from pythia_probe.arch import NeoXConfig, NeoXWeights, single_token_residuals

    root, repo, stats_path = setup
    out, df = clean_run
    cfg = tiny_config()
    n_l, n_h = cfg.num_hidden_layers, cfg.num_attention_heads
    per_step = 3 * n_l + 2 * n_l * (1 + n_h) + 3  # attention: both orientations
    assert len(df) == len(STEPS) * per_step and sorted(df["step"].unique()) == list(STEPS)
    assert read_manifest(out)["status"] == "complete"
    # step 64 recomputed literally: materialised V x V matrices in float64
    c = NeoXConfig.from_dict(json.loads((repo / "step64" / "config.json").read_text()))
    w = NeoXWeights(load_file(repo / "step64" / "model.safetensors"), c)
    ids = torch.arange(V)
    res = single_token_residuals(w, ids, dtype=torch.float64)
    from pythia_probe.stats import CorpusStats
    st = CorpusStats.load(stats_path)
    got = df[df["step"] == 64].set_index(["analysis", "layer", "head", "metric"])["value"]
    L = w.layer(1)  # the second block: layer 2 in the tables, which number layers from 1
    E = res["pre"][1]
    A = torch.stack([L.W_Q[h].double() @ L.W_K[h].double().T for h in range(n_h)]).mean(0)
    assert got[("attention", 2, pd.NA, "cos_mean")] == pytest.approx(
        materialised_cosine(E @ A @ E.T, st.Qbar), rel=1e-6)
    Ah = L.W_Q[2].double() @ L.W_K[2].double().T
    assert got[("attention", 2, 2, "cos_head")] == pytest.approx(
        materialised_cosine(E @ Ah @ E.T, st.Qbar), rel=1e-6)
    # the authors' orientation: pythia.py's Q_bar = NT Qbar^T, the per-head script's own target
    assert got[("attention", 2, pd.NA, "cos_mean_authors")] == pytest.approx(
        materialised_cosine(E @ A @ E.T, st.Qbar.T), rel=1e-6)
    assert got[("attention", 2, 2, "cos_head_authors")] == pytest.approx(
        materialised_cosine(E @ Ah @ E.T, st.QbarHead.T), rel=1e-6)
    assert got[("embedding", 1, pd.NA, "cos_attn")] == pytest.approx(
        materialised_cosine(res["attn"][0], st.PhiBT), rel=1e-6)
    assert sorted(df["layer"].dropna().unique()) == list(range(1, n_l + 1))
    assert read_manifest(out)["layers"].startswith("1-based")
    WE, WU = w.W_E[:V].double(), w.W_U[:, :V].double()
    assert got[("unembedding", pd.NA, pd.NA, "cos_WEWU_Bbar")] == pytest.approx(
        materialised_cosine(WE @ WU, st.Bbar), rel=1e-6)


def test_killed_run_resumes_without_redoing_steps(setup, clean_run, monkeypatch):
    root, repo, stats = setup
    out = root / "killed"
    real, calls = execute.run_step, []

    def dies_on_third(loaded, step, scorer, where):
        calls.append(step)
        if len(calls) == 3:
            raise KeyboardInterrupt  # a kill: not an ordinary failure, stops the process
        return real(loaded, step, scorer, where)

    monkeypatch.setattr(execute, "run_step", dies_on_third)
    with pytest.raises(KeyboardInterrupt):
        sweep_main(_argv(repo, stats, out))
    assert read_manifest(out)["status"] == "interrupted"
    done = {p.name: p.stat().st_mtime_ns for p in (out / "shards").iterdir()}
    # step1's weights are step0's (as on the hub): copied, not scored; step 4 was the third
    assert sorted(done) == ["step0.parquet", "step1.parquet", "step2.parquet"]
    calls.clear()
    monkeypatch.setattr(execute, "run_step", real)
    assert sweep_main(_argv(repo, stats, out)) == 0
    assert {p.name: p.stat().st_mtime_ns for p in (out / "shards").iterdir()
            if p.name in done} == done
    pd.testing.assert_frame_equal(_sorted(read_results(out)), _sorted(clean_run[1]))


def test_failing_step_is_retried_reported_and_the_rest_goes_on(setup, tmp_path, monkeypatch):
    import shutil
    root, repo, stats = setup
    bad = tmp_path / "repo"
    shutil.copytree(repo, bad)
    (bad / "step2" / "model.safetensors").write_bytes(b"not a safetensors file")
    tries = []
    real = execute.load_weights
    monkeypatch.setattr(execute, "load_weights", lambda s, rev, names: (tries.append(rev.step),
                                                                       real(s, rev, names))[1])
    out = tmp_path / "out"
    assert sweep_main(_argv(bad, stats, out, "--retries", "2")) == 1
    assert tries == [2, 2]  # the first try comes from the prefetching stream
    assert json.loads((out / "failed" / "step2.json").read_text())["tries"] == 3
    assert sorted(read_results(out)["step"].unique()) == [0, 1, 4, 64]
    assert json.loads((out / "failed" / "step2.json").read_text())["step"] == 2
    assert read_manifest(out)["failed_steps"] == [2]


def test_two_shards_write_the_same_tables_as_one(setup, clean_run, tmp_path):
    """The steps split in two shares (what two ranks, or two machines, each run) give the table
    of one process; the manifest says incomplete until every share is done."""
    root, repo, stats = setup
    out = tmp_path / "ranks"
    parts = sweep.SweepConfig(model=str(repo), steps="all", stats=str(stats), out=str(out),
                              analyses=("embedding", "attention", "unembedding"),
                              dtype="float64", plots=False).split()
    assert sweep.run(parts, argv=[], shard=(1, 2)) == 0
    assert read_manifest(out)["status"] == "incomplete"
    assert sweep.run(parts, argv=[], shard=(0, 2)) == 0
    assert read_manifest(out)["status"] == "complete"
    pd.testing.assert_frame_equal(_sorted(read_results(out)), _sorted(clean_run[1]))


def _no_download(monkeypatch):
    from pythia_probe.hub.checkpoints import CheckpointSource

    def refuse(*a, **k):
        raise AssertionError("weights were fetched before the input was validated")
    monkeypatch.setattr(CheckpointSource, "fetch", refuse)
    monkeypatch.setattr(CheckpointSource, "stream", refuse)


def test_bad_input_fails_before_any_download(setup, tmp_path, monkeypatch):
    from pythia_probe.errors import MismatchError
    from pythia_probe.hub.steps import StepError
    from pythia_probe.tokenizer import build_word_tokenizer, tokenizer_fingerprint

    root, repo, stats = setup
    _no_download(monkeypatch)
    with pytest.raises(ValueError, match="valid: embedding, attention, unembedding"):
        sweep_main(_argv(repo, stats, tmp_path / "a", "--analyses", "embeding"))
    with pytest.raises(ValueError, match="attention_text needs --text"):
        sweep_main(_argv(repo, stats, tmp_path / "a", "--analyses", "attention_text"))
    with pytest.raises(StepError, match="3"):
        sweep_main(_argv(repo, stats, tmp_path / "b", "--steps", "0,3"))
    tok = build_word_tokenizer(["the cat sat on the mat"] * 3, 50)
    other = build_word_tokenizer(["a dog ran"] * 3, 50)
    tok.save_pretrained(str(tmp_path / "tok"))
    wrong = batch_stats(torch.randint(0, 3, (4, 9)), 3, tokenizer=tokenizer_fingerprint(other))
    wrong.save(tmp_path / "wrong.safetensors")
    with pytest.raises(MismatchError, match="tokenizer"):
        sweep_main(_argv(repo, tmp_path / "wrong.safetensors", tmp_path / "c", "--tokenizer",
                         str(tmp_path / "tok")))
    with pytest.raises(FileNotFoundError, match="no such statistics file"):
        sweep_main(_argv(repo, tmp_path / "none.safetensors", tmp_path / "d"))


def test_dry_run_prints_a_plan_and_writes_nothing(setup, tmp_path, monkeypatch, capsys):
    root, repo, stats = setup
    _no_download(monkeypatch)
    assert sweep_main(_argv(repo, stats, tmp_path / "plan", "--dry-run")) == 0
    text = capsys.readouterr().out
    assert "5 steps" in text and "download" in text and "peak total" in text
    assert not (tmp_path / "plan").exists()


@pytest.mark.parametrize("flag,key", [(("--heads", "none"), "heads"),
                                      (("--no-intervals",), "intervals")])
def test_resume_into_a_different_run_is_refused(setup, clean_run, flag, key):
    """Refused before anything is written: no file of the folder changes (its ledger once did).
    Rows without the scale columns are another run too: resuming with --no-intervals would
    mix shards with and without ceiling/ci."""
    root, repo, stats = setup
    files = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in clean_run[0].rglob("*")
             if p.is_file()}
    with pytest.raises(ValueError, match=f"different run.*'{key}'"):
        sweep_main(_argv(repo, stats, clean_run[0], *flag))
    assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in clean_run[0].rglob("*")
            if p.is_file()} == files


def test_an_earlier_manifest_without_intervals_in_its_identity_still_resumes():
    from pythia_probe.sweep.manifest import recorded

    assert recorded({"scoring": {"intervals": True}}, "intervals") is True  # session 5
    assert recorded({"scoring": {}}, "intervals") is False  # before the scale columns
    assert recorded({"intervals": False, "scoring": {"intervals": True}}, "intervals") is False
    assert recorded({"heads": "all"}, "heads") == "all"


def test_sweep_over_the_loopback_hub_matches_local_and_evicts(setup, clean_run, tmp_path,
                                                               monkeypatch):
    from pythia_probe.testing.hub import HubServer

    root, repo, stats = setup
    # default layouts: single .bin (with legacy buffers), safetensors, sharded .bin
    build_pythia_like_repo(tmp_path / "hub", "org/tiny", STEPS, tiny_config(), with_main=False)
    with HubServer(tmp_path / "hub") as server:
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        out = tmp_path / "out"
        argv = _argv("org/tiny", stats, out, "--cache-dir", str(tmp_path / "cache"))
        assert sweep_main(argv) == 0
        weight_gets = [r for r in server.log if r["method"] == "GET" and "/cdn/" in r["path"]]
    # step1 is byte-identical to step0 (as on the real hub): its rows are copied, not downloaded
    assert len(weight_gets) == 5  # step0, step2, step4: one file each; step64: two shards
    got = _sorted(read_results(out)).drop(columns=["model"])
    pd.testing.assert_frame_equal(got, _sorted(clean_run[1]).drop(columns=["model"]))
    blobs = list((tmp_path / "cache").rglob("blobs/*"))
    assert sum(b.stat().st_size for b in blobs) < 10_000  # weights evicted, configs remain
    assert set(read_results(out)["model"]) == {"org/tiny"}


def test_dry_run_counts_duplicates_and_only_bytes_not_yet_cached(setup, tmp_path, monkeypatch,
                                                                capsys):
    """The plan's download excludes step1 (= step0's bytes) and files already in the cache."""
    from pythia_probe.arch import name_filter
    from pythia_probe.hub.checkpoints import CheckpointSource
    from pythia_probe.planner.budget import human_bytes
    from pythia_probe.testing.hub import HubServer

    root, repo, stats = setup
    build_pythia_like_repo(tmp_path / "hub", "org/tiny", STEPS, tiny_config(), with_main=False)
    cache = tmp_path / "cache"
    names = name_filter("embed", "attn", "mlp", "ln")
    with HubServer(tmp_path / "hub") as server:
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        src = CheckpointSource("org/tiny", cache_dir=cache, endpoint=server.endpoint)
        revs = {r.step: r for r in src.resolve(STEPS)}
        list(src.stream([revs[2]], names=names, keep=True))  # step 2 is in the cache already
        want = sum(src.bytes_to_download(revs[s], names) for s in (0, 4, 64))
        assert src.bytes_to_download(revs[2], names) == 0 and want > 0
        argv = _argv("org/tiny", stats, tmp_path / "out", "--cache-dir", str(cache),
                     "--analyses", "embedding", "--dry-run")
        assert sweep_main(argv) == 0
    text = capsys.readouterr().out
    assert ("5 steps: 0 done, 5 to score: [0, 1, 2, 4, 64] (1 of them with the weights of an "
            "earlier step") in text
    assert f"download {human_bytes(want)} still" in text


def test_resume_plan_lists_only_the_steps_left(setup, tmp_path, capsys):
    """A sweep that stopped after steps 0 and 1: the rerun's plan counts them done and lists
    only the three left to score."""
    root, repo, stats = setup
    argv = _argv(repo, stats, tmp_path / "out", "--analyses", "embedding")
    assert sweep_main([*argv, "--steps", "0,1"]) == 0
    capsys.readouterr()
    assert sweep_main([*argv, "--dry-run"]) == 0
    assert "5 steps: 2 done, 3 to score: [2, 4, 64] (" in capsys.readouterr().out


def test_accelerate_launch_two_cpu_processes_match_one(setup, clean_run, tmp_path):
    """Real `accelerate launch` with 2 processes (torchrun + gloo on CPU)."""
    import os
    import re
    import subprocess
    import sys

    root, repo, stats = setup
    out = tmp_path / "acc"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes",
           "2", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "--main_process_port", "0", "-m", "pythia_probe.sweep", *_argv(repo, stats, out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rank 0:" in proc.stdout and "rank 1:" in proc.stdout
    # one progress display for the job, rank 0's (issue 30: both ranks drew bars, and bars
    # without a name at 0% first): each bar starts once, named
    starts = [line.split(":")[0] for line in re.split(r"[\r\n]", proc.stderr)
              if re.search(r"\b0%\|", line)]
    assert sorted(starts) == ["[1/1] sweep", "target norms"], starts
    df = read_results(out)
    assert df["run_id"].nunique() == 1  # rank 1 took rank 0's run id from the manifest
    pd.testing.assert_frame_equal(_sorted(df), _sorted(clean_run[1]))
    assert read_manifest(out)["world"] == 2


def test_hub_tokenizer_mismatch_is_refused_before_download(setup, tmp_path, monkeypatch):
    from pythia_probe.errors import MismatchError
    from pythia_probe.testing.hub import HubServer
    from pythia_probe.tokenizer import build_word_tokenizer, tokenizer_fingerprint

    root, repo, stats = setup
    other = tokenizer_fingerprint(build_word_tokenizer(["a dog ran"] * 3, 50))
    stats = batch_stats(torch.randint(0, 3, (4, 9)), 3, tokenizer=other).save(tmp_path / "s")
    hub_repo = build_pythia_like_repo(tmp_path / "hub", "org/tok", (0, 1), tiny_config(),
                                      with_main=False)
    tok = build_word_tokenizer(["the cat sat on the mat"] * 3, 50)
    for step in (0, 1):
        tok.save_pretrained(str(hub_repo / f"step{step}"))
    _no_download(monkeypatch)
    with HubServer(tmp_path / "hub") as server:
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        with pytest.raises(MismatchError, match="computed with tokenizer"):
            sweep_main(_argv("org/tok", stats, tmp_path / "o", "--cache-dir",
                             str(tmp_path / "c")))


def test_target_norms_are_cached_by_stats_id_never_by_path(setup, clean_run, tmp_path,
                                                          monkeypatch):
    """The clean run cached every target's norms under its statistics' stats_id in the tool's
    cache, nothing beside the statistics file; the same statistics at another path reuse them
    (no norm computed) and give the clean table; packed layers (--max-rank) the same values."""
    import shutil

    from pythia_probe.analysis import factored_cache
    from pythia_probe.stats import read_meta
    from pythia_probe.sweep.held import targets_cache

    root, repo, stats = setup
    stats_id = read_meta(stats)["stats_id"]
    files = sorted(targets_cache(stats_id).glob("*-factored.safetensors"))
    assert [f.name for f in files] == [f"{n}-factored.safetensors" for n in
                                       ("Bbar", "BbarT", "PhiBT", "Qbar", "QbarHeadT", "QbarT")]
    assert not stats.with_name(stats.stem + ".targets").exists()
    moved = shutil.copy(stats, tmp_path / "elsewhere.safetensors")
    built = []
    real = factored_cache.target_vectors
    monkeypatch.setattr(factored_cache, "target_vectors",
                        lambda *a, **k: built.append(a[0]) or real(*a, **k))
    out = tmp_path / "packed"
    assert sweep_main(_argv(repo, moved, out, "--max-rank", "1000")) == 0
    assert built == []
    a, b = _sorted(read_results(out)), _sorted(clean_run[1])
    pd.testing.assert_frame_equal(a.drop(columns="value"), b.drop(columns="value"))
    assert a["value"].to_numpy() == pytest.approx(b["value"].to_numpy(), rel=1e-10)


@pytest.mark.parametrize("flag", ["--targets", "--theory", "--targets-cache", "--theory-cache"])
def test_the_removed_target_flags_are_refused(setup, tmp_path, capsys, flag):
    root, repo, stats = setup
    with pytest.raises(SystemExit) as e:
        sweep_main(_argv(repo, stats, tmp_path / "o", flag, "memory"))
    assert e.value.code == 2 and flag in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_the_plan_holds_dense_targets_for_top_k_statistics_only(setup):
    from pythia_probe.analysis import get_analyses
    from pythia_probe.planner import budget, step

    # pythia-1.4b, full vocabulary: four V x V float32 dense targets (PhiBT, Qbar, Qbar^T,
    # QbarHead^T: 40 GB) + one layer's streams, where the sparse parts need a few GB at most
    shape = step.StepShape(50277, 2048, 24, 16, 8192, 1_414_647_808)
    chosen = get_analyses(["embedding", "attention"])
    need = step.memory_plan(shape, chosen, mode="dense").total
    assert 45e9 < need < 60e9
    nnz = {"C": 10**8, "W": 10**9, "Qbar": 10**9, "QbarHead": 10**9}
    assert step.memory_plan(shape, chosen, nnz=nnz).targets < 40e9
    assert sweep_plan.targets_held(True)[0] == "factored"
    assert sweep_plan.targets_held(False)[0] == "dense"
    budget, how = budget.memory_budget("cpu")  # the real probe: a positive number of bytes
    assert budget is None or budget > 0


def test_the_targets_holding_and_norms_are_recorded_and_printed(setup, clean_run, tmp_path,
                                                                monkeypatch, capsys):
    """Factored statistics: the sparse parts, printed and in the manifest; the plan costs the
    target norms (computed or cached); the same table as the clean run. A cold tool cache
    builds the six target norms once, a warm one (a second run) builds none."""
    from pythia_probe.analysis import factored_cache

    root, repo, stats = setup
    argv = _argv(repo, stats, tmp_path / "o", "--steps", "64")
    assert sweep_main([*argv, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "targets: factored (" in out
    assert "target norms: cached for these statistics" in out
    monkeypatch.setenv("PYTHIA_PROBE_CACHE", str(tmp_path / "cold"))
    assert sweep_main([*argv, "--dry-run"]) == 0
    assert "target norms: 6 of 6 to compute once" in capsys.readouterr().out
    built = []
    real = factored_cache.target_vectors
    monkeypatch.setattr(factored_cache, "target_vectors",
                        lambda *a, **k: built.append(a[0]) or real(*a, **k))
    assert sweep_main(argv) == 0
    assert len(built) == 6, built  # the cold cache: every norm built once
    m = read_manifest(tmp_path / "o")
    assert m["targets_choice"]["held"] == "factored" and "targets" not in m["config"]
    assert "sparse parts" in m["targets_choice"]["reason"]
    b = _sorted(clean_run[1][clean_run[1]["step"] == 64])
    a = _sorted(read_results(tmp_path / "o"))
    assert a["value"].to_numpy() == pytest.approx(b["value"].to_numpy(), rel=1e-10)
    built.clear()  # the warm cache: the second run reuses every norm
    assert sweep_main(_argv(repo, stats, tmp_path / "warm", "--steps", "64")) == 0
    assert built == []
    a = _sorted(read_results(tmp_path / "warm"))
    assert a["value"].to_numpy() == pytest.approx(b["value"].to_numpy(), rel=1e-10)


def _hf_streams(repo, step, ids):
    """Single-token residual streams of the HF GPTNeoX model (hooks), float64: per layer
    (pre, pre + attention output, post) and the model itself."""
    from transformers import GPTNeoXForCausalLM

    m = GPTNeoXForCausalLM(tiny_config()).double().eval().requires_grad_(False)
    sd = {("lm_head.weight" if k == "embed_out.weight" else k): v.double()
          for k, v in load_file(repo / f"step{step}" / "model.safetensors").items()}
    missing = m.load_state_dict(sd, strict=False).missing_keys
    assert not [k for k in missing if "rotary" not in k], missing
    seen = {}
    hooks = [mod.register_forward_hook(lambda _m, inp, out, key=key: seen.__setitem__(
        key, (inp[0], out[0] if isinstance(out, tuple) else out)))
        for i, layer in enumerate(m.gpt_neox.layers)
        for key, mod in (((i, "attn"), layer.attention), ((i, "layer"), layer))]
    with torch.no_grad():
        m(ids[:, None])
    for h in hooks:
        h.remove()
    n_layers = len(m.gpt_neox.layers)
    pre = [seen[(i, "layer")][0][:, 0] for i in range(n_layers)]
    attn = [pre[i] + seen[(i, "attn")][1][:, 0] for i in range(n_layers)]
    post = [seen[(i, "layer")][1][:, 0] for i in range(n_layers)]
    return pre, attn, post, m


def test_top_k_statistics_rows_equal_a_direct_hf_computation(setup, tmp_path):
    """Top-k rows are non-contiguous token ids of a model with padding rows (96 > 90): every
    row must use the model's rows for exactly those ids (the targets dense single factors)."""
    from pythia_probe.stats import CorpusStats

    root, repo, _ = setup
    g = torch.Generator().manual_seed(3)
    p = torch.rand(V, generator=g) ** 4  # skewed unigram: the top 30 ids are not 0..29
    tokens = torch.multinomial(p, 40 * 17, replacement=True, generator=g).view(40, 17)
    path = batch_stats(tokens, V, top_k=30).save(tmp_path / "topk.safetensors")
    st = CorpusStats.load(path)
    ids = st.token_ids
    assert len(ids) == 30 and ids.sort().values.tolist() != list(range(30))
    out = tmp_path / "o"
    assert sweep_main(_argv(repo, path, out, "--steps", "64", "--analyses",
                            "embedding,attention,attention_lnfold,unembedding")) == 0
    assert read_manifest(out)["targets_choice"]["held"] == "dense"
    got = read_results(out).set_index(["analysis", "layer", "head", "metric"])["value"]
    pre, attn, post, m = _hf_streams(repo, 64, ids)
    expect = {}
    for i, layer in enumerate(m.gpt_neox.layers):  # block i is layer i + 1 in the tables
        for kind, E in (("pre", pre), ("attn", attn), ("post", post)):
            expect[("embedding", i + 1, pd.NA, f"cos_{kind}")] = materialised_cosine(E[i],
                                                                                   st.PhiBT)
        W = layer.attention.query_key_value.weight.view(4, 3, -1, 32)  # [head, q/k/v, d_head, d]
        w = layer.input_layernorm.weight
        P = torch.eye(32, dtype=torch.float64) - 1 / 32
        for h in [None, 0, 1, 2, 3]:
            hs = range(4) if h is None else [h]
            A = torch.stack([W[j, 0].T @ W[j, 1] for j in hs]).mean(0)
            key = ("cos_mean" if h is None else "cos_head")
            E = pre[i]
            Af = P @ torch.diag(w) @ A @ torch.diag(w) @ P
            authors = st.Qbar.T if h is None else st.QbarHead.T  # pythia.py, per-head script
            for suffix, target in (("", st.Qbar), ("_authors", authors)):
                expect[("attention", i + 1, h, key + suffix)] = materialised_cosine(
                    E @ A @ E.T, target)
                expect[("attention_lnfold", i + 1, h, key + suffix)] = materialised_cosine(
                    E @ Af @ E.T, target)
    WE, WU = m.gpt_neox.embed_in.weight[ids], m.lm_head.weight[ids]  # [k, d_model] each
    expect[("unembedding", pd.NA, pd.NA, "cos_WU_Bbar")] = materialised_cosine(WU, st.Bbar.T)
    expect[("unembedding", pd.NA, pd.NA, "cos_WEWU_Bbar")] = materialised_cosine(WE @ WU.T,
                                                                                st.Bbar)
    expect[("unembedding", pd.NA, pd.NA, "cos_WE_PhiBT")] = materialised_cosine(WE, st.PhiBT)
    assert len(got) == len(expect)
    for key, value in expect.items():
        key = tuple(pd.NA if k is None else k for k in key)
        assert got[key] == pytest.approx(value, rel=1e-6, abs=1e-9), key
    # control: rows 0..29 of the model instead of the top-k ids give other numbers
    wrong = materialised_cosine(m.gpt_neox.embed_in.weight[:30], st.PhiBT)
    assert abs(got[("embedding", 1, pd.NA, "cos_pre")] - wrong) > 1e-3


@pytest.mark.parametrize("damage", ["empty", "truncated", "other_step", "missing_analysis"])
def test_damaged_shards_are_recomputed_not_counted_done(setup, clean_run, tmp_path, damage):
    """A shard counts as done only if it reads back valid with every asked analysis."""
    import shutil

    from pythia_probe.results import read_shard, write_shard
    root, repo, stats = setup
    out = tmp_path / "out"
    shutil.copytree(clean_run[0], out)
    shard = out / "shards" / "step4.parquet"
    if damage == "empty":
        shard.write_bytes(b"")
    elif damage == "truncated":
        shard.write_bytes(shard.read_bytes()[:100])
    elif damage == "other_step":
        write_shard(read_shard(out / "shards" / "step2.parquet"), shard)
    else:
        df = read_shard(shard)
        write_shard(df[df["analysis"] != "attention"], shard)
    assert sweep_main(_argv(repo, stats, out)) == 0
    pd.testing.assert_frame_equal(_sorted(read_results(out)), _sorted(clean_run[1]))


def test_manifest_says_failed_with_the_reason_when_the_run_dies(setup, tmp_path, monkeypatch):
    """Early failures (before the first step) and disk-full abort the run: status failed."""
    from pythia_probe.errors import DiskFullError
    root, repo, stats = setup

    def no_targets(*a, **k):
        raise RuntimeError("target preparation broke")
    monkeypatch.setattr(execute, "prepare_scorer", no_targets)
    with pytest.raises(RuntimeError):
        sweep_main(_argv(repo, stats, tmp_path / "early"))
    m = read_manifest(tmp_path / "early")
    assert m["status"] == "failed" and "target preparation broke" in m["reason"]
    monkeypatch.undo()

    def disk_full(loaded, step, scorer, where):
        raise DiskFullError(f"disk full writing step{step}.parquet: 0 bytes free")
    monkeypatch.setattr(execute, "run_step", disk_full)
    out = tmp_path / "full"
    with pytest.raises(DiskFullError):
        sweep_main(_argv(repo, stats, out))
    m = read_manifest(out)
    assert m["status"] == "failed" and m["reason"].startswith("disk full writing step0")
    assert not (out / "failed").exists()  # no half-written failure records


def test_failure_records_are_written_atomically_with_the_user_message(setup, tmp_path):
    import shutil
    root, repo, stats = setup
    bad = tmp_path / "repo"
    shutil.copytree(repo, bad)
    (bad / "step2" / "model.safetensors").write_bytes(b"not a safetensors file")
    out = tmp_path / "out"
    assert sweep_main(_argv(bad, stats, out, "--retries", "0")) == 1
    assert [p.name for p in (out / "failed").iterdir()] == ["step2.json"]  # no temp files left
    rec = json.loads((out / "failed" / "step2.json").read_text())
    assert rec["error"] and rec["traceback"]
    assert read_manifest(out)["status"] == "failed" and "1 steps failed" in \
        read_manifest(out)["reason"]


def test_a_new_analysis_is_one_module_and_one_registry_line(setup, tmp_path, monkeypatch,
                                                            capsys):
    """The extension point: an Analysis declares what it needs; the sweep fetches those
    weights, prepares those targets, plans its cost and writes its rows, with no other edit."""
    from pythia_probe.analysis import Analysis, Cost, Needs, registry
    from pythia_probe.analysis.cosine import cosines, tall

    def run_norms(x, th, opts):  # W_E against Bbar^T: needs only the embedding and one theory
        return [{"analysis": "we_vs_bbar", "layer": None, "metric": "cos",
                 "value": cosines([tall(x.W_E, th["BbarT"].dtype)], th["BbarT"], opts.chunk)[0],
                 "n": th["BbarT"].d_vocab}]

    toy = Analysis("we_vs_bbar", Needs(weights=("embed",), targets=("BbarT",)), run_norms,
                   lambda s: Cost(bases=1))
    monkeypatch.setitem(registry.REGISTRY, toy.name, toy)  # the one registry line
    root, repo, stats = setup
    fetched = []
    real = execute.tensor_names
    monkeypatch.setattr(execute, "tensor_names", lambda needs: (fetched.append(needs.weights),
                                                               real(needs))[1])
    argv = ["--model", str(repo), "--stats", str(stats), "--steps", "0,64", "--analyses",
            "we_vs_bbar", "--dtype", "float64", "--out", str(tmp_path / "o")]
    assert sweep_main([*argv, "--dry-run"]) == 0
    assert "multiply-adds per checkpoint" in capsys.readouterr().out
    assert sweep_main(argv) == 0
    df = read_results(tmp_path / "o")
    assert set(df["analysis"]) == {"we_vs_bbar"} and sorted(df["step"]) == [0, 64]
    assert set(fetched) == {("embed",)}  # no attention/MLP weights fetched for it
    from pythia_probe.analysis.cosine import materialised_cosine
    from pythia_probe.stats import CorpusStats
    w = load_file(repo / "step64" / "model.safetensors")["gpt_neox.embed_in.weight"][:V]
    want = materialised_cosine(w.double(), CorpusStats.load(stats).Bbar.T)
    assert df[df["step"] == 64]["value"].item() == pytest.approx(want, rel=1e-6)
