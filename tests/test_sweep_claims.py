"""Scale-out without a scheduler of our own (issue 20 item 4): the output folder's lock shared
by the shards of one run and refused to any other, claim files per (model, step) task (atomic
create, heartbeat, a dead holder's claim taken over), and the share of a process among Slurm
array tasks and ranks."""

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from pythia_probe import fileio
from pythia_probe.cli import run_main
from pythia_probe.errors import BadInputError, FolderLockedError, UnsafeFileError
from pythia_probe.fileio import FolderLock, create_exclusive
from pythia_probe.ranks import Ranks, from_env, slurm_array
from pythia_probe.results import read_manifest, read_results
from pythia_probe.stats import batch_stats
from pythia_probe.sweep import claims as claims_mod
from pythia_probe.sweep.__main__ import main as sweep_main
from pythia_probe.sweep.claims import Claims, one_builder
from pythia_probe.testing.repos import build_pythia_like_repo, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")


# ---- the folder's lock -----------------------------------------------------------------------
def test_one_key_shares_the_lock_another_key_or_none_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(FolderLock, "WAIT", 0.2)
    first = FolderLock(tmp_path, {"what": "shard 0", "run_id": "R1"}, key="run-a").acquire()
    second = FolderLock(tmp_path, {"what": "shard 1", "run_id": "R2"}, key="run-a").acquire()
    assert second.info["run_id"] == "R1"  # the joiner learns the first holder's run id
    for key in ("run-b", None):
        with pytest.raises(FolderLockedError, match="in use by another run .*shard 0"):
            FolderLock(tmp_path, {"what": "other"}, key=key).acquire()
    first.release()
    assert (tmp_path / ".lock").exists()  # still held by the second
    with pytest.raises(FolderLockedError):
        FolderLock(tmp_path, {"what": "other"}, key="run-b").acquire()
    second.release()
    assert not (tmp_path / ".lock").exists()  # the last one removed it
    alone = FolderLock(tmp_path, {"what": "exclusive"}).acquire()
    with pytest.raises(FolderLockedError, match="exclusive"):
        FolderLock(tmp_path, {"what": "x"}, key="run-a").acquire()
    alone.release()


def test_a_different_run_is_refused_while_a_shard_holds_the_folder(tmp_path, monkeypatch):
    """A sweep of other settings into a folder a shard of a run holds: one line, nothing run."""
    repo = build_pythia_like_repo(tmp_path / "hub", "org/tiny", (0, 2), tiny_config(),
                                  {0: ("safetensors", 1), 2: ("safetensors", 1)},
                                  with_main=False)
    stats = batch_stats(torch.randint(0, 90, (20, 9)), 90).save(tmp_path / "s.safetensors")
    out = tmp_path / "o"
    held = FolderLock(out, {"what": "sweep --shard 0/2 (another run)"}, key="another").acquire()
    monkeypatch.setattr(FolderLock, "WAIT", 0.2)
    try:
        with pytest.raises(FolderLockedError, match=r"--shard 0/2 \(another run\)"):
            sweep_main(["--model", str(repo), "--stats", str(stats), "--out", str(out),
                        "--analyses", "embedding", "--no-plots", "--no-progress"])
    finally:
        held.release()
    assert not (out / "shards").exists()


# ---- claims ------------------------------------------------------------------------------------
def test_a_claim_is_created_whole_once_and_released(tmp_path):
    path = tmp_path / "claims" / "step0.json"
    with Claims(tmp_path / "claims", "R") as mine:
        assert mine.take(path)
        seen = json.loads(path.read_text())
        assert seen["pid"] == os.getpid() and seen["run_id"] == "R"
        other = Claims(tmp_path / "claims", "R")
        assert not other.take(path)  # a live holder's claim is left alone
        assert not create_exclusive(path, b"x")  # never overwritten
        mine.release(path)
        assert not path.exists() and other.take(path)
        other.release_all()
    assert list((tmp_path / "claims").iterdir()) == []


def test_the_claim_of_a_dead_process_is_taken_over(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    path = tmp_path / "step4.json"
    host = Claims(tmp_path).me["host"]
    path.write_text(json.dumps({"tool": claims_mod.TOOL, "host": host, "pid": int(dead),
                                "token": "old", "claim": path.name}))
    mine = Claims(tmp_path)
    assert mine.take(path) and json.loads(path.read_text())["token"] == mine.me["token"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step4.json"]  # no tomb left


def test_another_hosts_claim_is_stale_only_when_its_heartbeat_stops(tmp_path, monkeypatch):
    path = tmp_path / "step8.json"
    path.write_text(json.dumps({"tool": claims_mod.TOOL, "host": "node-elsewhere", "pid": 1,
                                "token": "t", "claim": path.name}))
    mine = Claims(tmp_path)
    assert not mine.take(path)  # its heartbeat is fresh: a live machine
    old = time.time() - claims_mod.STALE_AFTER - 5
    os.utime(path, (old, old))
    assert mine.take(path)


def test_the_heartbeat_touches_every_held_claim(tmp_path, monkeypatch):
    """Waited for by the heartbeat's touch itself, not a wall-clock limit (a busy machine may
    delay the heartbeat thread for seconds)."""
    monkeypatch.setattr(claims_mod, "HEARTBEAT", 0.05)
    path = tmp_path / "step16.json"
    touched, real = threading.Event(), claims_mod.touch

    def spy(p):
        real(p)
        if Path(p) == path:
            touched.set()

    monkeypatch.setattr(claims_mod, "touch", spy)
    with Claims(tmp_path) as mine:
        assert mine.take(path)
        os.utime(path, (1.0, 1.0))
        before = time.time()
        touched.clear()  # the next beat touches it again
        assert touched.wait(600), "no heartbeat at all"  # a guard against a hang only
        assert path.stat().st_mtime > before - 1  # touched to "now", not left at 1970
    assert not path.exists()


def test_create_exclusive_honours_the_umask_and_never_follows_a_symlink(tmp_path):
    target = tmp_path / "elsewhere"
    (tmp_path / "link.json").symlink_to(target)
    assert not create_exclusive(tmp_path / "link.json", b"x") and not target.exists()
    old = os.umask(0o077)
    try:
        assert create_exclusive(tmp_path / "c.json", b"{}")
    finally:
        os.umask(old)
    assert (tmp_path / "c.json").stat().st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
    fileio.touch(tmp_path / "missing.json")  # a heartbeat on a released claim is fine


def test_shards_started_together_build_a_shared_file_once(tmp_path, monkeypatch):
    """Three shards finding the statistics missing at once: one builds, the others wait for it
    and then find the file (without the lock each would build it)."""
    monkeypatch.setattr(claims_mod, "POLL", 0.02)
    target, builds = tmp_path / "cache" / "stats.safetensors", []

    def shard(name: str) -> None:
        with one_builder(target, Ranks(), name):
            if not target.exists():
                builds.append(name)
                time.sleep(0.3)
                target.write_bytes(name.encode())

    threads = [threading.Thread(target=shard, args=(f"shard {i}",)) for i in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=30)
    assert len(builds) == 1 and target.read_bytes() == builds[0].encode()
    assert sorted(p.name for p in target.parent.iterdir()) == ["stats.safetensors"]


# ---- shares: --shard, Slurm arrays, ranks ------------------------------------------------------
def test_share_combines_the_shard_or_slurm_array_with_the_ranks():
    assert Ranks().share() == (0, 1)
    assert Ranks(rank=1, world=2).share() == (1, 2)
    assert Ranks(rank=1, world=2, array=3, arrays=4).share() == (7, 8)
    assert Ranks(rank=0, world=2, array=3, arrays=4).share((1, 2)) == (2, 4)  # --shard wins
    shares = [Ranks(rank=r, world=2, array=a, arrays=3).share() for a in range(3)
              for r in range(2)]
    assert sorted(shares) == [(i, 6) for i in range(6)]  # disjoint and complete


@pytest.mark.parametrize("env,want", [
    ({}, (0, 1)),
    ({"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_MIN": "4", "SLURM_ARRAY_TASK_MAX": "7",
      "SLURM_ARRAY_TASK_COUNT": "4"}, (1, 4)),
    ({"SLURM_ARRAY_TASK_ID": "6", "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_MAX": "8",
      "SLURM_ARRAY_TASK_STEP": "2", "SLURM_ARRAY_TASK_COUNT": "5"}, (3, 5)),
])
def test_slurm_array_task_place(env, want, monkeypatch):
    for var in ("ID", "MIN", "MAX", "STEP", "COUNT"):
        monkeypatch.delenv(f"SLURM_ARRAY_TASK_{var}", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert slurm_array() == want
    assert (from_env().array, from_env().arrays) == want


def test_an_irregular_slurm_array_is_refused_naming_the_way_out(monkeypatch):
    for k, v in {"SLURM_ARRAY_TASK_ID": "4", "SLURM_ARRAY_TASK_MIN": "1",
                 "SLURM_ARRAY_TASK_MAX": "5", "SLURM_ARRAY_TASK_COUNT": "3"}.items():
        monkeypatch.setenv(k, v)  # --array=1,4,5
    with pytest.raises(BadInputError, match="--shard INDEX/COUNT"):
        slurm_array()


@pytest.mark.parametrize("bad", ["2/2", "1", "a/b", "-1/3"])
def test_a_bad_shard_is_one_line(bad):
    with pytest.raises(BadInputError, match="INDEX/COUNT"):
        sweep_main([f"--shard={bad}", "--model", "org/x", "--dry-run"])


@pytest.mark.parametrize("env,var", [
    ({"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_COUNT": "2"}, "0..1 step 1 (2 tasks"),
    ({"SLURM_ARRAY_TASK_ID": "-1", "SLURM_ARRAY_TASK_COUNT": "2"}, "0..1 step 1 (2 tasks"),
    ({"SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_MAX": "2",
      "SLURM_ARRAY_TASK_COUNT": "2"}, "1..2 step 1 (2 tasks"),
])
def test_a_slurm_task_id_outside_its_array_is_one_line(env, var, monkeypatch, capsys, tmp_path):
    """It used to score nothing with exit 0 (id 5 of 2), or "share -1 of 2"."""
    for name in ("ID", "MIN", "MAX", "STEP", "COUNT"):
        monkeypatch.delenv(f"SLURM_ARRAY_TASK_{name}", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("PYTHIA_PROBE_TRACEBACK", raising=False)
    argv = ["--model", "org/x", "--out", str(tmp_path / "o"), "--dry-run"]
    assert run_main(lambda: sweep_main(argv), "sweep") == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sweep: error: ")
    assert f"SLURM_ARRAY_TASK_ID={env['SLURM_ARRAY_TASK_ID']} is not an id of its array" \
        in lines[0] and var in lines[0] and "--shard INDEX/COUNT" in lines[0]
    assert not (tmp_path / "o").exists()


# ---- claims in a real sweep: unreadable ones, two workers on one share -------------------------
STEPS = (0, 2, 4, 8, 16, 32, 64, 128)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A local model of 8 distinct steps, statistics, and the table of one clean run."""
    root = tmp_path_factory.mktemp("claims")
    repo = build_pythia_like_repo(root / "hub", "org/tiny", STEPS, tiny_config(),
                                  {s: ("safetensors", 1) for s in STEPS}, with_main=False)
    stats = batch_stats(torch.randint(0, 90, (20, 9), generator=torch.Generator()
                                      .manual_seed(1)), 90).save(root / "s.safetensors")
    assert sweep_main(_argv(repo, stats, root / "clean")) == 0
    return repo, stats, _table(read_results(root / "clean"))


def _argv(repo, stats, out, *extra):
    return ["--model", str(repo), "--stats", str(stats), "--out", str(out), "--steps", "all",
            "--analyses", "embedding", "--no-plots", "--no-progress", *extra]


def _table(df):
    return df.drop(columns="run_id").sort_values(["step", "layer", "metric"]).reset_index(
        drop=True)


def _plant(path, kind: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "folder":
        path.mkdir()
        (path / "notes.txt").write_text("a user's file")
    else:
        path.write_bytes(kind.encode())


UNREADABLE = {0: ("\x00garbage", "not JSON"), 2: ("", "empty"),
              4: ("[1, 2]", "a JSON list, not a claim of this tool"), 8: ("folder", "a folder"),
              16: ('{"step": 16}', "a JSON dict, not a claim of this tool")}  # a user's JSON


def _contents(folder) -> list:
    """(kind, bytes) of every entry below ``folder``, names aside (a set-aside file is
    renamed)."""
    return sorted(("dir", b"") if p.is_dir() else ("file", p.read_bytes())
                  for p in folder.rglob("*"))


def test_old_unreadable_claims_are_taken_over_by_age_and_kept(tiny, tmp_path, capfd):
    """Garbage, empty, a JSON list, a folder and a user's JSON where claims go, untouched for a
    day: each taken over like a dead holder's claim (the table equals a clean run's), and
    none deleted: the tool cannot prove it wrote them, so each is kept beside, named. Below
    OUT/failed/ likewise: the record the tool wrote for step 4 goes once step 4 is scored, a
    user's step2.json there stays, byte for byte."""
    repo, stats, want = tiny
    out = tmp_path / "o"
    (out / "failed").mkdir(parents=True)
    (out / "failed" / "step4.json").write_text(json.dumps(
        {"model": want["model"].iloc[0], "step": 4, "error": "HubError: x", "rank": 0,
         "tries": 1, "traceback": "..."}))
    (out / "failed" / "step2.json").write_text('{"step": 2, "note": "mine"}')
    for step, (kind, _) in UNREADABLE.items():
        _plant(out / "claims" / f"step{step}.json", kind)
        old = time.time() - 86400
        os.utime(out / "claims" / f"step{step}.json", (old, old))
    before = _contents(out / "claims")
    assert sweep_main(_argv(repo, stats, out)) == 0
    pd.testing.assert_frame_equal(_table(read_results(out)), want)
    assert _contents(out / "claims") == before  # every planted byte still there
    assert [p.name for p in (out / "failed").iterdir()] == ["step2.json"]
    assert (out / "failed" / "step2.json").read_text() == '{"step": 2, "note": "mine"}'
    assert read_manifest(out)["status"] == "complete"  # the user's file is no failure
    kept = [m for m in capfd.readouterr().err.splitlines() if "cannot prove it wrote it" in m]
    assert len(kept) == len(UNREADABLE)
    for step, (_, why) in UNREADABLE.items():
        assert not (out / "claims" / f"step{step}.json").exists()
        assert any(f"claims/step{step}.json, untouched for over 120 s ({why})" in m
                   for m in kept)


@pytest.mark.parametrize("kind,why", [("[1]", "a JSON list, not a claim of this tool"),
                                      ("folder", "a folder")])
def test_a_fresh_unreadable_claim_is_named_as_such_and_left(tiny, tmp_path, kind, why, capfd):
    """A claim file that cannot be read, touched just now: named as such (it used to read
    "pid ? on ?"), its step left to it; every other step scored."""
    repo, stats, want = tiny
    out = tmp_path / "o"
    _plant(out / "claims" / "step4.json", kind)
    assert sweep_main(_argv(repo, stats, out)) == 0
    printed = capfd.readouterr()
    said = [m for m in printed.err.splitlines() if "step 4 is claimed by" in m]
    assert len(said) == 1 and "pid ?" not in said[0]
    assert f"a claim file that cannot be read, {out / 'claims' / 'step4.json'} ({why})" \
        in said[0]
    assert "1 being scored elsewhere" in printed.out
    got = _table(read_results(out))
    pd.testing.assert_frame_equal(got, want[want["step"] != 4].reset_index(drop=True))


def test_two_workers_on_one_share_never_score_a_task_twice(tiny, tmp_path, monkeypatch,
                                                          capsys):
    """Worker B looks at the folder (nothing done) and stops there; worker A scores the whole
    share 0/2 and releases its claims; B then claims each task, finds its shard and scores
    nothing (it used to score them again: 11 tasks scored for 8). Two workers of one process
    (threads: each its own claims, the folder's lock shared as by two processes)."""
    from pythia_probe.sweep import execute, tasks

    repo, stats, want = tiny
    out, scored, looked, go = tmp_path / "o", [], threading.Event(), threading.Event()
    real_step, real_claim = execute.run_step, tasks._claim_and_copy

    def step(loaded, s, *a):
        scored.append((threading.current_thread().name, s))
        return real_step(loaded, s, *a)

    def claim(*a):
        if threading.current_thread().name == "B":
            looked.set()
            assert go.wait(120)
        return real_claim(*a)

    monkeypatch.setattr(execute, "run_step", step)
    monkeypatch.setattr(tasks, "_claim_and_copy", claim)
    rc = {}
    b = threading.Thread(target=lambda: rc.update(
        B=sweep_main(_argv(repo, stats, out, "--shard", "0/2"))), name="B")
    b.start()
    assert looked.wait(120)
    assert sweep_main(_argv(repo, stats, out, "--shard", "0/2")) == 0  # worker A
    go.set()
    b.join(120)
    assert rc == {"B": 0}
    share = sorted(STEPS[0::2])
    assert sorted(s for _, s in scored) == share and {w for w, _ in scored} == {"MainThread"}
    assert "0 steps done, 4 already done" in capsys.readouterr().out  # B's count
    pd.testing.assert_frame_equal(_table(read_results(out)),
                                  want[want["step"].isin(share)].reset_index(drop=True))


# ---- no write or delete through a link below --out (issue 29) ----------------------------------
def _tree(root) -> dict:
    """Every entry below ``root`` (links not followed): its kind and bytes or link target."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(dirpath) / name
            out[str(p.relative_to(root))] = (
                ("link", os.readlink(p)) if p.is_symlink() else ("dir", None) if p.is_dir()
                else ("file", p.read_bytes(), p.stat().st_mtime_ns))
    return out


@pytest.mark.parametrize("links,plots", [(("claims", "failed"), False), (("shards",), False),
                                         (("plots/tiny",), True)])
def test_a_folder_below_out_that_is_a_link_is_refused_before_anything_is_written(
        tiny, tmp_path, capsys, monkeypatch, links, plots):
    """OUT/claims and OUT/failed linked to a user's folders (the issue's case: a sweep deleted
    the user's day-old step0.json as a stale claim, overwrote step2.json, wrote records
    outside --out): one line naming the link, exit 2, nothing below the user's folders or
    --out changed."""
    repo, stats, _ = tiny
    user, out = tmp_path / "user", tmp_path / "o"
    for name in links:
        mine = user / name.replace("/", "-")
        mine.mkdir(parents=True)
        (mine / "step0.json").write_text('{"note": "a day old, mine"}')
        (mine / "step2.json").write_text('{"note": "mine too"}')
        old = time.time() - 86400
        os.utime(mine / "step0.json", (old, old))
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).symlink_to(mine, target_is_directory=True)
    before = _tree(tmp_path)
    monkeypatch.delenv("PYTHIA_PROBE_TRACEBACK", raising=False)
    argv = _argv(repo, stats, out)
    argv = [a for a in argv if a != "--no-plots"] if plots else argv
    assert run_main(lambda: sweep_main(argv), "sweep") == 2
    lines = [m for m in capsys.readouterr().err.splitlines() if m.startswith("sweep: error: ")]
    assert len(lines) == 1
    assert f"{out / links[-1]} is a symbolic link to {user}" in lines[0] or \
        f"{out / links[0]} is a symbolic link to {user}" in lines[0]
    assert "real folders inside" in lines[0]
    assert _tree(tmp_path) == before  # nothing written, moved or deleted anywhere


def test_the_demo_refuses_a_link_below_its_out_before_training(tmp_path):
    from pythia_probe.demo import run_demo

    (tmp_path / "user").mkdir()
    (tmp_path / "user" / "step0").mkdir()
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "work").symlink_to(tmp_path / "user", target_is_directory=True)
    before = _tree(tmp_path)
    with pytest.raises(UnsafeFileError, match=f"{tmp_path / 'd' / 'work'} is a symbolic link"):
        run_demo(tmp_path / "d", progress=False)
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("folder", ["rows", "data", "checkpoints"])
def test_the_toy_trainer_refuses_a_link_below_its_out_before_training(tmp_path, folder):
    from pythia_probe.toy.train import main as toy_main

    (tmp_path / "user").mkdir()
    (tmp_path / "user" / "step00000001.parquet").write_bytes(b"mine")
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / folder).symlink_to(tmp_path / "user", target_is_directory=True)
    before = _tree(tmp_path)
    with pytest.raises(UnsafeFileError, match=f"{tmp_path / 'o' / folder} is a symbolic link"):
        toy_main(["--out", str(tmp_path / "o")])
    assert _tree(tmp_path) == before


def test_toy_checkpoints_are_never_written_or_pruned_through_a_link(tmp_path):
    """save_checkpoint deletes the older checkpoints beside the new one: a linked
    OUT/checkpoints would delete a user's step*.safetensors there."""
    from pythia_probe.toy.resume import save_checkpoint

    (tmp_path / "user").mkdir()
    (tmp_path / "user" / "step00000001.safetensors").write_bytes(b"mine")
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "checkpoints").symlink_to(tmp_path / "user", target_is_directory=True)
    before = _tree(tmp_path)
    with pytest.raises(UnsafeFileError, match="checkpoints is a symbolic link"):
        save_checkpoint(tmp_path / "o", {"w": torch.ones(2)}, 2)
    assert _tree(tmp_path) == before
    (tmp_path / "o" / "checkpoints").unlink()
    save_checkpoint(tmp_path / "o", {"w": torch.ones(2)}, 1)
    save_checkpoint(tmp_path / "o", {"w": torch.ones(2)}, 2)  # prunes step 1: its own
    assert [p.name for p in (tmp_path / "o" / "checkpoints").iterdir()] == [
        "step00000002.safetensors"]
