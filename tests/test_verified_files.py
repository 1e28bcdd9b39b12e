"""Issue #10, item 3: every file is checked against the hub's hash before use (weights, config,
index, tokenizer; in the cache or freshly downloaded), bad bytes are fetched once more and then
named in one line, and every snapshot layout huggingface_hub writes is read correctly."""


import pytest
import torch
from huggingface_hub import constants

from pythia_probe import arch
from pythia_probe.errors import ChecksumError, CorruptFileError, UserError
from pythia_probe.hub.checkpoints import CheckpointSource, RetryPolicy
from pythia_probe.sweep import source as sources
from pythia_probe.testing.caches import hf_populate, plain_copy, tree_snapshot
from pythia_probe.testing.hub import Fault
from pythia_probe.testing.repos import build_pythia_like_repo, random_state_dict, tiny_config
from pythia_probe.tokenizer import build_word_tokenizer

REPO = "EleutherAI/pythia-tiny"
STEPS = (0, 1, 2, 4, 64)
FAST = RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.05)
INDEX = "pytorch_model.bin.index.json"

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def hub_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    repo = build_pythia_like_repo(root, REPO, steps=STEPS, with_main=False)
    build_word_tokenizer(["the cat sat on the mat"] * 3, 50).save_pretrained(str(repo / "step2"))
    return root


def source(hub, cache, **kw) -> CheckpointSource:
    return CheckpointSource(REPO, cache_dir=cache, endpoint=hub.endpoint, retry=FAST, **kw)


def assert_exact(tensors: dict, step: int) -> None:
    ref = random_state_dict(tiny_config(), seed=0 if step == 1 else step)
    ref = {k: v for k, v in ref.items() if not arch.is_legacy_buffer(k)}
    assert sorted(tensors) == sorted(ref)
    assert all(torch.equal(tensors[k], ref[k]) for k in ref)


def gets(hub, name: str) -> list:
    return [r for r in hub.requests("GET") if r["path"].endswith("/" + name)]


def use(src, name: str):
    """Read ``name`` the way the sweep does: config and index while planning, the tokenizer
    for the fingerprint check, weights while streaming."""
    if name == "config.json":
        return sources.model_config(src, src.resolve([2])[0])
    if name == "tokenizer.json":
        return sources.model_tokenizer(src, src.resolve([2])[0], None, REPO)
    if name == INDEX:
        return src.read_json(src.resolve([64])[0], INDEX)
    [(rev, tensors, _)] = list(src.stream(src.resolve([2])))
    assert_exact(tensors, 2)
    return tensors


FILES = ["config.json", "tokenizer.json", INDEX, "pytorch_model.bin"]


def flip(path, at: int = 100) -> None:
    data = bytearray(path.read_bytes())
    data[min(at, len(data) - 1)] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("name", FILES)
def test_bad_bytes_from_the_hub_once_are_fetched_again(hub, tmp_path, name):
    hub.add_fault(Fault("corrupt", match=name))
    assert use(source(hub, tmp_path / "cache"), name)
    assert len(gets(hub, name)) == 2  # the sha256 / git blob id caught it; fetched again


@pytest.mark.parametrize("name", FILES)
def test_bad_bytes_from_the_hub_every_time_are_one_error_naming_the_file(hub, tmp_path, name):
    hub.add_fault(Fault("corrupt", match=name, times=-1))
    src = source(hub, tmp_path / "cache")
    with pytest.raises(ChecksumError, match=name.replace(".", r"\.") + " of ") as err:
        use(src, name)
    assert isinstance(err.value, CorruptFileError) and isinstance(err.value, UserError)
    assert "\n" not in str(err.value)
    assert len(gets(hub, name)) == 2  # fetched once more, then reported
    leftover = [p.name for p in src.storage.glob("blobs/*")]
    assert not [p for p in leftover if p.endswith(".partial")]  # the cache is left clean
    assert name != "config.json" or leftover == []


@pytest.mark.parametrize("name", ["config.json", "pytorch_model.bin"])
def test_bad_bytes_in_the_tools_cache_are_replaced(hub, tmp_path, name):
    """The bug: one corrupt cached config.json made every later run fail with a
    UnicodeDecodeError naming no file, even against a healthy hub."""
    cache = tmp_path / "cache"
    src = source(hub, cache)
    [rev] = src.resolve([2])
    list(src.stream([rev], keep=True))
    blob = src.storage / "blobs" / rev.file(name).etag
    if name == "config.json":
        blob.write_bytes(b"\xff\xfe" + blob.read_bytes()[2:])  # same size, not UTF-8
    else:
        flip(blob, 5000)
    before = len(gets(hub, name))
    assert use(source(hub, cache), name)  # a later run
    assert len(gets(hub, name)) == before + 1


def test_a_bad_copy_the_tool_did_not_create_is_named_and_left(hub, tmp_path):
    cache = tmp_path / "hf-cache"
    hf_populate(cache, REPO, ["step2"], hub.endpoint)
    src = source(hub, cache)
    [rev] = src.resolve([2])
    blob = src.storage / "blobs" / rev.file("pytorch_model.bin").sha256
    flip(blob)
    before = tree_snapshot(cache / src.storage.name)
    with pytest.raises(ChecksumError, match=r"pytorch_model\.bin of .*left in place"):
        list(src.stream([rev]))
    assert tree_snapshot(cache / src.storage.name) == before


def test_offline_bad_copy_is_reported_and_the_tools_copy_deleted(hub, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    src = source(hub, cache)
    [rev] = src.resolve([2])
    list(src.stream([rev], keep=True))
    blob = src.storage / "blobs" / rev.file("pytorch_model.bin").sha256
    flip(blob)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    off = source(hub, cache)
    with pytest.raises(ChecksumError, match="deleted it, run online to fetch it again"):
        list(off.stream(off.resolve([2])))
    assert not blob.exists()


@pytest.mark.parametrize("how", ["hf-plain-files", "copy-resolving-symlinks"])
def test_plain_file_snapshots_are_read_correctly(hub, tmp_path, how):
    """The bug: with plain files, file names were taken as blob hashes: every checkpoint was
    a duplicate of step 0, and config.json was deleted as "bytes do not match"."""
    cache = tmp_path / "hf"
    hf_populate(cache, REPO, [f"step{s}" for s in STEPS], hub.endpoint,
                symlinks=how != "hf-plain-files")
    storage = cache / f"models--{REPO.replace('/', '--')}"
    if how == "copy-resolving-symlinks":
        storage = plain_copy(storage, tmp_path / "copy")
    assert not [p for p in storage.rglob("*") if p.is_symlink()]
    before = tree_snapshot(storage)
    src = CheckpointSource(storage)  # a hub-style cache folder as the source (offline)
    revs = src.resolve(STEPS)
    assert src.duplicates(revs) == {1: 0}
    for rev, tensors, config in src.stream(revs):
        assert_exact(tensors, rev.step)
        assert config["hidden_size"] == 32
    assert tree_snapshot(storage) == before  # nothing deleted or rewritten


def test_the_tool_writes_plain_files_where_symlinks_are_off(hub, tmp_path, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_SYMLINKS", True)
    cache = tmp_path / "cache"
    src = source(hub, cache)
    revs = src.resolve([0, 1, 2])
    assert len(list(src.stream(revs, keep=True))) == 3
    snaps = list(src.storage.glob("snapshots/*/*"))
    assert snaps and not [p for p in snaps if p.is_symlink()]
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    off = source(hub, cache)
    off_revs = off.resolve([0, 1, 2])
    assert off.duplicates(off_revs) == {1: 0}
    assert [r.step for r, _, _ in off.stream(off_revs)] == [0, 1, 2]
    flip(off.storage / "snapshots" / revs[2].commit / "pytorch_model.bin")
    with pytest.raises(ChecksumError, match="step2"):  # the saved listing still verifies
        list(off.stream(off.resolve([2])))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    again = source(hub, cache)
    for rev, tensors, _ in again.stream(again.resolve([0, 2])):
        assert_exact(tensors, rev.step)
    for rev in (revs[0], revs[2]):  # evicted: the tool's own files (step1 was not asked)
        assert not (again.storage / "snapshots" / rev.commit).exists()
    assert (again.storage / "snapshots" / revs[1].commit / "pytorch_model.bin").is_file()
