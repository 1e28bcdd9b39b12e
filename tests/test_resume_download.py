"""Weight downloads resume across processes: a killed fetch continues from the bytes on disk."""

import os
import subprocess
import sys
import time

import pytest
import torch
from huggingface_hub import constants

from pythia_probe import arch
from pythia_probe.hub.checkpoints import CheckpointSource, RetryPolicy
from pythia_probe.hub.weights import partial_path, sha256_file
from pythia_probe.testing.hub import Fault, HubServer
from pythia_probe.testing.repos import build_pythia_like_repo, random_state_dict, tiny_config

REPO = "EleutherAI/pythia-tiny"
FAST = RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.05)
WEIGHTS = "pytorch_model.bin"

CHILD = """
import sys
from huggingface_hub import constants
constants.DOWNLOAD_CHUNK_SIZE = 4096
constants.HF_HUB_DISABLE_PROGRESS_BARS = True
from pythia_probe.hub.checkpoints import CheckpointSource
src = CheckpointSource(sys.argv[1], cache_dir=sys.argv[2], endpoint=sys.argv[3])
src.fetch(src.resolve([2])[0])
"""


@pytest.fixture(scope="module")
def hub_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    build_pythia_like_repo(root, REPO, steps=(2,))
    return root


@pytest.fixture
def hub(hub_root, monkeypatch):
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 4096)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_PROGRESS_BARS", True)
    with HubServer(hub_root) as server:
        yield server


def new_source(hub, cache) -> CheckpointSource:
    return CheckpointSource(REPO, cache_dir=cache, endpoint=hub.endpoint, retry=FAST)


def weight_ranges(hub) -> list[str | None]:
    return [r["range"] for r in hub.requests("GET", "/cdn/") if r["path"].endswith(WEIGHTS)]


def original(hub_root) -> bytes:
    return (hub_root / REPO / "step2" / WEIGHTS).read_bytes()


def assert_loaded_step2(src: CheckpointSource) -> None:
    rev = src.resolve([2])[0]
    [(_, tensors, _)] = list(src.stream([rev], keep=True))
    ref = random_state_dict(tiny_config(), seed=2)
    ref = {k: v for k, v in ref.items() if not arch.is_legacy_buffer(k)}
    assert sorted(tensors) == sorted(ref)
    assert all(torch.equal(tensors[k], ref[k]) for k in ref)
    blob = src.storage / "blobs" / rev.file(WEIGHTS).sha256
    assert sha256_file(blob) == rev.file(WEIGHTS).sha256
    assert not partial_path(blob).exists()


def test_killed_process_resumes_from_bytes_on_disk(hub, hub_root, tmp_path):
    cache = tmp_path / "cache"
    sha = new_source(hub, cache).resolve([2])[0].file(WEIGHTS).sha256
    part = partial_path(new_source(hub, cache).storage / "blobs" / sha)
    hub.add_fault(Fault("slow", match=WEIGHTS, bandwidth=5_000))  # first 64 KiB, then a long wait
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    child = subprocess.Popen([sys.executable, "-c", CHILD, REPO, str(cache), hub.endpoint],
                             env=env, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (part.exists() and part.stat().st_size >= 16_384):
            assert child.poll() is None and time.monotonic() < deadline, "no partial"
            time.sleep(0.05)
    finally:
        child.kill()  # SIGKILL: no finally blocks, no cleanup in the child
        child.wait()
    have = part.stat().st_size
    assert 0 < have < len(original(hub_root))
    assert part.read_bytes() == original(hub_root)[:have]
    assert_loaded_step2(new_source(hub, cache))  # a NEW source, as a restarted sweep would
    assert weight_ranges(hub) == [None, f"bytes={have}-"]  # only the missing bytes fetched


def test_partial_is_resumed_within_the_disk_budget(hub, hub_root, tmp_path):
    src = new_source(hub, tmp_path / "cache")
    rev = src.resolve([2])[0]
    blob = src.storage / "blobs" / rev.file(WEIGHTS).sha256
    blob.parent.mkdir(parents=True)
    partial_path(blob).write_bytes(original(hub_root)[:30_000])
    # the partial lies inside the file's reservation: a budget of exactly one revision suffices
    [(_, tensors, _)] = list(src.stream([rev], max_disk=rev.nbytes))
    assert "gpt_neox.embed_in.weight" in tensors
    assert weight_ranges(hub) == ["bytes=30000-"]
    assert src.live_bytes() == 0 and src.disk_usage() < 1000  # evicted, partial included


@pytest.mark.parametrize("damage", ["flipped", "too_long"])
def test_corrupt_partial_is_detected_and_fetched_again(hub, hub_root, tmp_path, damage):
    src = new_source(hub, tmp_path / "cache")
    rev = src.resolve([2])[0]
    blob = src.storage / "blobs" / rev.file(WEIGHTS).sha256
    blob.parent.mkdir(parents=True)
    data = bytearray(original(hub_root))
    if damage == "flipped":
        data = data[:40_000]
        data[123] ^= 0xFF
    else:
        data += b"junk"
    partial_path(blob).write_bytes(bytes(data))
    assert_loaded_step2(src)
    want = ["bytes=40000-", None] if damage == "flipped" else [None]
    assert weight_ranges(hub) == want  # sha256 caught the bad bytes; one full re-download


STREAM_CHILD = """
import sys
from huggingface_hub import constants
constants.DOWNLOAD_CHUNK_SIZE = 4096
constants.HF_HUB_DISABLE_PROGRESS_BARS = True
from pythia_probe.hub.checkpoints import CheckpointSource
src = CheckpointSource(sys.argv[1], cache_dir=sys.argv[2], endpoint=sys.argv[3])
for rev, tensors, config in src.stream(src.resolve([0, 2, 4, 64]), prefetch=1):
    print(rev.step, flush=True)
"""


@pytest.fixture(scope="module")
def stream_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub4")
    build_pythia_like_repo(root, REPO, steps=(0, 2, 4, 64), with_main=False)
    return root


@pytest.mark.parametrize("after_step,delay", [(0, 0.05), (2, 0.4)])
def test_kill_9_mid_stream_then_a_rerun_is_exact_and_leaves_a_clean_cache(
        stream_root, tmp_path, after_step, delay):
    """SIGKILL at some point of a stream (mid-download, mid-eviction, between files); the next
    run gets exact tensors, and its evictions leave no file and a cache huggingface_hub reads."""
    from huggingface_hub import scan_cache_dir

    cache = tmp_path / "cache"
    with HubServer(stream_root) as hub:
        hub.bandwidth = 150_000  # ~0.5 s per checkpoint: the kill lands inside the stream
        env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
        child = subprocess.Popen([sys.executable, "-c", STREAM_CHILD, REPO, str(cache),
                                  hub.endpoint], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, text=True)
        try:
            for line in child.stdout:
                if int(line) == after_step:
                    break
            time.sleep(delay)
        finally:
            child.kill()
            child.wait()
        hub.bandwidth = None
        src = new_source(hub, cache)
        for rev, tensors, _ in src.stream(src.resolve([0, 2, 4, 64])):
            ref = random_state_dict(tiny_config(), seed=rev.step)
            assert all(torch.equal(tensors[k], ref[k]) for k in tensors), rev.step
    assert not list(src.storage.glob("blobs/*")) and not list(src.storage.glob("snapshots/*"))
    assert not scan_cache_dir(cache).warnings
