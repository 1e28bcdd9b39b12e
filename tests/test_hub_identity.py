"""Issue 28 items 2 and 3: models keyed by identity, not folder name; bytes trusted over
listings (a duplicate or suspect verdict from the tree listing's sha256 is confirmed against what
the hub serves before any row is copied); the ledger asks only about the asked steps and the
final one, however many branches the hub lists."""

import hashlib
import os
from collections import Counter

import pandas as pd
import pytest
import torch

from pythia_probe.__main__ import main as pythia_probe_main
from pythia_probe.hub.revisions import read_ledger
from pythia_probe.results import read_results
from pythia_probe.stats import batch_stats
from pythia_probe.testing.repos import build_pythia_like_repo

REPO = "org/ledger"
STEPS = (0, 1, 2, 4)  # step1 = step0's bytes (a true duplicate); main = step4's bytes
WEIGHTS = "model.safetensors"
V = 90
STATS = "stats.safetensors"
KEY = ["model", "step", "analysis", "layer", "head", "metric"]

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def hub_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    build_pythia_like_repo(root, REPO, STEPS, layouts={s: ("safetensors", 1) for s in STEPS})
    return root


@pytest.fixture(scope="module")
def local_run(hub_root, tmp_path_factory):
    """The hub's repo swept as a local folder: (folder, out, its table, the statistics)."""
    tokens = torch.randint(0, V, (40, 17), generator=torch.Generator().manual_seed(1))
    batch_stats(tokens, V).save(hub_root / STATS)
    folder, out = hub_root / REPO, tmp_path_factory.mktemp("local") / "out"
    assert pythia_probe_main(sweep_argv(str(folder), hub_root / STATS, out, "0,1,2")) == 0
    return folder, out, table(out), hub_root / STATS


@pytest.fixture
def env(hub, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    monkeypatch.setenv("PYTHIA_PROBE_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def sha(hub_root, branch: str) -> str:
    return hashlib.sha256((hub_root / REPO / branch / WEIGHTS).read_bytes()).hexdigest()


def sweep_argv(model: str, stats, out, steps: str = "0,2") -> list[str]:
    return ["sweep", "--model", model, "--stats", str(stats), "--out", str(out), "--steps",
            steps, "--analyses", "embedding", "--dtype", "float64", "--no-plots",
            "--no-progress"]


def one_line(capsys) -> str:
    """The one error line (warnings aside: the test repo ships no tokenizer.json)."""
    err = [x for x in capsys.readouterr().err.strip().splitlines() if " WARNING " not in x]
    assert len(err) == 1, err
    return err[0]


def table(out) -> pd.DataFrame:
    df = read_results(out).drop(columns=["run_id"])
    return df.sort_values(KEY, na_position="first").reset_index(drop=True)


def weight_gets(hub) -> list[str]:
    return [r["path"] for r in hub.requests("GET") if r["path"].endswith(WEIGHTS)]


# ---- item 2: models keyed by identity ---------------------------------------------------------
@pytest.mark.parametrize("models,message", [
    ("org/tiny,B2/tiny", "org/tiny and B2/tiny are two models named 'tiny'"),
    ("org/tiny,C3/tiny", "org/tiny and C3/tiny are two models named 'tiny'"),  # common step 0
    ("org/tiny,./org/tiny", "org/tiny and ./org/tiny are the same folder ({}/org/tiny)"),
    ("org/tiny,link", "org/tiny and link are the same folder ({}/org/tiny)"),
    ("org/tiny,org/tiny/", "--model 'org/tiny,org/tiny/': give hub ids or folders, "
                           "comma-separated, each once"),
])
def test_two_spellings_or_two_folders_of_one_name_are_refused(tmp_path, monkeypatch, capsys,
                                                              models, message):
    """org/tiny and B2/tiny (disjoint steps) were one model "tiny" with the steps of both;
    with C3/tiny (a common step) or the same folder twice, "the revision ledger has more than
    one row for a step"."""
    build_pythia_like_repo(tmp_path, "org/tiny", (0,), with_main=False)
    build_pythia_like_repo(tmp_path, "B2/tiny", (2,), with_main=False)
    build_pythia_like_repo(tmp_path, "C3/tiny", (0, 2), with_main=False)
    os.symlink(tmp_path / "org" / "tiny", tmp_path / "link")
    monkeypatch.chdir(tmp_path)
    assert pythia_probe_main(sweep_argv(models, "none.safetensors", "out", "0,2")) == 2
    assert message.format(tmp_path.resolve()) in one_line(capsys)
    assert not (tmp_path / "out").exists()


def test_a_folder_and_its_trailing_separator_are_one_model(local_run, capsys):
    """A then A/ into one --out: the second run is the same run (nothing rescored), one model."""
    folder, out, first, stats = local_run
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("shards/*.parquet")}
    assert len(stamps) == 3
    assert pythia_probe_main(sweep_argv(f"{folder}/", stats, out, "0,1,2")) == 0
    assert {p: p.stat().st_mtime_ns for p in out.glob("shards/*.parquet")} == stamps  # not redone
    pd.testing.assert_frame_equal(table(out), first)
    assert set(first["model"]) == {"ledger"} and sorted(set(first["step"])) == [0, 1, 2]


# ---- item 3: bytes over listings --------------------------------------------------------------
@pytest.mark.parametrize("like,verdict", [("step0", "duplicate"), ("main", "suspect")])
def test_a_listing_that_files_a_step_with_another_steps_sha256_is_refused(
        hub, hub_root, env, capsys, like, verdict):
    """The tree listing gives step2's weight file the sha256 of step0's (or main's) while its
    bytes and X-Linked-Etag are its own: it was filed as a duplicate (suspect) and given step0's
    rows without its bytes ever being read. Now the HEAD says otherwise: refused, naming it."""
    out = env / "r.parquet"
    assert pythia_probe_main(["revisions", "--model", REPO, "--steps", "0,2", "--out",
                              str(out)]) == 0
    assert read_ledger(out)["status"].tolist() == ["ok", "ok"]  # the truth, for contrast
    hub.tamper("sha256", sha(hub_root, like), WEIGHTS, branch="step2")
    out.unlink()
    assert pythia_probe_main(["revisions", "--model", REPO, "--steps", "0,2", "--out",
                              str(out)]) == 2
    line = one_line(capsys)
    assert f"{WEIGHTS} of {REPO}@step2: the hub's tree listing gives it sha256 " \
           f"{sha(hub_root, like)}, but the X-Linked-Etag" in line
    assert f"says {sha(hub_root, 'step2')}" in line and "no rows are copied" in line
    assert not out.exists() and not weight_gets(hub)


def test_the_sweep_refuses_a_lying_listing_before_any_weight_is_read(hub, hub_root, local_run,
                                                                     env, capsys):
    hub.tamper("sha256", sha(hub_root, "step0"), WEIGHTS, branch="step2")
    assert pythia_probe_main(sweep_argv(REPO, hub_root / STATS, env / "out")) == 2
    assert f"{WEIGHTS} of {REPO}@step2: the hub's tree listing gives it" in one_line(capsys)
    assert not weight_gets(hub) and not list(env.glob("out/**/*.parquet"))


def test_10000_unrelated_branches_the_ledger_asks_only_about_asked_and_final(hub, local_run,
                                                                              env, capsys):
    """The refs list 10,000 branches the hub does not serve (404), the last of them beyond
    every real step: --steps 0,1,2 lists the asked steps, main and that last one (its 404 leaves
    main as the final reference) and gives the table of the same folder swept locally. step1 =
    step0 in bytes: confirmed by one HEAD of each file, step1's rows copied from step0's."""
    hub.phantom_branches = [f"step{n}" for n in range(5000, 15000)]
    out = env / "out"
    assert pythia_probe_main(sweep_argv(REPO, local_run[3], out, "0,1,2")) == 0
    trees = {r["path"].split("/tree/")[1] for r in hub.requests("GET", "/tree/")}
    assert len(trees) == 5  # step0, step1, step2, main, and the hub's last listed branch (404)
    assert "the hub lists the branch step14999 of the final model but does not serve it" in \
        capsys.readouterr().err
    commits = read_ledger(out / "revisions.parquet").set_index("step")["commit"]
    heads = Counter(r["path"].split("/")[-2] for r in hub.requests("HEAD")
                    if r["path"].endswith(WEIGHTS))
    # one HEAD confirming each shared sha256 (step0's, step1's), one before each download
    assert heads == {commits[0]: 2, commits[1]: 1, commits[2]: 1}
    assert len(weight_gets(hub)) == 2  # step0's bytes and step2's: step1's rows are copied
    got = table(out)
    pd.testing.assert_frame_equal(got.drop(columns="model"), local_run[2].drop(columns="model"))
    a, b = (got[got["step"] == s].drop(columns=["step", "revision_status"]).reset_index(drop=True)
            for s in (0, 1))
    pd.testing.assert_frame_equal(a, b)
    assert set(got.loc[got["step"] == 1, "revision_status"]) == {"duplicate"}
    ledgers = [read_ledger(o / "revisions.parquet")[["step", "same_as", "status"]]
               for o in (out, local_run[1])]
    assert ledgers[0].equals(ledgers[1])
