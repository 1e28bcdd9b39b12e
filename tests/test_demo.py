"""The demo model: schedule, data, checkpoints readable as GPT-NeoX, training that learns."""

import json

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from pythia_probe.demo import DemoConfig, build_demo_model, checkpoint_steps, load_tokens

TINY = DemoConfig(n_stories=150, seq_len=32, n_layers=2, d_model=32, n_heads=4, d_mlp=64,
                  batch_size=16, max_step=40, save_every=16, lr=1e-2, warmup=4)


pytestmark = pytest.mark.usefixtures("one_thread")


def test_schedule_is_pythia_like():
    assert checkpoint_steps(1536, 256) == [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 768, 1024,
                                           1280, 1536]
    assert checkpoint_steps(40, 16) == [0, 1, 2, 4, 8, 16, 32, 40]


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="divisible by n_heads"):
        DemoConfig(d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="max_step must be >= 1"):
        DemoConfig(max_step=0)

def test_demo_windows_are_grouped_by_the_story_of_their_first_token():
    """The statistics' document groups are stories, not windows: every window is in the
    group of the story its first token comes from (a literal walk over the packed stream)."""
    from pythia_probe.builtin_corpus import generate_stories
    from pythia_probe.demo import build_data
    from pythia_probe.stats import batch_stats
    from pythia_probe.tokenizer import encode_documents

    tok, tokens, documents = build_data(TINY)
    stories = list(encode_documents(tok, generate_stories(TINY.n_stories, seed=TINY.seed),
                                    drop_oov=True))
    story_of = [s for s, ids in enumerate(stories) for _ in ids]
    L = TINY.seq_len + 1
    assert documents.tolist() == [story_of[w * L] for w in range(len(tokens))]
    assert len(set(documents.tolist())) < len(tokens)  # stories span several windows
    G = 10
    st = batch_stats(tokens, len(tok), groups=G, documents=documents)
    for g in (0, 3):
        rows = (documents % G == g)
        part = st.subset([g])
        assert part.meta["counts"]["sequences"] == int(rows.sum())
        assert part.meta["counts"]["docs"] == len(range(g, int(documents.max()) + 1, G))
    with pytest.raises(ValueError, match="non-decreasing"):
        batch_stats(tokens, len(tok), groups=G, documents=documents.flip(0))


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    info = build_demo_model(TINY, out)
    return out, info


def test_checkpoints_follow_schedule_and_load_as_neox(demo_dir):
    from pythia_probe.arch import NeoXConfig, NeoXWeights

    out, info = demo_dir
    saved = sorted(int(p.name[4:]) for p in out.glob("step*"))
    assert saved == checkpoint_steps(TINY.max_step, TINY.save_every)
    cfg = NeoXConfig.from_dict(json.loads((out / "step40" / "config.json").read_text()))
    w = NeoXWeights(load_file(out / "step40" / "model.safetensors"), cfg)
    assert w.W_E.shape == (cfg.d_vocab, 32) and cfg.n_layers == 2
    tokens = load_tokens(out)
    assert tokens.shape[1] == TINY.seq_len + 1 and int(tokens.max()) < cfg.d_vocab - 1  # no UNK
    w0 = load_file(out / "step0" / "model.safetensors")
    w1 = load_file(out / "step1" / "model.safetensors")
    assert not torch.equal(w0["gpt_neox.embed_in.weight"], w1["gpt_neox.embed_in.weight"])


def test_training_reduces_loss_and_rerun_skips(demo_dir):
    out, info = demo_dir
    assert info["trained"] and info["loss_final"] < info["loss_first"] - 0.5
    assert build_demo_model(TINY, out)["trained"] is False


SMALL = dict(n_stories=150, seq_len=32, n_layers=2, d_model=32, d_mlp=64, batch_size=16,
             max_step=8)


@pytest.fixture(scope="module")
def small_demo(tmp_path_factory, one_thread):
    """The demo at SMALL, run once for the module: ``torchrun --nproc_per_node 2`` into ``two``
    (rank 0 trains into ``work``), then one process into ``one`` on the trained ``work``, its
    printed output kept. Returns ``(root, the torchrun process, one process's exit code, what it
    printed)``."""
    import contextlib
    import io
    import os
    import subprocess
    import sys

    from pythia_probe import demo

    root = tmp_path_factory.mktemp("small-demo")
    script = root / "demo2.py"
    script.write_text(
        "import sys\nfrom pythia_probe import demo\nfrom pythia_probe.ranks import from_env\n"
        f"cfg = demo.DemoConfig(**{SMALL!r})\nranks = from_env('cpu')\n"
        "raise SystemExit(demo.run_demo(sys.argv[1], cfg, work=sys.argv[2], ranks=ranks, "
        "progress=False))\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           "2", str(script), str(root / "two"), str(root / "work")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(printed):
        mp.setenv("HF_HUB_OFFLINE", "1")
        code = demo.run_demo(root / "one", demo.DemoConfig(**SMALL), work=root / "work",
                             progress=False)
    return root, proc, code, printed.getvalue()


def test_demo_end_to_end_offline(small_demo, monkeypatch):
    """--demo: corpus -> tokenizer -> checkpoints -> statistics -> sweep -> tables + plots (the
    one-process run of ``small_demo``)."""
    from pythia_probe import demo
    from pythia_probe.results import read_manifest, read_results
    from pythia_probe.sweep.__main__ import main as sweep_main

    root, _, code, printed = small_demo
    assert code == 0
    df = read_results(root / "one" / "run")
    assert sorted(df["step"].unique()) == [0, 1, 2, 4, 8]
    assert set(df["analysis"]) == {"embedding", "attention", "attention_lnfold", "unembedding",
                                   "attention_text"}
    text = df[df["analysis"] == "attention_text"]
    assert len(text) == 5 * 2 * (3 + 2 * 4) and text["value"].between(-1, 1).all()
    # its intervals come from the left-out statistics' Qbar and Delta, not the full ones
    assert (text["ci_high"] > text["ci_low"]).mean() > 0.9
    # every embedding and attention row has its scale: chance, ceiling and the jackknife
    # interval over the statistics' 10 window groups (on by default, issue 19 item 2)
    scaled = df[df["analysis"].isin(["embedding", "attention", "attention_lnfold"])]
    assert len(scaled) and scaled[["chance", "ceiling", "ci_low", "ci_high"]].notna().all().all()
    assert ((scaled["ci_low"] <= scaled["value"]) & (scaled["value"] <= scaled["ci_high"])).all()
    assert (scaled["ci_high"] > scaled["ci_low"]).all() and (scaled["ceiling"] <= 1 + 1e-9).all()
    m = read_manifest(root / "one" / "run")
    assert m["status"] == "complete"
    # what was used: the built-in corpus the statistics came from, no recipe of another corpus
    assert m["statistics"]["from_file"]["corpus"]["dataset"] == "builtin"
    assert "dataset" not in m["config"]["statistics"] and "recipe" not in m["statistics"]
    assert (root / "one" / "plots" / "embedding_cos_post.png").stat().st_size > 1000
    # the printed summary is the table's: per layer the peak step and value, the exit step
    from pythia_probe.hub.revisions import read_ledger
    from pythia_probe.summary import summary_table
    want = summary_table(df)
    got = pd.read_parquet(root / "one" / "run" / "summary.parquet")
    pd.testing.assert_frame_equal(got, want, check_dtype=False)
    row = want[(want["analysis"] == "embedding") & (want["metric"] == "cos_post")
               & (want["layer"] == 2) & want["head"].isna()].iloc[0]
    assert "embedding cos_post" in printed and f"{row.peak_value:.3f}" in printed
    assert "drift" not in printed  # last minus max, never positive: gone
    ledger = read_ledger(root / "one" / "run" / "revisions.parquet")
    assert list(ledger["step"]) == [0, 1, 2, 4, 8] and set(df["revision_status"]) <= {"ok"}
    assert (root / "one" / "plots" / "figure6.png").stat().st_size > 1000
    seen = {}
    monkeypatch.setattr(demo, "run_demo", lambda out, cfg, device, work, ranks, progress:
                        seen.update(out=out, cfg=cfg, work=work, progress=progress) or 0)
    assert sweep_main(["--demo", "--demo-max-step", "16", "--out", "o", "--work", "w",
                       "--no-progress"]) == 0
    assert seen == {"out": "o", "cfg": DemoConfig(max_step=16), "work": "w", "progress": False}


def test_demo_default_output_is_untracked(monkeypatch):
    """The README's first command never rewrites committed files: --demo writes under runs/
    (git-ignored); only an explicit `--out results/demo` regenerates the committed copy."""
    import subprocess
    from pathlib import Path

    from pythia_probe import demo
    from pythia_probe.sweep.__main__ import main as sweep_main

    seen = {}
    monkeypatch.setattr(demo, "run_demo", lambda out, cfg, device, work, **kw: seen.update(
        out=out, work=work) or 0)
    assert sweep_main(["--demo"]) == 0
    root = Path(__file__).resolve().parents[1]
    if not (root / ".git").exists():
        pytest.skip("not a git checkout")
    for folder in (seen["out"], seen["work"]):
        probe = f"{folder}/run/manifest.json"
        ignored = subprocess.run(["git", "check-ignore", "-q", probe], cwd=root)
        assert ignored.returncode == 0, f"{probe} would be tracked by git"


def test_demo_under_torchrun_trains_once_and_splits_the_sweep(small_demo):
    """`torchrun --nproc_per_node 2` on the demo: rank 0 trains and computes the statistics
    once, both ranks sweep their share into one table, equal to one process's table."""
    from pythia_probe.results import read_manifest, read_results

    root, proc, code, _ = small_demo
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("trained 8 steps") == 1  # one training, not one per rank
    # the plan before the training (this run trains; the one-process run reuses its work)
    assert 0 <= proc.stdout.index("demo plan: ") < proc.stdout.index("trained 8 steps")
    assert "rank 0:" in proc.stdout and "rank 1:" in proc.stdout
    m = read_manifest(root / "two" / "run")
    assert m["world"] == 2 and m["status"] == "complete"
    assert code == 0
    key = ["step", "analysis", "layer", "head", "metric"]
    a, b = (read_results(root / d / "run").drop(columns="run_id").sort_values(
        key, na_position="first").reset_index(drop=True) for d in ("two", "one"))
    pd.testing.assert_frame_equal(a, b)
