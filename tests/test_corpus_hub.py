"""corpus.py's hub path for real: huggingface_hub lists a dataset repo served by the loopback hub
and datasets streams its parquet shards over hf:// (nothing in either library is patched; the
endpoint they read at import is pointed at the hub with testing.endpoint.use_endpoint, and one
test runs a fresh process that only sets HF_ENDPOINT)."""

import json
import os
import pickle
import subprocess
import sys

import httpx2
import pytest
from huggingface_hub import HfApi, HfFileSystem, constants

from pythia_probe.corpus import corpus_shards, iter_documents
from pythia_probe.errors import BadInputError
from pythia_probe.hub import io as hubio
from pythia_probe.testing.endpoint import use_endpoint
from pythia_probe.testing.hub import Fault, HubServer
from pythia_probe.testing.repos import build_dataset_repo

REPO = "Skylion007/openwebtext-tiny"
FAST = hubio.RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.05)


def tool_files() -> list:
    """Files left in the tool's dataset cache (shards are deleted once read)."""
    root = hubio.tool_cache("datasets")
    return [p for p in root.rglob("blobs/*")] if root.exists() else []


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    main = build_dataset_repo(root, REPO, splits={"train": 3, "test": 1})
    v1 = build_dataset_repo(root, REPO, splits={"train": 2}, seed=1, branch="v1")
    return root, main, v1


@pytest.fixture(scope="module")
def server(written):
    with HubServer(written[0]) as hub, use_endpoint(hub.endpoint):
        yield hub


@pytest.fixture
def hub(server, monkeypatch):
    """The module's hub with no faults, an empty log and fresh HfFileSystem listings; datasets'
    own read retries shortened (its defaults wait 5-60 s between 20 tries)."""
    import datasets

    monkeypatch.setattr(datasets.config, "STREAMING_READ_MAX_RETRIES", 1)
    monkeypatch.setattr(datasets.config, "STREAMING_READ_RATE_LIMIT_RETRY_INTERVAL", 0)
    monkeypatch.setattr(datasets.config, "STREAMING_READ_RETRY_INTERVAL", 0)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_PROGRESS_BARS", True)
    monkeypatch.setattr(hubio, "DEFAULT_RETRY", FAST)
    HfFileSystem.clear_instance_cache()
    server.faults.clear()
    server.hits.clear()
    server.log.clear()
    return server


def names(files: dict, split: str = "train", at: str = "") -> list[str]:
    return [f"hf://datasets/{REPO}{at}/{p}" for p in files if f"/{split}-" in p]


def docs_of(files: dict, split: str = "train") -> list[str]:
    return [d for p in files if f"/{split}-" in p for d in files[p]]


def test_lists_shards_and_streams_every_document(hub, written):
    _, main, _ = written
    shards = corpus_shards(REPO)
    assert [s.name for s in shards] == names(main)
    for s in shards:
        assert list(s.documents()) == main[s.name.split(f"{REPO}/")[1]]
    assert hub.requests("GET", f"/api/datasets/{REPO}/tree/")  # listed once, at one commit
    assert tool_files() == []
    cdn = {r["path"].rsplit("/", 1)[1] for r in hub.requests("GET", "/cdn/datasets/")}
    assert cdn == {n.rsplit("/", 1)[1] for n in names(main)}


@pytest.mark.parametrize("min_chars,max_docs", [(0, None), (400, None), (900, 25), (0, 3)])
def test_min_chars_and_max_docs_match_a_plain_filter(hub, written, min_chars, max_docs):
    ref = [d for d in docs_of(written[1]) if len(d) >= min_chars][:max_docs]
    assert 0 < len(ref) < len(docs_of(written[1])) or min_chars == 0
    got = list(iter_documents(REPO, min_chars=min_chars, max_docs=max_docs))
    assert got == ref


def test_max_docs_stops_reading_early(hub, written):
    assert list(iter_documents(REPO, max_docs=5)) == docs_of(written[1])[:5]
    read = {r["path"].rsplit("/", 1)[1] for r in hub.requests("GET", "/cdn/")}
    assert read == {"train-00000-of-00003.parquet"}


def test_shard_names_are_stable(hub, written):
    first = [s.name for s in corpus_shards(REPO)]
    assert [s.name for s in corpus_shards(REPO)] == first
    assert [pickle.loads(pickle.dumps(s)).name for s in corpus_shards(REPO)] == first
    with HubServer(written[0]) as other, use_endpoint(other.endpoint):  # another port
        assert [s.name for s in corpus_shards(REPO)] == first
    assert not any("127.0.0.1" in n or "localhost" in n for n in first)


def test_split_revision_and_glob(hub, written):
    _, main, v1 = written
    test = corpus_shards(REPO, split="test")
    assert [s.name for s in test] == names(main, "test")
    assert list(test[0].documents()) == docs_of(main, "test")
    old = corpus_shards(REPO, revision="v1")
    assert [s.name for s in old] == names(v1, at="@v1")
    assert list(iter_documents(REPO, revision="v1")) == docs_of(v1)
    glob = corpus_shards(f"hf://datasets/{REPO}/data/train-*.parquet")
    assert [s.name for s in glob] == names(main)
    assert [d for s in glob for d in s.documents()] == docs_of(main)


def test_protocol_pieces(hub, written):
    api = HfApi(endpoint=hub.endpoint)
    refs = {b.name: b.target_commit for b in api.list_repo_refs(REPO, repo_type="dataset").branches}
    assert set(refs) == {"main", "v1"} and refs["main"] != refs["v1"]
    assert api.dataset_info(REPO).sha == refs["main"]
    top = {(type(e).__name__, e.path) for e in api.list_repo_tree(REPO, repo_type="dataset")}
    assert top == {("RepoFile", "README.md"), ("RepoFolder", "data")}
    assert sorted(api.list_repo_files(REPO, repo_type="dataset")) == ["README.md", *written[1]]
    [folder] = api.get_paths_info(REPO, ["data"], repo_type="dataset")
    assert type(folder).__name__ == "RepoFolder"
    path = next(iter(written[1]))
    data = (written[0] / "datasets" / REPO / "main" / path).read_bytes()
    url = f"{hub.endpoint}/datasets/{REPO}/resolve/main/{path}"
    get = lambda rng: httpx2.get(url, headers={"Range": rng}, follow_redirects=True)  # noqa: E731
    r = get("bytes=10-99")
    assert r.status_code == 206 and r.content == data[10:100]
    assert r.headers["Content-Range"] == f"bytes 10-99/{len(data)}"
    assert get("bytes=-50").content == data[-50:] and get("bytes=100-").content == data[100:]
    assert get(f"bytes={len(data)}-").status_code == 416


def test_missing_text_field_names_the_columns(hub):
    with pytest.raises(BadInputError, match=r"no text field 'body'.*\['id', 'text'\]"):
        next(iter_documents(REPO, text_field="body"))


def test_unknown_dataset_is_a_clear_error(hub):
    with pytest.raises(OSError, match=r"'org/none' is no local path, and listing it as a hub "
                                      r"dataset failed \(RepositoryNotFoundError"):
        corpus_shards("org/none")


@pytest.mark.parametrize("fault", [Fault("500", match="*.parquet"),
                                   Fault("drop", match="*.parquet", after_bytes=1000)],
                         ids=lambda f: f.kind)
def test_recovers_from_a_transient_fault(hub, written, fault):
    hub.add_fault(fault)
    assert list(iter_documents(REPO)) == docs_of(written[1])
    assert fault.times == 0  # it fired


def test_hub_that_keeps_failing_is_a_clear_error(hub):
    hub.add_fault(Fault("429", match="*.parquet", times=-1, retry_after=0))  # rate limit forever
    with pytest.raises(ConnectionError, match=r"reading hf://datasets/.*train-00000-of-00003"
                                              r"\.parquet failed: .*kept failing after 3"):
        next(iter_documents(REPO))
    assert len(hub.requests("GET", "/cdn/")) >= 2  # it retried before giving up


def test_fresh_process_with_only_hf_endpoint(hub, written):
    code = ("import json; from pythia_probe.corpus import corpus_shards, iter_documents as it; "
            f"print(json.dumps([[s.name for s in corpus_shards({REPO!r})], "
            f"list(it({REPO!r}, min_chars=300, max_docs=30))]))")
    env = {**os.environ, "HF_ENDPOINT": hub.endpoint, "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    shard_names, docs = json.loads(out.stdout.strip().splitlines()[-1])
    assert shard_names == names(written[1])
    assert docs == [d for d in docs_of(written[1]) if len(d) >= 300][:30]


def test_use_endpoint_restores_everything():
    import datasets

    before = (constants.ENDPOINT, datasets.config.HF_ENDPOINT, os.environ.get("HF_ENDPOINT"))
    with use_endpoint("http://127.0.0.1:1/"):
        assert constants.ENDPOINT == datasets.config.HF_ENDPOINT == "http://127.0.0.1:1"
    assert (constants.ENDPOINT, datasets.config.HF_ENDPOINT,
            os.environ.get("HF_ENDPOINT")) == before
    with pytest.raises(ValueError, match="http"):
        use_endpoint("127.0.0.1:1").__enter__()


SHARD0 = "train-00000-of-00003.parquet"
SHARD0_GLOB = "*/" + SHARD0  # faults match the path in the repo (data/...)


def test_bad_parquet_bytes_are_fetched_again_then_named(hub, written):
    """The bug: one flipped bit at byte 10,000 of a streamed shard gave other statistics."""
    from pythia_probe.errors import CorruptFileError

    size = (written[0] / "datasets" / REPO / "main" / "data" / SHARD0).stat().st_size
    assert size > 10_000
    once = Fault("corrupt", match=SHARD0_GLOB, at_byte=10_000)
    hub.add_fault(once)
    assert list(iter_documents(REPO)) == docs_of(written[1])  # caught by sha256, fetched again
    assert once.times == 0 and len(hub.requests("GET", SHARD0)) == 2
    hub.add_fault(Fault("corrupt", match=SHARD0_GLOB, at_byte=10_000, times=-1))
    with pytest.raises(CorruptFileError, match=rf"hf://datasets/{REPO}/data/{SHARD0}: the "
                                               r"downloaded bytes do not match the hub's sha256"):
        list(iter_documents(REPO))
    assert tool_files() == []  # nothing corrupt (or half-read) stays in the tool's cache


@pytest.mark.parametrize("fault", [
    Fault("500", on="api", match=f"/api/datasets/{REPO}", times=2),  # dataset_info: the commit
    Fault("500", on="api", match="*/tree/*", times=2),  # the listing
    Fault("429", on="head", match=SHARD0_GLOB, times=2),  # the HEAD that finds the CDN
    Fault("500", match=SHARD0_GLOB, times=2),  # the bytes
], ids=["info", "tree", "head", "get"])
def test_every_dataset_hub_call_is_retried(hub, written, fault):
    hub.add_fault(fault)
    assert list(iter_documents(REPO, max_docs=3)) == docs_of(written[1])[:3]
    assert fault.times == 0


def test_hf_path_is_looked_up_verified_and_retried(hub, written):
    hub.add_fault(Fault("500", on="api", match="*/paths-info/*", times=2))
    path = f"hf://datasets/{REPO}/data/{SHARD0}"
    assert list(iter_documents(path)) == written[1][f"data/{SHARD0}"]
    assert hub.faults[0].times == 0 and tool_files() == []


# ---- issue #16: bounded reads and calls for datasets too -------------------------------------
def test_an_oversized_shard_is_cut_off_at_the_listed_size(hub, written):
    from pythia_probe.errors import ChecksumError

    size = (written[0] / "datasets" / REPO / "main" / "data" / SHARD0).stat().st_size
    extra = 64 << 20
    hub.add_fault(Fault("oversize", match=SHARD0_GLOB, extra_bytes=extra, announce=False,
                        times=-1))
    with pytest.raises(ChecksumError, match=rf"{SHARD0}: the server sent more than the {size} "
                                            "bytes the hub lists"):
        list(iter_documents(REPO))
    assert len(hub.requests("GET", SHARD0)) == 2  # once more, as for any mismatch
    assert hub.bytes_sent < 2 * size + extra // 4
    assert tool_files() == []


@pytest.mark.parametrize("fault", [
    Fault("stall", on="api", match=f"/api/datasets/{REPO}", times=-1),
    Fault("stall", on="api", match="*/tree/*", times=-1),
    Fault("stall", on="api", match="*/paths-info/*", times=-1),
    Fault("stall", on="head", match=SHARD0_GLOB, times=-1),
    Fault("stall", match=SHARD0_GLOB, times=-1),
], ids=["info", "tree", "paths-info", "head", "get"])
def test_every_dataset_hub_call_times_out(hub, monkeypatch, fault, sleeps):
    monkeypatch.setattr(constants, "HF_HUB_ETAG_TIMEOUT", 0.5)
    monkeypatch.setattr(constants, "HF_HUB_DOWNLOAD_TIMEOUT", 0.5)
    hub.add_fault(fault)
    with pytest.raises(OSError, match="timed out|sent nothing for 0.5 s"):  # the listing's
        list(iter_documents(f"hf://datasets/{REPO}/data/{SHARD0}" if "paths" in fault.match
                            else REPO, max_docs=3))  # wrapper (corpus) keeps the type only
    # three timed-out tries, not a hang: two backoff waits between them
    assert len(hub.hits) == FAST.attempts and sleeps == [FAST.delay(0), FAST.delay(1)]


def test_a_dataset_on_a_host_that_does_not_resolve_is_not_retried(hub, monkeypatch, sleeps):
    monkeypatch.setattr(hubio, "DEFAULT_RETRY", hubio.RetryPolicy(5, 1.0, 30.0))
    monkeypatch.setenv("HF_ENDPOINT", "http://no-such-host.invalid")
    with pytest.raises(OSError, match="name resolution failed|Name or service not known"):
        corpus_shards(REPO)
    assert sleeps == []  # one try, no backoff
