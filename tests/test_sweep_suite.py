"""The Pythia suite against a loopback hub: Pythia-shaped models of two sizes sharing one
tokenizer in the real one's format, Skylion007/openwebtext and a FineWeb-shaped
HuggingFaceFW/fineweb (``pythia_probe.testing.repos.build_pythia_suite_hub``).

As in tests/test_main_job.py, two things are set for the test machine: the memory budget (a
24 GB CPU machine) and ``--top-k 300`` (the default is the full vocabulary), so a step is
scored in a fraction of a second."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from pythia_probe.analysis.cosine import materialised_cosine
from pythia_probe.arch import NeoXConfig, NeoXWeights, single_token_residuals
from pythia_probe.errors import BadInputError
from pythia_probe.hub.revisions import read_ledger
from pythia_probe.results import read_manifest, read_results
from pythia_probe.stats import CorpusStats, recipe
from pythia_probe.stats.__main__ import main as stats_main
from pythia_probe.sweep import statistics
from pythia_probe.sweep.__main__ import main as sweep_main
from pythia_probe.testing.endpoint import use_endpoint
from pythia_probe.testing.hub import HubServer
from pythia_probe.testing.repos import build_pythia_suite_hub

K = 300
SMALL, LARGE = "EleutherAI/pythia-70m", "EleutherAI/pythia-160m"
LAYERS = {SMALL: 2, LARGE: 3}
STEPS = [0, 1, 2, 4, 512, 1000]
KEY = ["model", "step", "analysis", "layer", "head", "metric"]

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


# ---- many models in one command ----------------------------------------------------------------
def _argv(out, *extra):
    """The suite command of these tests; --top-k given (the test machine's number) so that the
    processes started below build the same statistics without the in-process budget."""
    return ["--model", f"{SMALL},{LARGE}", "--steps", ",".join(map(str, STEPS)), "--top-k",
            str(K), "--out", str(out), "--no-progress", *extra]


def _table(df):
    return df.drop(columns="run_id").sort_values(KEY, na_position="first").reset_index(drop=True)


def _count_builds(monkeypatch) -> list:
    """Every statistics build (recipe.ensure's compute) is recorded."""
    builds, real = [], recipe.compute
    monkeypatch.setattr(recipe, "compute", lambda *a, **k: builds.append(a) or real(*a, **k))
    return builds


@pytest.fixture(scope="module")
def one_process(suite, tmp_path_factory):
    """The suite command in one process: the table the shards must equal."""
    root, _ = suite
    home = tmp_path_factory.mktemp("one")
    with pytest.MonkeyPatch.context() as mp, HubServer(root) as hub, \
            use_endpoint(hub.endpoint):
        mp.setenv("PYTHIA_PROBE_CACHE", str(home / "cache"))
        builds = _count_builds(mp)
        assert sweep_main(_argv(home / "out")) == 0
        gets = hub.requests("GET")
    return home, read_results(home / "out"), gets, len(builds)


def test_one_command_two_sizes_one_statistics_build_one_table(suite, one_process, capfd):
    root, _ = suite
    home, df, gets, builds = one_process
    out = home / "out"
    assert builds == 1  # both sizes share the tokenizer: one statistics build
    assert set(df["model"]) == {SMALL, LARGE} and df["stats_id"].nunique() == 1
    for model, n_layers in LAYERS.items():
        mine = df[df["model"] == model]
        assert sorted(mine["step"].unique()) == STEPS
        assert sorted(mine["layer"].dropna().unique()) == list(range(1, n_layers + 1))
    # each checkpoint downloaded once; step1 serves step0's weights: copied, not fetched
    weights = [g["path"] for g in gets if g["path"].endswith(".bin")]
    assert len(weights) == len(set(weights)) == 2 * (len(STEPS) - 1)
    one = df.set_index(KEY)["value"]
    for model in LAYERS:
        a, b = (one.xs((model, s), level=("model", "step")) for s in (0, 1))
        pd.testing.assert_series_equal(a, b)
    m = read_manifest(out)
    assert m["status"] == "complete" and m["config"]["model"] == f"{SMALL},{LARGE}"
    assert not (out / "claims").exists()  # every claim released, none can come any more
    assert set(m["models"]) == {SMALL, LARGE} and m["models"][LARGE]["lacks"] == []
    ledger = read_ledger(out / "revisions.parquet")
    assert len(ledger) == 2 * len(STEPS)
    assert set(ledger.loc[ledger["status"] == "duplicate", "step"]) == {1}
    # the shards of each model in its own folder; the comparative figure and table
    assert {p.name for p in (out / "shards").iterdir()} == {"EleutherAI--pythia-70m",
                                                          "EleutherAI--pythia-160m"}
    assert (out / "plots" / "compare_embedding_cos_post.png").stat().st_size > 1000
    assert SMALL in (out / "plots" / "compare_embedding_cos_post.txt").read_text()
    assert (out / "summary.parquet").is_file()
    # one number recomputed literally: the larger model, step 512, layer 3, cos_post (float64)
    stats = CorpusStats.load(m["statistics"]["file"])
    folder = root / LARGE / "step512"
    c = NeoXConfig.from_dict(json.loads((folder / "config.json").read_text()))
    w = NeoXWeights(torch.load(folder / "pytorch_model.bin", weights_only=True), c)
    E = single_token_residuals(w, stats.token_ids, dtype=torch.float64)["post"][2]
    assert one[(LARGE, 512, "embedding", 3, pd.NA, "cos_post")] == pytest.approx(
        materialised_cosine(E, stats.PhiBT), rel=1e-4)


def test_the_plan_names_each_model_and_the_totals(suite, one_process, tmp_path, capsys,
                                                  monkeypatch):
    root, _ = suite
    home, *_ = one_process
    monkeypatch.setenv("PYTHIA_PROBE_CACHE", str(home / "cache"))
    with HubServer(root) as hub, use_endpoint(hub.endpoint):
        assert sweep_main(_argv(tmp_path / "plan", "--dry-run")) == 0
        assert not [g for g in hub.requests("GET") if g["path"].endswith(".bin")]
    text = capsys.readouterr().out
    for model in LAYERS:
        assert f"model {model}: {len(STEPS)} steps: 0 done, {len(STEPS)} to score" in text
        assert f"revisions of {model}: {len(STEPS) - 1} ok, 1 duplicate" in text
    total = next(line for line in text.splitlines() if line.startswith("all 2 models"))
    assert f"{2 * len(STEPS)} (model, step) tasks" in total and "disk at any time" in total
    when = next(line for line in text.splitlines() if line.startswith("time: "))
    assert "scoring >=" in when and "multiply-adds/s measured" in when and "downloads" in when
    assert "(shared by EleutherAI/pythia-70m, EleutherAI/pythia-160m)" in text
    assert not (tmp_path / "plan").exists()


def _env(hub, home) -> dict:
    return {**os.environ, "HF_ENDPOINT": hub.endpoint, "PYTHIA_PROBE_CACHE": str(home / "cache"),
            "OMP_NUM_THREADS": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


KILLER = """import os, signal, sys
from pythia_probe.sweep import execute
real = execute.run_step
def once(*a):
    path = real(*a)
    os.kill(os.getpid(), signal.SIGKILL)  # a machine lost mid-run: no cleanup at all
execute.run_step = once
from pythia_probe.cli import run_main
from pythia_probe.sweep.__main__ import main
raise SystemExit(run_main(lambda: main(sys.argv[1:]), "sweep"))
"""


def test_two_shards_in_two_processes_equal_one_and_a_killed_shard_resumes(
        suite, one_process, tmp_path):
    """--shard 0/2 killed (SIGKILL) after its first shard: its claims stay behind. Then both
    shards run at once in two processes into the one folder: the killed one's claims are taken
    over, and the folder's table is the one process's, with one run id."""
    root, _ = suite
    home, want, *_ = one_process
    out = tmp_path / "sharded"
    (tmp_path / "killer.py").write_text(KILLER)
    with HubServer(root) as hub:
        env = _env(hub, home)
        killed = subprocess.run([sys.executable, str(tmp_path / "killer.py"),
                                 *_argv(out, "--shard", "0/2", "--no-plots")], env=env,
                                capture_output=True, text=True, timeout=300)
        assert killed.returncode == -9, killed.stderr[-2000:]
        left = list((out / "claims").rglob("step*.json"))
        assert left and json.loads(left[0].read_text())["pid"] != os.getpid()
        assert not (out / "summary.parquet").exists()
        procs = [subprocess.Popen([sys.executable, "-m", "pythia_probe.sweep",
                                   *_argv(out, "--shard", f"{i}/2", "--no-plots")],
                                  env=env, text=True, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE)
                 for i in (0, 1)]
        done = [p.communicate(timeout=600) for p in procs]
    for p, (_, e) in zip(procs, done, strict=True):
        assert p.returncode == 0, e[-3000:]
    got = read_results(out)
    pd.testing.assert_frame_equal(_table(got), _table(want))
    assert got["run_id"].nunique() == 1
    assert read_manifest(out)["status"] == "complete" and (out / "summary.parquet").is_file()
    assert not (out / "claims").exists()  # every claim released, the folder removed at the end
    assert any("peak step" in o for o, _ in done)  # the last one to finish summarised


def test_torchrun_of_two_ranks_equals_one_process(suite, one_process, tmp_path):
    root, _ = suite
    home, want, *_ = one_process
    out = tmp_path / "ranks"
    with HubServer(root) as hub:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", "2", "-m", "pythia_probe.sweep", *_argv(out, "--no-plots")]
        proc = subprocess.run(cmd, env=_env(hub, home), capture_output=True, text=True,
                              timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rank 0:" in proc.stdout and "rank 1:" in proc.stdout
    got = read_results(out)
    pd.testing.assert_frame_equal(_table(got), _table(want))
    assert got["run_id"].nunique() == 1 and read_manifest(out)["world"] == 2


# ---- a step one model lacks; identical weights across models -------------------------------------
DEDUP = "EleutherAI/pythia-160m-deduped"


@pytest.fixture(scope="module")
def uneven(tmp_path_factory):
    """The larger size lacks step 4; a -deduped twin whose step0 (and so step1) are the larger
    model's bytes."""
    root = tmp_path_factory.mktemp("uneven-hub")
    models = {SMALL: (8, 2), LARGE: (16, 3), DEDUP: (16, 3)}
    build_pythia_suite_hub(root, models, steps=(0, 1, 2, 4), docs_per_shard=20,
                           lacking={LARGE: [4]})
    for step in (0, 1):
        shutil.copyfile(root / LARGE / f"step{step}" / "pytorch_model.bin",
                        root / DEDUP / f"step{step}" / "pytorch_model.bin")
    return root


def test_a_step_one_model_lacks_is_reported_for_it_only_and_twins_are_fetched_once(
        uneven, machine, capsys):
    out = machine / "o"
    with HubServer(uneven) as hub, use_endpoint(hub.endpoint):
        assert sweep_main(["--model", f"{SMALL},{LARGE},{DEDUP}", "--steps", "0,1,2,4",
                           "--top-k", str(K), "--out", str(out), "--no-plots",
                           "--no-progress"]) == 0
        weights = [g["path"] for g in hub.requests("GET") if g["path"].endswith(".bin")]
    text = capsys.readouterr().out
    assert f"{LARGE} lacks 1 of the asked steps (4)" in text
    assert f"{SMALL} lacks" not in text and f"{DEDUP} lacks" not in text
    df = read_results(out)
    steps = df.groupby("model")["step"].unique().map(sorted).to_dict()
    assert steps == {SMALL: [0, 1, 2, 4], LARGE: [0, 1, 2], DEDUP: [0, 1, 2, 4]}
    assert read_manifest(out)["models"][LARGE]["lacks"] == [4]
    # the twin's step0 is the larger model's: downloaded once, its rows copied under its name
    assert len(weights) == len(set(weights)) == 3 + 2 + 3 - 1
    one = df.set_index(KEY)["value"]
    pd.testing.assert_series_equal(one.xs((LARGE, 0), level=("model", "step")),
                                   one.xs((DEDUP, 0), level=("model", "step")))
    with HubServer(uneven) as hub, use_endpoint(hub.endpoint), pytest.raises(
            ValueError, match="3"):
        sweep_main(["--model", f"{SMALL},{LARGE}", "--steps", "0,3", "--out", str(out)])


# ---- the notebook: the README's ten lines -----------------------------------------------------
def _readme_lines() -> list[str]:
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = text.split("## From a notebook", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0].strip().splitlines()


NOTEBOOK_IDS = 1000  # the notebook hub's tokenizer: the full vocabulary, scored in seconds


@pytest.fixture(scope="module")
def notebook_hub(tmp_path_factory):
    """The two sizes with the early steps only and a 1,000-id tokenizer: the README's lines
    score the full vocabulary (no --top-k), here 1,000 ids rather than Pythia's 50,277."""
    root = tmp_path_factory.mktemp("notebook-hub")
    build_pythia_suite_hub(root, steps=(0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
                           d_vocab=NOTEBOOK_IDS)
    return root


def test_the_readme_notebook_lines_run_as_written(notebook_hub, machine, monkeypatch, capsys):
    """The README's lines take the default vocabulary (the full one, every machine), so they
    build the full-vocabulary recipe once; a rerun builds and fetches nothing."""
    root = notebook_hub
    lines = _readme_lines()
    assert len(lines) == 10 and lines[0] == "import pythia_probe as pp"
    builds = _count_builds(monkeypatch)
    ns: dict = {}
    with HubServer(root) as hub, use_endpoint(hub.endpoint):
        exec(compile("\n".join(lines), "README.md", "exec"), ns)  # exactly the README's lines
        first_builds = len(builds)
        gets = len(hub.requests("GET"))
        again = ns["pp"].run_sweep(model=ns["models"], steps="early", out="runs/notebook",
                                   plots=False)  # the figures were drawn by the first run
        refetched = [g for g in hub.requests("GET")[gets:] if g["path"].endswith(".bin")]
    df, table, peaks, st = ns["df"], ns["table"], ns["peaks"], ns["st"]
    assert first_builds == len(builds) == 1 and not refetched  # the rerun resumed
    early = [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    assert df.groupby("model")["step"].unique().map(sorted).to_dict() == {SMALL: early,
                                                                         LARGE: early}
    pd.testing.assert_frame_equal(_table(table), _table(df))
    pd.testing.assert_frame_equal(_table(again), _table(df))
    assert set(df["stats_id"]) == {st.stats_id} and st.d_vocab == st.meta["full_d_vocab"] > K
    assert st.d_vocab == NOTEBOOK_IDS
    # the recipe keeps 10 document groups by default: every embedding/attention row is scaled
    assert st.groups == 10
    scaled = df[df["analysis"].isin(["embedding", "attention", "attention_lnfold"])]
    assert scaled[["chance", "ceiling", "ci_low", "ci_high"]].notna().all().all()
    assert ((scaled["ci_low"] <= scaled["value"]) & (scaled["value"] <= scaled["ci_high"])).all()
    assert sorted(peaks["model"]) == [LARGE] * 3 + [SMALL] * 2
    out = machine / "runs" / "notebook"
    assert (out / "plots" / "compare_embedding_cos_post.png").is_file()
    printed = capsys.readouterr().out
    assert "EleutherAI/pythia-160m" in printed and "peak_step" in printed


def test_pp_statistics_finds_the_recipe_file_by_content_and_bad_keywords_are_one_line(
        suite, one_process, monkeypatch):
    import pythia_probe as pp

    root, _ = suite
    home, df, *_ = one_process
    monkeypatch.setenv("PYTHIA_PROBE_CACHE", str(home / "cache"))
    builds = _count_builds(monkeypatch)
    with HubServer(root) as hub, use_endpoint(hub.endpoint):
        st = pp.statistics(model=LARGE, top_k=str(K))  # the recipe for its tokenizer: cached
    assert not builds and set(df["stats_id"]) == {st.stats_id} and st.d_vocab == K
    assert pp.statistics(home / "out").stats_id == st.stats_id  # the file a run used
    with pytest.raises(BadInputError, match=r"unknown flags \['stepz'\]"):
        pp.run_sweep(model=SMALL, stepz="0")
