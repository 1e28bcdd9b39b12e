"""Issue #19 item 1: the revision ledger, from hub metadata alone (no weight file downloaded),
on loopback hubs whose branches hold what Pythia's do: step1 == step0, a step serving main's
weights (pythia#205), a step serving one shard of main (#206), and two steps sharing a shard."""

import hashlib
import shutil

import pytest

from pythia_probe.__main__ import main as pythia_probe_main
from pythia_probe.errors import CorruptFileError
from pythia_probe.hub import revisions
from pythia_probe.hub.checkpoints import CheckpointSource, RetryPolicy
from pythia_probe.hub.revisions import COLUMNS, Weights, classify, ledger, read_ledger, write_ledger
from pythia_probe.testing.repos import build_pythia_like_repo

SINGLE = "EleutherAI/pythia-ledger"
SHARDED = "EleutherAI/pythia-ledger-sharded"
STEPS = (0, 1, 1000, 2000, 3000)
SHARD = "pytorch_model-{:05d}-of-00002.bin"
FAST = RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.05)


@pytest.fixture(scope="module")
def hub_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    repo = build_pythia_like_repo(root, SINGLE, steps=STEPS, layouts={s: ("bin", 1) for s in STEPS})
    shutil.rmtree(repo / "step2000")
    shutil.copytree(repo / "main", repo / "step2000")  # pythia#205: a step serving main
    sharded = build_pythia_like_repo(root, SHARDED, steps=(0, 1000, 2000, 3000),
                                     layouts={s: ("bin", 2) for s in (0, 1000, 2000, 3000)})
    shutil.copyfile(sharded / "main" / SHARD.format(1), sharded / "step1000" / SHARD.format(1))
    shutil.copyfile(sharded / "step0" / SHARD.format(2), sharded / "step2000" / SHARD.format(2))
    return root


def source(hub, tmp_path, model=SINGLE) -> CheckpointSource:
    return CheckpointSource(model, cache_dir=tmp_path / "cache", endpoint=hub.endpoint, retry=FAST)


def no_file_fetched(hub) -> bool:
    """Refs, tree listings and HEADs only: no byte of a file downloaded."""
    return not [r for r in hub.log if not r["path"].startswith("/api/") and r["method"] != "HEAD"]


def headed(hub) -> list[str]:
    """The commits whose files were asked about with a HEAD, in order."""
    return [r["path"].split("/resolve/")[1].split("/")[0] for r in hub.requests("HEAD")]


def digest_of(folder, names) -> str:
    lines = "".join(f"{n} {hashlib.sha256((folder / n).read_bytes()).hexdigest()}\n"
                    for n in sorted(names))
    return hashlib.sha256(lines.encode()).hexdigest()


def test_step1_is_a_duplicate_and_a_step_serving_main_is_suspect(hub, hub_root, tmp_path):
    df = ledger(source(hub, tmp_path), list(STEPS))
    assert no_file_fetched(hub)  # refs and tree listings, HEADs: no GET of a file
    assert list(df.columns) == list(COLUMNS) and list(df["step"]) == list(STEPS)
    rows = df.set_index("step")
    assert dict(rows["status"]) == {0: "ok", 1: "duplicate", 1000: "ok", 2000: "suspect",
                                    3000: "duplicate"}
    assert rows["same_as"].isna().tolist() == [True, False, True, True, False]
    assert rows.loc[1, "same_as"] == 0 and rows.loc[3000, "same_as"] == 2000
    assert "final model's (main / step3000)" in rows.loc[2000, "reason"]
    assert "pythia#205" in rows.loc[2000, "reason"]
    assert rows.loc[1, "reason"] == "byte-identical to step0 (the same weights_sha256)"
    repo = hub_root / SINGLE
    refs = {b.name: b.target_commit for b in source(hub, tmp_path).api.list_repo_refs(
        SINGLE).branches}
    for step in STEPS:
        assert rows.loc[step, "revision"] == f"step{step}"
        assert rows.loc[step, "commit"] == refs[f"step{step}"]
        assert rows.loc[step, "weights_sha256"] == digest_of(repo / f"step{step}",
                                                            ["pytorch_model.bin"])
    # the listing's verdicts confirmed by one HEAD of each file whose sha256 another shares:
    # step0 = step1, step2000 = step3000 = main; step1000 (unlike every other) is not asked
    want = {refs[f"step{s}"] for s in (0, 1, 2000, 3000)} | {refs["main"]}
    assert sorted(headed(hub)) == sorted(want)


def test_the_final_model_is_listed_even_when_not_asked(hub, tmp_path):
    df = ledger(source(hub, tmp_path), "0,1,2000").set_index("step")
    assert dict(df["status"]) == {0: "ok", 1: "duplicate", 2000: "suspect"}
    assert no_file_fetched(hub)


def test_a_step_serving_one_shard_of_main_and_two_steps_sharing_a_shard(hub, tmp_path):
    df = ledger(source(hub, tmp_path, SHARDED), [0, 1000, 2000, 3000])
    assert no_file_fetched(hub)
    rows = df.set_index("step")
    assert dict(rows["status"]) == {0: "suspect", 1000: "suspect", 2000: "suspect", 3000: "ok"}
    assert rows["same_as"].isna().all()
    assert rows.loc[1000, "reason"].startswith(f"{SHARD.format(1)} is byte-identical to the "
                                               "final model's (main / step3000)")
    assert "pythia#206" in rows.loc[1000, "reason"]
    assert f"{SHARD.format(2)} = step2000's" in rows.loc[0, "reason"]
    assert f"{SHARD.format(2)} = step0's" in rows.loc[2000, "reason"]
    assert rows.loc[3000, "reason"] == "the final step"


def test_local_step_folders_are_hashed_and_agree_with_the_hub(hub, hub_root, tmp_path):
    on_hub = ledger(source(hub, tmp_path), list(STEPS))
    local = ledger(hub_root / SINGLE, list(STEPS))
    assert local["commit"].isna().all()
    for col in ("step", "revision", "weights_sha256", "same_as", "status"):
        assert local[col].tolist() == on_hub[col].tolist(), col


def test_offline_from_a_populated_cache_gives_the_same_ledger(hub, tmp_path, monkeypatch):
    from huggingface_hub import constants

    src = source(hub, tmp_path)
    online = ledger(src, list(STEPS))
    assert len(list(src.stream(src.resolve(list(STEPS)), keep=True))) == len(STEPS)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    n_requests = len(hub.log)
    offline = ledger(source(hub, tmp_path), list(STEPS))
    assert len(hub.log) == n_requests  # the cache alone (main is not cached: step3000 is final)
    assert offline.drop(columns="reason").equals(online.drop(columns="reason"))


def test_the_command_writes_the_ledger_and_prints_the_counts(hub, tmp_path, monkeypatch,
                                                              capsys):
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    monkeypatch.setenv("PYTHIA_PROBE_CACHE", str(tmp_path / "tool"))
    out = tmp_path / "r" / "revisions.parquet"
    assert revisions.main(["--model", SINGLE, "--steps", "0-3000", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "5 steps: 2 ok, 2 duplicate, 1 suspect" in printed
    assert "step2000: suspect: its weights are byte-identical" in printed
    assert read_ledger(out).equals(ledger(source(hub, tmp_path), list(STEPS)))
    assert no_file_fetched(hub)
    argv = ["revisions", "--model", SINGLE, "--steps", "0,1", "--out", str(tmp_path / "b.parquet")]
    assert pythia_probe_main(argv) == 0
    assert "2 steps: 1 ok, 1 duplicate, 0 suspect" in capsys.readouterr().out


@pytest.mark.parametrize("argv,message", [
    (["--steps", "5"], "step 5 is not available for this model; nearest valid steps: 1, 1000"),
    (["--out", "r.csv"], "--out 'r.csv': the ledger is a .parquet file"),
    (["--steps", " "], "--steps is empty"),
])
def test_bad_input_is_one_line_exit_2(hub, tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    base = {"--model": SINGLE, "--out": str(tmp_path / "r.parquet"), "--steps": "all"}
    base.update(dict(zip(argv[::2], argv[1::2], strict=True)))
    assert pythia_probe_main(["revisions", *[x for kv in base.items() for x in kv]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert not (tmp_path / "r.parquet").exists()


def test_rules_on_constructed_tables():
    """The rules alone: suspect wins over duplicate; the final step is never suspect."""
    w = lambda step, **files: Weights(step, f"step{step}", "a" * 40, files)  # noqa: E731
    table = [w(0, a="x"), w(1, a="x"), w(5, a="f"), w(6, a="f"), w(7, a="y"), w(9, a="f")]
    df = classify(table, 9, [Weights(9, "main", "b" * 40, {"m.safetensors": "s", "a": "f"})])
    assert df["status"].tolist() == ["ok", "duplicate", "suspect", "suspect", "ok", "duplicate"]
    assert df["same_as"].tolist()[:4] == [pd_na(), 0, pd_na(), 5]
    assert "byte-identical to step5" in df.loc[3, "reason"] and "(main)" in df.loc[3, "reason"]


def pd_na():
    import pandas as pd

    return pd.NA


def test_a_ledger_of_the_wrong_shape_is_refused(tmp_path):
    df = classify([Weights(0, "step0", None, {"a": "x"})], 0, [])
    path = write_ledger(df, tmp_path / "r.parquet")
    assert read_ledger(path).equals(df)
    with pytest.raises(CorruptFileError, match="statuses"):
        write_ledger(df.assign(status="fine"), tmp_path / "bad.parquet")
    with pytest.raises(CorruptFileError, match="columns"):
        write_ledger(df.drop(columns="reason"), tmp_path / "bad.parquet")
    assert not (tmp_path / "bad.parquet").exists()
