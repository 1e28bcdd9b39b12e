"""The loopback hub speaks what huggingface_hub's real client code expects."""

import hashlib
import json

import httpx2
import pytest
import torch
from huggingface_hub import HfApi, constants, hf_hub_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from pythia_probe.testing.hub import Fault, HubServer
from pythia_probe.testing.repos import build_pythia_like_repo, random_state_dict, tiny_config

REPO = "EleutherAI/pythia-tiny"
STEPS = (0, 1, 2, 64)


@pytest.fixture(scope="module")
def hub_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    build_pythia_like_repo(root, REPO, steps=STEPS, layouts={64: ("safetensors", 2)})
    return root


@pytest.fixture
def hub(hub_root, monkeypatch):
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 4096)
    with HubServer(hub_root) as server:
        yield server


def test_repo_layout(hub_root):
    repo = hub_root / REPO
    assert (repo / "step0" / "pytorch_model.bin").read_bytes() == (
        repo / "step1" / "pytorch_model.bin").read_bytes()
    sd = torch.load(repo / "step0" / "pytorch_model.bin", weights_only=True)
    assert sd["gpt_neox.layers.0.attention.bias"].dtype == torch.bool  # legacy buffers present
    index = json.loads((repo / "step64" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(random_state_dict(tiny_config(), 64))
    assert sorted(set(index["weight_map"].values())) == [
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]


def test_refs_tree_info_paths(hub, hub_root):
    api = HfApi(endpoint=hub.endpoint)
    refs = {b.name: b.target_commit for b in api.list_repo_refs(REPO).branches}
    assert set(refs) == {"main", "step0", "step1", "step2", "step64"}
    assert refs["step0"] != refs["step1"] and len(refs["step0"]) == 40
    tree = {f.path: f for f in api.list_repo_tree(REPO, revision="step1")}
    data = (hub_root / REPO / "step1" / "pytorch_model.bin").read_bytes()
    assert tree["pytorch_model.bin"].lfs.sha256 == hashlib.sha256(data).hexdigest()
    assert tree["pytorch_model.bin"].size == len(data) and tree["config.json"].lfs is None
    info = api.model_info(REPO, revision="step2", files_metadata=True)
    assert info.sha == refs["step2"] and {s.rfilename for s in info.siblings} == {
        "config.json", "pytorch_model.bin"}
    [p] = api.get_paths_info(REPO, ["config.json", "missing.txt"], revision=refs["step2"])
    assert p.path == "config.json"
    assert p.size == (hub_root / REPO / "step2" / "config.json").stat().st_size


def test_download_via_cdn_redirect_and_headers(hub, tmp_path, hub_root):
    p = hf_hub_download(REPO, "pytorch_model.bin", revision="step2", cache_dir=tmp_path,
                        endpoint=hub.endpoint)
    assert open(p, "rb").read() == (hub_root / REPO / "step2" / "pytorch_model.bin").read_bytes()
    head = httpx2.head(f"{hub.endpoint}/{REPO}/resolve/step2/pytorch_model.bin")
    assert head.status_code == 302 and head.headers["Location"].startswith("http://localhost:")
    assert head.headers["X-Linked-Size"] == str(len(open(p, "rb").read()))
    sha = hashlib.sha256(open(p, "rb").read()).hexdigest()
    assert head.headers["X-Linked-Etag"].strip('"') == sha
    c = hf_hub_download(REPO, "config.json", revision="step2", cache_dir=tmp_path,
                        endpoint=hub.endpoint)
    assert json.loads(open(c).read())["hidden_size"] == 32
    assert (tmp_path / "models--EleutherAI--pythia-tiny" / "refs" / "step2").exists()


def test_errors_map_to_hub_exceptions(hub, tmp_path):
    kw = dict(cache_dir=tmp_path, endpoint=hub.endpoint)
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download(REPO, "config.json", revision="step3", **kw)
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(REPO, "nope.json", revision="step2", **kw)
    with pytest.raises(RepositoryNotFoundError):
        HfApi(endpoint=hub.endpoint).list_repo_refs("EleutherAI/nothing")


def test_range_requests_and_faults(hub, hub_root):
    url = f"{hub.endpoint}/cdn/{REPO}/x/pytorch_model.bin"
    refs = HfApi(endpoint=hub.endpoint).list_repo_refs(REPO).branches
    commit = {b.name: b.target_commit for b in refs}
    url = url.replace("/x/", f"/{commit['step2']}/")
    data = (hub_root / REPO / "step2" / "pytorch_model.bin").read_bytes()
    r = httpx2.get(url, headers={"Range": "bytes=1000-"})
    assert r.status_code == 206 and r.content == data[1000:]
    assert r.headers["Content-Range"] == f"bytes 1000-{len(data) - 1}/{len(data)}"
    hub.add_fault(Fault("429", retry_after=7), Fault("500"), Fault("corrupt"))
    r = httpx2.get(url)
    assert r.status_code == 429 and r.headers["Retry-After"] == "7"
    assert httpx2.get(url).status_code == 500
    bad = httpx2.get(url).content
    assert len(bad) == len(data) and bad != data
    assert httpx2.get(url).content == data  # faults are used up
    hub.add_fault(Fault("drop", after_bytes=100))
    with pytest.raises(httpx2.RemoteProtocolError):
        httpx2.get(url)


def test_fault_validation():
    with pytest.raises(ValueError, match="unknown fault kind"):
        Fault("explode")
    with pytest.raises(ValueError, match="data, head, api or any"):
        Fault("500", on="everywhere")


def test_the_suite_leaves_no_hf_home_behind(tmp_path):
    """conftest's temporary HF_HOME (pythia-probe-tests-hf-*) is deleted when a session ends."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    tests = Path(__file__).parent
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          str(tests / "test_steps.py"), "-k", "parse"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:]
    assert "[100%]" in out.stdout  # the tests ran (and made their HF_HOME)
    assert not list(tmp_path.glob("pythia-probe-tests-hf-*"))
