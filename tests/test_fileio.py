"""The one writer and the one delete: atomic, unique temp names, the user's umask, disk-full
errors with the numbers, deletes confined to owned folders; concurrent manifest writes."""

import json
import multiprocessing as mp
import os
import stat

import pandas as pd
import pytest

from pythia_probe import fileio
from pythia_probe.errors import DiskFullError, UnsafeFileError
from pythia_probe.results import make_rows, read_manifest, write_manifest, write_shard


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002])
def test_outputs_follow_the_umask(tmp_path, mask):
    old = os.umask(mask)
    try:
        shard = write_shard(make_rows([{"analysis": "a", "metric": "m", "value": 1.0}],
                                      model="x"), tmp_path / "s.parquet")
        manifest = write_manifest(tmp_path, {"k": 1})
        text = fileio.write_text(tmp_path / "t.txt", "hi")
    finally:
        os.umask(old)
    for p in (shard, manifest, text):
        assert _mode(p) == 0o666 & ~mask, p
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json", "s.parquet", "t.txt"]


def test_disk_full_names_the_file_and_leaves_no_temp_file(tmp_path, monkeypatch):
    def full(tmp):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(fileio, "free_bytes", lambda path: 123)
    with pytest.raises(DiskFullError, match=r"disk full writing .*x\.bin: 123 bytes free .* "
                                            r"needs about 4,096 bytes"):
        fileio.atomic_write(tmp_path / "x.bin", full, 4096)
    assert list(tmp_path.iterdir()) == []


def test_remove_refuses_paths_outside_the_owned_folders(tmp_path):
    owned, victim = tmp_path / "cache", tmp_path / "user.txt"
    owned.mkdir()
    victim.write_text("mine")
    (owned / "link").symlink_to(victim)
    for bad in (victim, owned / ".." / "user.txt", owned):
        with pytest.raises(UnsafeFileError, match="outside the folders this tool owns"):
            fileio.remove(bad, [owned])
    fileio.remove(owned / "link", [owned])  # the link goes, never its target
    assert victim.read_text() == "mine" and not (owned / "link").exists()


def _write_manifests(folder: str, who: int) -> None:
    for i in range(40):
        write_manifest(folder, {"writer": who, "i": i})


def test_two_processes_writing_one_manifest(tmp_path):
    """It used to raise FileNotFoundError (one fixed temp name for every writer)."""
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_write_manifests, args=(str(tmp_path), w)) for w in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    m = read_manifest(tmp_path)
    assert m["config"]["i"] == 39 and m["config"]["writer"] in (0, 1)
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]
    assert json.loads((tmp_path / "manifest.json").read_text())["config"] == m["config"]
    assert isinstance(pd.Timestamp(m["ended"]), pd.Timestamp)


def test_remove_with_a_proof_deletes_only_what_the_tool_wrote(tmp_path):
    """Below a results folder: a file goes only when its bytes prove it is the tool's, a folder
    only when empty, a symlink never (its target untouched)."""
    owned, victim = tmp_path / "out", tmp_path / "user.txt"
    (owned / "full").mkdir(parents=True)
    (owned / "full" / "x").write_text("x")
    (owned / "empty").mkdir()
    victim.write_text("mine")
    (owned / "link.json").symlink_to(victim)
    (owned / "ours.json").write_text("ours")
    (owned / "theirs.json").write_text("theirs")

    def proof(data: bytes) -> bool:
        return data == b"ours"

    gone = {n: fileio.remove(owned / n, [owned], proof) for n in
            ("ours.json", "theirs.json", "link.json", "full", "empty", "missing.json")}
    assert gone == {"ours.json": True, "theirs.json": False, "link.json": False,
                    "full": False, "empty": True, "missing.json": True}
    assert sorted(p.name for p in owned.iterdir()) == ["full", "link.json", "theirs.json"]
    assert victim.read_text() == "mine" and (owned / "full" / "x").read_text() == "x"


def test_check_folders_refuses_a_link_or_a_file_below_the_root_naming_it(tmp_path):
    root, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    (root / "shards").mkdir(parents=True)
    elsewhere.mkdir()
    (root / "claims").symlink_to(elsewhere)
    (root / "failed").write_text("")
    fileio.check_folders(root, [root / "shards" / "model", root / "plots", tmp_path / "x"])
    for bad, why in (("claims", f"a symbolic link to {elsewhere}"), ("failed", "not a folder")):
        with pytest.raises(UnsafeFileError, match=f"{root / bad} is {why}: the tool writes"):
            fileio.check_folders(root, [root / "shards", root / bad / "model"])
    real = os.lstat

    def mounted(path, *a, **k):  # shards on another filesystem
        st = real(path, *a, **k)
        if str(path).endswith("shards"):
            return os.stat_result((st.st_mode, st.st_ino, st.st_dev + 1, *tuple(st)[3:]))
        return st

    import unittest.mock
    with unittest.mock.patch.object(os, "lstat", mounted), \
            pytest.raises(UnsafeFileError, match="on another filesystem"):
        fileio.check_folders(root, [root / "shards"])
