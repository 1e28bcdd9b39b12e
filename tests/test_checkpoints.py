"""hub/checkpoints.py end to end on the loopback hub: resolve, verify, dedupe, evict, faults."""

import threading

import pytest
import torch
from huggingface_hub import constants

from pythia_probe import arch
from pythia_probe.errors import (
    CheckpointError,
    CheckpointNotCachedError,
    HubDownloadError,
    HubUnreachableError,
    StepError,
    UnsafeCheckpointError,
)
from pythia_probe.hub.checkpoints import CheckpointSource, RetryPolicy
from pythia_probe.testing.dist import free_port
from pythia_probe.testing.hub import Fault, HubServer
from pythia_probe.testing.repos import (
    DEFAULT_STEPS,
    build_pythia_like_repo,
    random_state_dict,
    tiny_config,
    write_malicious_bin,
)

REPO = "EleutherAI/pythia-tiny"
FAST = RetryPolicy(attempts=4, base_delay=0.01, max_delay=0.05)


@pytest.fixture(scope="module")
def hub_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    build_pythia_like_repo(root, REPO)
    return root


@pytest.fixture
def hub(hub_root, monkeypatch):
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 4096)  # so a dropped body is resumable
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_PROGRESS_BARS", True)
    with HubServer(hub_root) as server:
        yield server


@pytest.fixture
def src(hub, tmp_path):
    return CheckpointSource(REPO, cache_dir=tmp_path / "cache", endpoint=hub.endpoint, retry=FAST)


def expected(step: int) -> dict:
    sd = random_state_dict(tiny_config(), seed=0 if step == 1 else step)
    return {k: v for k, v in sd.items() if not arch.is_legacy_buffer(k)}


def assert_same(tensors: dict, ref: dict) -> None:
    assert sorted(tensors) == sorted(ref)
    for k in ref:
        assert torch.equal(tensors[k], ref[k]), k


def data_gets(hub, name: str = "") -> list[dict]:
    return [r for r in hub.requests("GET", "/cdn/") if r["path"].endswith(name)]


def test_resolve_reads_commits_sizes_and_hashes_without_downloading(src, hub):
    revs = src.resolve(DEFAULT_STEPS)
    refs = {b.name: b.target_commit for b in src.api.list_repo_refs(REPO).branches}
    assert [r.commit for r in revs] == [refs[f"step{s}"] for s in DEFAULT_STEPS]
    layouts = {r.step: r.layout for r in revs}
    assert layouts == {0: "bin", 1: "bin", 2: "bin", 4: "safetensors", 64: "bin-sharded",
                       128: "safetensors-sharded", 1000: "bin", 2000: "bin"}
    for r in revs:
        assert all(len(f.sha256) == 64 and f.size > 0 for f in r.weight_files)
    assert len(revs[4].weight_files) == 2 and revs[4].index_file is not None
    assert not hub.requests("HEAD") and not data_gets(hub)


def test_unknown_step_names_nearest(src):
    with pytest.raises(StepError, match="nearest available steps: 128, 1000"):
        src.resolve([500])


def test_duplicates_found_from_hashes(src, hub):
    revs = src.resolve(DEFAULT_STEPS)
    assert src.duplicates(revs) == {1: 0}
    manifest = src.manifest(revs)
    assert manifest["duplicates"] == {"1": 0}
    assert manifest["revisions"][0]["commit"] == revs[0].commit
    assert not data_gets(hub)


def test_stream_loads_every_layout_exactly(src, hub):
    revs = src.resolve(DEFAULT_STEPS)
    seen = []
    for rev, tensors, config in src.stream(revs, prefetch=2):
        assert_same(tensors, expected(rev.step))
        assert config["hidden_size"] == 32
        seen.append(rev.step)
    assert seen == list(DEFAULT_STEPS)
    assert src.live_bytes() == 0 and not list((src.storage / "blobs").iterdir())


def test_skip_duplicates_and_views(src):
    revs = src.resolve([0, 1, 2])
    out = [(r.step, t, c) for r, t, c in src.stream(revs, skip_duplicates=True)]
    assert [s for s, _, _ in out] == [0, 2]
    _, t, c = out[0]
    w = arch.NeoXWeights(t, arch.NeoXConfig.from_dict(c))
    assert w.W_E.data_ptr() == t["gpt_neox.embed_in.weight"].data_ptr()


def test_names_load_only_asked_tensors_and_shards(src, hub):
    rev = src.resolve([64])[0]  # two .bin shards
    names = ["gpt_neox.embed_in.weight"]
    [(r, t, _)] = list(src.stream([rev], names=names))
    assert list(t) == names and torch.equal(t[names[0]], expected(64)[names[0]])
    assert len(data_gets(hub, ".bin")) == 1
    with pytest.raises(KeyError, match="no tensors"):
        list(src.stream([rev], names=["nope"]))


def test_eviction_keeps_disk_under_budget(src):
    revs = src.resolve([2, 4, 1000, 2000, 64])
    budget = 2 * max(r.nbytes for r in revs) + 1000
    peak, stop = [0], threading.Event()

    def watch():
        while not stop.wait(0.002):  # sample, yielding the GIL to the prefetch thread
            peak[0] = max(peak[0], src.disk_usage())

    t = threading.Thread(target=watch)
    t.start()
    try:
        for _ in src.stream(revs, prefetch=3, max_disk=budget):
            peak[0] = max(peak[0], src.disk_usage())
    finally:
        stop.set()
        t.join()
    assert 0 < peak[0] <= budget
    assert src.disk_usage() < 1000  # only refs (commit shas) remain
    with pytest.raises(CheckpointError, match="more than max_disk"):
        list(src.stream(revs[:1], max_disk=100))


@pytest.mark.parametrize(
    "fault",
    [
        Fault("drop", match="pytorch_model.bin", after_bytes=20_000),
        Fault("500", match="pytorch_model.bin", times=2),
        Fault("429", match="pytorch_model.bin", retry_after=0),
        Fault("slow", match="pytorch_model.bin", bandwidth=400_000),
        Fault("corrupt", match="pytorch_model.bin"),
        Fault("500", on="api", match="*/tree/*"),
        Fault("500", on="head", match="pytorch_model.bin"),
    ],
    ids=lambda f: f"{f.kind}-{f.on}",
)
def test_recovers_from_each_fault(src, hub, fault):
    hub.add_fault(fault)
    [(rev, tensors, _)] = list(src.stream(src.resolve([2])))
    assert_same(tensors, expected(2))
    assert fault.times == 0  # the fault fired
    gets = data_gets(hub, "pytorch_model.bin")
    if fault.kind == "drop":  # huggingface_hub resumed with a Range request
        assert len(gets) == 2 and gets[1]["range"].startswith("bytes=")
        assert gets[1]["range"] != "bytes=0-"
    if fault.kind == "corrupt":  # detected by sha256, fetched again
        assert len(gets) == 2 and gets[1]["range"] is None


def test_clear_error_when_hub_keeps_failing(src, hub):
    hub.add_fault(Fault("500", match="pytorch_model.bin", times=-1))
    msg = r"pytorch_model.bin at step2.*after 4 attempts"
    with pytest.raises(HubDownloadError, match=msg):
        list(src.stream(src.resolve([2])))
    assert len(data_gets(hub, "pytorch_model.bin")) == 4


def test_offline_from_populated_cache(src, hub, monkeypatch):
    revs = src.resolve([0, 4, 128])
    assert len(list(src.stream(revs, keep=True))) == 3
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    n_requests = len(hub.log)
    off = CheckpointSource(REPO, cache_dir=src.cache_dir, endpoint=hub.endpoint)
    revs_off = off.resolve([0, 4, 128])
    assert [r.commit for r in revs_off] == [r.commit for r in revs]
    for rev, tensors, _ in off.stream(revs_off):
        assert_same(tensors, expected(rev.step))
    msg = "no branch 'step2'.*nearest available steps: 0, 4"
    with pytest.raises(CheckpointNotCachedError, match=msg):
        off.resolve([2])
    assert len(hub.log) == n_requests  # nothing reached the network
    as_dir = CheckpointSource(src.storage)  # a hub-style cache folder as the source
    assert as_dir.model == REPO and as_dir.duplicates(as_dir.resolve([0, 4])) == {}


def test_resolve_cached_needs_no_network(src, hub, tmp_path):
    """What a dry run or a plan uses when the hub cannot be reached: the cache alone."""
    revs = src.resolve([0, 4])
    assert len(list(src.stream(revs, keep=True))) == 2
    dead = f"http://127.0.0.1:{free_port()}"
    off = CheckpointSource(REPO, cache_dir=src.cache_dir, endpoint=dead, retry=FAST)
    with pytest.raises(HubUnreachableError, match="HF_HUB_OFFLINE=1"):
        off.resolve([0])
    n_requests = len(hub.log)
    assert off.cached_steps() == [0, 4]
    cached = off.resolve_cached([0, 4])
    assert [r.commit for r in cached] == [r.commit for r in revs]
    assert [r.weight_files for r in cached] == [r.weight_files for r in revs]  # sizes, sha256
    assert off.duplicates(cached) == {}
    [(rev, tensors, _)] = list(off.stream(cached[:1], keep=True))  # the cached bytes, verified
    assert_same(tensors, expected(0))
    with pytest.raises(CheckpointNotCachedError, match="nearest available steps: 0, 4"):
        off.resolve_cached([2])
    assert len(hub.log) == n_requests  # nothing reached the hub
    assert CheckpointSource(REPO, cache_dir=tmp_path / "empty").cached_steps() == []


def test_hf_endpoint_env_var(hub, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    s = CheckpointSource(REPO, cache_dir=tmp_path / "c", retry=FAST)
    [(rev, tensors, _)] = list(s.stream(s.resolve([4])))
    assert_same(tensors, expected(4))


def test_local_step_folders(hub_root):
    src = CheckpointSource(hub_root / REPO)
    revs = src.resolve([0, 1, 64, 128])
    assert src.duplicates(revs) == {1: 0}
    for rev, tensors, _ in src.stream(revs):
        assert_same(tensors, expected(rev.step))
    assert (hub_root / REPO / "step0" / "pytorch_model.bin").exists()  # never deleted
    with pytest.raises(CheckpointNotCachedError, match="nearest local steps: 4, 64"):
        src.resolve([8])


def test_pickle_with_code_execution_payload_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    step = tmp_path / "model" / "step0"
    step.mkdir(parents=True)
    (step / "config.json").write_text(tiny_config().to_json_string())
    write_malicious_bin(step / "pytorch_model.bin", marker)
    src = CheckpointSource(tmp_path / "model")
    with pytest.raises(UnsafeCheckpointError, match="weights_only=True"):
        list(src.stream(src.resolve([0])))
    assert not marker.exists()


def test_early_exit_evicts_current_and_prefetched(src):
    revs = src.resolve([2, 4, 1000])
    it = src.stream(revs, prefetch=2, names=iter(["gpt_neox.embed_in.weight"]))
    rev, tensors, _ = next(it)
    assert rev.step == 2 and list(tensors) == ["gpt_neox.embed_in.weight"]
    assert src.live_bytes() > 0
    it.close()
    assert src.live_bytes() == 0 and src.disk_usage() < 1000
