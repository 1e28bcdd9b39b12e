"""Issue #10, items 1 and 2: the loader never deletes or overwrites what it did not create, and
no name from the hub becomes a path before it is validated (the loopback hub lies on purpose).
"""

import threading

import pytest
import torch
from huggingface_hub import constants, scan_cache_dir

from pythia_probe import arch
from pythia_probe.errors import UnsafeFileError, UserError
from pythia_probe.fileio import remove
from pythia_probe.hub import io as hubio
from pythia_probe.hub.cache import HubCache
from pythia_probe.hub.checkpoints import CheckpointSource, RetryPolicy
from pythia_probe.hub.weights import FileInfo
from pythia_probe.testing.caches import hf_populate, tree_snapshot
from pythia_probe.testing.repos import build_pythia_like_repo, random_state_dict, tiny_config

REPO = "EleutherAI/pythia-tiny"
STEPS = (0, 1, 2, 4, 64)
FAST = RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.05)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def hub_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    build_pythia_like_repo(root, REPO, steps=STEPS, with_main=False)
    return root


def source(hub, cache, **kw) -> CheckpointSource:
    return CheckpointSource(REPO, cache_dir=cache, endpoint=hub.endpoint, retry=FAST, **kw)


def expected(step: int) -> dict:
    sd = random_state_dict(tiny_config(), seed=0 if step == 1 else step)
    return {k: v for k, v in sd.items() if not arch.is_legacy_buffer(k)}


def assert_exact(tensors: dict, step: int) -> None:
    ref = expected(step)
    assert sorted(tensors) == sorted(ref)
    assert all(torch.equal(tensors[k], ref[k]) for k in ref)


def blobs(cache) -> list:
    return sorted(p.name for p in cache.glob("models--*/blobs/*"))


# ---- item 1: what the user had survives ----------------------------------------------------------
def test_default_cache_is_the_tools_own_not_the_hf_cache(hub, monkeypatch, tmp_path):
    monkeypatch.setenv("PYTHIA_PROBE_CACHE", str(tmp_path / "tool"))
    src = CheckpointSource(REPO, endpoint=hub.endpoint, retry=FAST)
    assert src.cache_dir == tmp_path / "tool" / "checkpoints"
    hf_cache = constants.HF_HUB_CACHE
    assert not str(src.cache_dir).startswith(hf_cache)
    monkeypatch.delenv("PYTHIA_PROBE_CACHE")
    default = CheckpointSource(REPO, endpoint=hub.endpoint)
    assert default.cache_dir == hubio.tool_cache("checkpoints")
    assert not str(default.cache_dir).startswith(hf_cache)


@pytest.mark.parametrize("symlinks", [True, False], ids=["symlinked", "plain-files"])
def test_users_snapshots_survive_a_stream_with_eviction(hub, tmp_path, symlinks):
    """The user cached step0 and step2 with hf_hub_download before the run (the bug: eviction
    deleted them). The run reads them (verified), downloads the rest, evicts only its own."""
    cache = tmp_path / "hf-cache"
    hf_populate(cache, REPO, ["step0", "step2"], hub.endpoint, symlinks=symlinks)
    storage = cache / f"models--{REPO.replace('/', '--')}"
    before = tree_snapshot(storage)
    src = source(hub, cache)
    for rev, tensors, _ in src.stream(src.resolve([0, 2, 4, 64]), prefetch=1):
        assert_exact(tensors, rev.step)
    after = tree_snapshot(storage)
    assert {k: after.get(k) for k in before} == before  # every file of the user's, unchanged
    assert set(after) - set(before) == set()  # and nothing of ours left behind
    info = scan_cache_dir(cache)
    assert not info.warnings  # refs and snapshots still consistent for huggingface_hub
    [repo] = info.repos
    assert {r for rev in repo.revisions for r in rev.refs} == {"step0", "step2"}
    weight_gets = [r["path"] for r in hub.requests("GET", "/cdn/")]
    assert len(weight_gets) == 2 + 3  # populate: step0 + step2; the run: step4, step64 (2 shards)


def test_two_sources_share_a_cache_without_deleting_each_others_files(hub, tmp_path):
    """Concurrent runs on one cache: each evicts only what no other live source uses."""
    cache = tmp_path / "cache"
    results, errors = {}, []

    def run(name: str, steps) -> None:
        try:
            src = source(hub, cache)
            results[name] = [(r.step, t) for r, t, _ in src.stream(src.resolve(steps))]
        except Exception as err:  # noqa: BLE001 - reported by the assertion below
            errors.append(err)

    threads = [threading.Thread(target=run, args=(n, s))
               for n, s in (("a", [0, 2, 4]), ("b", [2, 4, 0]), ("c", [4, 0, 2]))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for got in results.values():
        for step, tensors in got:
            assert_exact(tensors, step)
    assert blobs(cache) == []  # the last user of each blob deleted it
    leases = cache / ".locks" / "pythia_probe" / f"models--{REPO.replace('/', '--')}" / "leases"
    assert not [p for p in leases.rglob("*") if p.is_file()]


def test_a_release_never_removes_the_snapshot_folder_another_source_is_linking_into(
        tmp_path, monkeypatch):
    """The CI failure of session 8 (FileNotFoundError, 1 in ~50 runs): source B made the
    snapshot folder, source A found it empty and removed it, B's symlink had nowhere to go.
    Here B is paused between the two and A's release runs meanwhile: it must wait for B."""
    a, b = HubCache(tmp_path, REPO), HubCache(tmp_path, REPO)
    commit, f = "c" * 40, FileInfo("model.safetensors", 3, "a" * 64, None)
    made, go, errors = threading.Event(), threading.Event(), []
    real = HubCache._snapshot_dir

    def paused(self, c):
        real(self, c)
        if self is b:
            made.set()
            go.wait(5)

    monkeypatch.setattr(HubCache, "_snapshot_dir", paused)

    def link():
        try:
            b.link(commit, f, b.put_blob(f.etag, part))
        except Exception as err:  # noqa: BLE001 - reported by the assertion below
            errors.append(err)

    part = hubio.partial_path(b.blob(f.etag))
    part.parent.mkdir(parents=True)
    part.write_bytes(b"abc")
    t = threading.Thread(target=link)
    t.start()
    assert made.wait(5), errors
    releaser = threading.Thread(target=a.release, args=(commit, "step0", [], lambda _: False))
    releaser.start()
    releaser.join(0.3)  # without the snapshot lock it has removed the folder by now
    go.set()
    t.join(5)
    releaser.join(5)
    assert not errors, errors
    assert b.pointer(commit, f.path).is_symlink()
    assert b.pointer(commit, f.path).read_bytes() == b"abc"


def test_keep_then_offline_reads_the_tools_files_and_later_runs_may_evict_them(hub, tmp_path,
                                                                             monkeypatch):
    cache = tmp_path / "cache"
    src = source(hub, cache)
    assert len(list(src.stream(src.resolve([0, 4]), keep=True))) == 2
    assert len(blobs(cache)) >= 2
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    off = source(hub, cache)
    assert [r.step for r, _, _ in off.stream(off.resolve([0, 4]))] == [0, 4]
    assert len(blobs(cache)) >= 2  # offline reads never delete
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    again = source(hub, cache)
    list(again.stream(again.resolve([0, 4])))
    assert blobs(cache) == []  # the tool's own files (ledger) are evicted by a later run


# ---- item 2: names from the hub are validated before they touch the disk -------------------------
def victims(tmp_path):
    """A file and a folder next to the cache that a path-shaped name would point at."""
    (tmp_path / "victim").write_text("precious")
    (tmp_path / "victimdir").mkdir()
    (tmp_path / "victimdir" / "data").write_text("precious too")
    return tree_snapshot(tmp_path)


def outside(tmp_path) -> dict:
    return {k: v for k, v in tree_snapshot(tmp_path).items() if not k.startswith("cache")}


@pytest.mark.parametrize("field,value,match,message", [
    ("sha256", "../../../victim", "pytorch_model.bin", "not a sha256"),
    ("sha256", "ABSOLUTE", "pytorch_model.bin", "not a sha256"),
    ("sha256", "../../../victimdir" + "0" * 46, "pytorch_model.bin", "not a sha256"),
    ("oid", "../../../victim", "config.json", "not a git object id"),
    ("oid", "../../../victimdir", "pytorch_model.bin", "not a git object id"),
    ("commit", "../../../victimdir", "*", "not a git object id"),
    ("commit", "0" * 39 + "/", "*", "not a git object id"),
    ("path", "../victim", "config.json", "not a plain file name"),
    ("path", "sub/../../victim", "pytorch_model.bin", "not a plain file name"),
    ("path", "/abs/victim", "pytorch_model.bin", "not a plain file name"),
], ids=lambda v: str(v)[:18])
def test_path_shaped_names_are_refused_and_nothing_outside_is_touched(hub, tmp_path, field, value,
                                                                      match, message):
    before = {k: v for k, v in victims(tmp_path).items()}
    value = str(tmp_path / "victim") if value == "ABSOLUTE" else value
    hub.tamper(field, value, match)
    src = source(hub, tmp_path / "cache")
    with pytest.raises(UnsafeFileError, match=message) as err:
        list(src.stream(src.resolve([2])))
    assert isinstance(err.value, UserError) and "\n" not in str(err.value)
    assert outside(tmp_path) == {k: v for k, v in before.items() if not k.startswith("cache")}
    assert not hub.requests("GET", "/cdn/")  # refused before any byte was fetched


@pytest.mark.parametrize("field,value", [("etag", "../../../victim"),
                                         ("repo-commit", "../../../victimdir")])
def test_lying_headers_are_never_used_as_names(hub, tmp_path, field, value):
    """hf_hub_download would name the blob after ETag (and .no_exist after X-Repo-Commit);
    the loader names files after the validated tree listing only."""
    before = victims(tmp_path)
    hub.tamper(field, value)
    src = source(hub, tmp_path / "cache")
    [(rev, tensors, _)] = list(src.stream(src.resolve([2])))
    assert_exact(tensors, 2)
    assert outside(tmp_path) == before


def test_a_planted_symlink_in_the_cache_is_never_followed_by_eviction(hub, tmp_path):
    before = victims(tmp_path)
    cache = tmp_path / "cache"
    src = source(hub, cache)
    [rev] = src.resolve([2])
    snap = src.storage / "snapshots" / rev.commit
    snap.mkdir(parents=True)
    (snap / "evil").symlink_to(tmp_path / "victimdir")  # not the tool's: never removed
    list(src.stream([rev]))
    assert (snap / "evil").is_symlink() and outside(tmp_path) == before
    with pytest.raises(UnsafeFileError, match="outside the folders this tool owns"):
        remove(snap / "evil" / "data", [src.storage])  # the one delete function refuses it
    assert (tmp_path / "victimdir" / "data").read_text() == "precious too"


def test_a_tampered_saved_listing_is_ignored(hub, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    src = source(hub, cache)
    [rev] = src.resolve([2])
    list(src.stream([rev], keep=True))
    tree = src.cache.state / "trees" / f"{rev.commit}.json"
    tree.write_text(tree.read_text().replace(rev.file("config.json").git_oid, "../../x"))
    assert src.cache.load_tree(rev.commit) == {}  # invalid names: the listing is not trusted
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    off = source(hub, cache)
    [(_, tensors, _)] = list(off.stream(off.resolve([2])))  # blob names still verify the bytes
    assert_exact(tensors, 2)
