"""Issue #16, the hub side: nothing unbounded, credentials kept to the hub, one line for every
failure. Hostile loopback hubs send more than they list, accept connections and never answer,
redirect to a second server that records what it is sent, or redirect in a loop; a host that
does not exist is not retried."""

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from huggingface_hub import HfApi, constants

from pythia_probe.cli import run_main
from pythia_probe.errors import (
    ChecksumError,
    HubDownloadError,
    HubUnreachableError,
    UserError,
)
from pythia_probe.hub import net as hubnet
from pythia_probe.hub.checkpoints import CheckpointSource, RetryPolicy
from pythia_probe.testing.dist import free_port
from pythia_probe.testing.hub import Fault, HubServer
from pythia_probe.testing.repos import build_pythia_like_repo, random_state_dict, tiny_config

REPO = "EleutherAI/pythia-tiny"
FAST = RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.05)
WEIGHTS = "pytorch_model.bin"
EXTRA = 64 << 20  # what a hostile server sends beyond the listed size

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def hub_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    build_pythia_like_repo(root, REPO, steps=(0, 2), with_main=False)
    return root


@pytest.fixture
def short_timeouts(monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_ETAG_TIMEOUT", 0.5)
    monkeypatch.setattr(constants, "HF_HUB_DOWNLOAD_TIMEOUT", 0.5)


def source(endpoint: str, cache, **kw) -> CheckpointSource:
    return CheckpointSource(REPO, cache_dir=cache, endpoint=endpoint, **{"retry": FAST, **kw})


def one_line(err: BaseException) -> str:
    assert isinstance(err, UserError), type(err).__mro__
    assert str(err) and "\n" not in str(err)
    return str(err)


def gets(hub, name: str) -> list[dict]:
    return [r for r in hub.requests("GET") if r["path"].endswith("/" + name)]


def exact(tensors: dict, step: int) -> bool:
    ref = random_state_dict(tiny_config(), seed=step)
    return all((tensors[k] == ref[k]).all() for k in tensors) and len(tensors) > 10


# ---- downloads are cut off at the listed size ----------------------------------------------------
@pytest.mark.parametrize("name", ["config.json", WEIGHTS])
@pytest.mark.parametrize("announce", [True, False], ids=["content-length", "no-length"])
def test_a_body_longer_than_listed_is_cut_off_and_fetched_again_once(hub, tmp_path, name,
                                                                     announce, sleeps):
    hub.add_fault(Fault("oversize", match=name, extra_bytes=EXTRA, announce=announce, times=-1))
    src = source(hub.endpoint, tmp_path / "cache")
    [rev] = src.resolve([2])
    size = rev.file(name).size
    with pytest.raises(ChecksumError, match=rf"{name} of .*step2: the server sent more than "
                                            rf"the {size} bytes the hub lists") as err:
        list(src.stream([rev]))
    one_line(err.value)
    assert len(gets(hub, name)) == 2  # fetched again once, as any hash mismatch
    assert hub.bytes_sent < 2 * size + EXTRA // 4  # the client stopped reading at once
    assert len(hub.hits) == 2 and sleeps == []  # a mismatch is fetched again at once
    assert not [p for p in src.storage.rglob("*") if p.is_file() and p.stat().st_size > size]
    assert not list(src.storage.glob("blobs/*.partial"))


def test_one_oversized_answer_is_retried_and_the_file_loads(hub, tmp_path):
    hub.add_fault(Fault("oversize", match=WEIGHTS, extra_bytes=EXTRA, announce=False))
    src = source(hub.endpoint, tmp_path / "cache")
    [(rev, tensors, _)] = list(src.stream(src.resolve([2])))
    assert exact(tensors, 2) and len(gets(hub, WEIGHTS)) == 2


# ---- every hub call has a timeout ----------------------------------------------------------------
@contextmanager
def silent_host() -> Iterator[tuple[str, list]]:
    """``(host:port, connections)``: a port that accepts TCP connections, counts them and never
    answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    s.settimeout(0.05)
    accepted, stop = [], threading.Event()

    def accept():
        while not stop.is_set():
            try:
                accepted.append(s.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{s.getsockname()[1]}", accepted
    finally:
        stop.set()
        thread.join()
        for conn in [*accepted, s]:
            conn.close()


def test_a_hub_that_accepts_and_never_answers_is_one_line_within_the_retry_budget(
        tmp_path, short_timeouts, sleeps):
    with silent_host() as (host, connections), pytest.raises(HubDownloadError) as err:
        source(f"http://{host}", tmp_path / "cache").steps()
    msg = one_line(err.value)
    assert f"listing the branches of {REPO} failed" in msg and "after 3 attempts" in msg
    assert f"{host} accepted the connection but sent nothing for 0.5 s" in msg
    assert "HF_HUB_DOWNLOAD_TIMEOUT" in msg and "HF_HUB_OFFLINE=1" in msg
    # three timed-out tries (one connection each), not a hang: two backoff waits between them
    assert len(connections) == FAST.attempts
    assert sleeps == [FAST.delay(0), FAST.delay(1)]


@pytest.mark.parametrize("fault", [
    Fault("stall", on="api", match="*/refs", times=-1),
    Fault("stall", on="api", match="*/tree/*", times=-1),
    Fault("stall", on="head", match="config.json", times=-1),
    Fault("stall", on="data", match="config.json", times=-1),
    Fault("stall", on="data", match=WEIGHTS, times=-1),
], ids=["refs", "tree", "head", "get-small", "get-lfs"])
def test_every_model_call_times_out_and_names_the_host(hub, tmp_path, short_timeouts, fault,
                                                       sleeps):
    hub.add_fault(fault)
    src = source(hub.endpoint, tmp_path / "cache")
    with pytest.raises(HubDownloadError, match="sent nothing for 0.5 s") as err:
        rev = src.resolve([2])[0]
        src.config(rev)
        list(src.stream([rev]))
    # three timed-out tries, not a hang: two backoff waits between them
    assert len(hub.hits) == FAST.attempts and sleeps == [FAST.delay(0), FAST.delay(1)]
    host = "localhost" if fault.match == WEIGHTS and fault.on == "data" else "127.0.0.1"
    assert f"{host}:{hub.port}" in one_line(err.value)


def test_one_stall_is_retried(hub, tmp_path, short_timeouts):
    hub.add_fault(Fault("stall", on="api", match="*/refs"), Fault("stall", match=WEIGHTS))
    src = source(hub.endpoint, tmp_path / "cache")
    [(rev, tensors, _)] = list(src.stream(src.resolve([2])))
    assert exact(tensors, 2) and all(f.times == 0 for f in hub.faults)


def test_calls_made_through_huggingface_hub_time_out_too(hub, short_timeouts, sleeps):
    """HfApi passes no timeout for refs, tree and paths-info (and an explicit None for
    model_info); the hook on the shared client bounds them all, and under our policy the tree
    listing's own retry loop (5 retries, 23 s of sleep) does not run."""
    hub.add_fault(Fault("stall", on="api", times=-1))
    api = HfApi(endpoint=hub.endpoint)
    calls = [lambda: api.list_repo_refs(REPO), lambda: list(api.list_repo_tree(REPO)),
             lambda: api.get_paths_info(REPO, ["config.json"]),
             lambda: api.model_info(REPO, timeout=None)]
    for k, fn in enumerate(calls, start=1):
        with pytest.raises(Exception) as err, hubnet.our_policy():
            fn()
        assert hubnet.timed_out(err.value)
        assert len(hub.hits) == k and sleeps == []  # one timed-out try each, no retry loop
    assert len(hub.requests("GET", "/tree/")) == 1


def test_huggingface_hubs_own_retries_stay_outside_our_policy(hub, short_timeouts):
    hub.add_fault(Fault("stall", on="api", match="*/tree/*"))  # once
    hubnet.install()
    api = HfApi(endpoint=hub.endpoint)
    assert {e.path for e in api.list_repo_tree(REPO, revision="step2")} >= {"config.json"}
    assert len(hub.requests("GET", "/tree/")) == 2  # huggingface_hub retried it itself


def test_a_callers_own_timeout_is_kept():
    import httpx2

    request = httpx2.Request("GET", "http://h/", extensions={"timeout": {
        "connect": 3.0, "read": None, "write": None, "pool": 7.0}})
    hubnet._bound_timeouts(request)
    t = hubnet.timeouts()
    assert request.extensions["timeout"] == {"connect": 3.0, "read": t["read"],
                                             "write": t["write"], "pool": 7.0}


# ---- a host that cannot be reached is not retried -----------------------------------------------
closed_port = free_port


@pytest.mark.parametrize("endpoint,why", [
    ("http://no-such-host.invalid", "name resolution failed"),
    (f"http://127.0.0.1:{closed_port()}", "connection refused"),
], ids=["dns", "refused"])
def test_an_unreachable_hub_is_one_line_at_once_saying_what_to_do_offline(tmp_path, endpoint,
                                                                          why, sleeps):
    slow = RetryPolicy(attempts=5, base_delay=1.0, max_delay=30.0)  # the default's schedule
    with pytest.raises(HubUnreachableError) as err:
        source(endpoint, tmp_path / "cache", retry=slow).steps()
    assert sleeps == []  # one try, no 26 s of retries
    msg = one_line(err.value)
    assert f"listing the branches of {REPO}: cannot reach " in msg and why in msg
    for advice in ("HF_HUB_OFFLINE=1", "--cache-dir", f"hf download {REPO} --revision",
                   "step*/", "HF_ENDPOINT"):
        assert advice in msg, advice


def test_an_unreachable_hub_for_a_download_names_the_file(hub, tmp_path):
    src = source(hub.endpoint, tmp_path / "cache")
    [rev] = src.resolve([2])
    src.endpoint = f"http://127.0.0.1:{closed_port()}"  # the hub went away after resolving
    with pytest.raises(HubUnreachableError, match="download of config.json at step2"):
        src.config(rev)


# ---- the token stays on the hub's host -----------------------------------------------------------
@pytest.fixture
def hub_and_cdn(hub_root):
    """Hub A sends LFS downloads (and redirected calls) to server B, which records headers."""
    with HubServer(hub_root) as cdn, HubServer(hub_root, cdn_url=cdn.endpoint) as hub:
        yield hub, cdn


@pytest.mark.parametrize("via", ["argument", "HF_TOKEN"])
def test_the_token_is_sent_to_the_hub_only_never_to_a_redirect_target(hub_and_cdn, tmp_path,
                                                                       monkeypatch, via):
    hub, cdn = hub_and_cdn
    secret = "hf_secret_token_0123456789"
    if via == "HF_TOKEN":
        monkeypatch.setenv("HF_TOKEN", secret)
    hub.add_fault(Fault("redirect", on="head", match="config.json", to=cdn.endpoint),  # step0
                  Fault("redirect", on="data", match="config.json", to=cdn.endpoint),  # step2
                  Fault("redirect", on="api", match="*/tree/*", to=cdn.endpoint))
    src = source(hub.endpoint, tmp_path / "cache", token=secret if via == "argument" else None)
    for rev, tensors, config in src.stream(src.resolve([0, 2]), prefetch=0):
        assert exact(tensors, rev.step) and config["hidden_size"] == 32
    assert all(f.times == 0 for f in hub.faults)  # every redirect happened
    on_cdn = {(r["method"], r["path"].rsplit("/", 1)[-1]) for r in cdn.log}
    assert {("GET", WEIGHTS), ("GET", "config.json")} <= on_cdn
    assert any("/tree/" in r["path"] for r in cdn.log)
    assert [r["auth"] for r in cdn.log] == [None] * len(cdn.log)  # never the token
    assert {r["auth"] for r in hub.log} == {f"Bearer {secret}"}  # the hub got it each time


def test_keeps_token_follows_huggingface_hubs_rule():
    hub = "https://huggingface.co/org/m/resolve/main/x.bin"
    assert hubnet.keeps_token(hub, "https://huggingface.co/other/path")
    assert hubnet.keeps_token(hub, "https://hf.co/x")
    assert not hubnet.keeps_token(hub, "https://cdn-lfs.huggingface.co/x?sig=1")
    assert not hubnet.keeps_token(hub, "http://huggingface.co/x")  # another scheme and port
    assert not hubnet.keeps_token("http://127.0.0.1:1/a", "http://127.0.0.1:2/a")
    assert hubnet.without_token({"authorization": "x", "Authorization": "y", "a": "b"}) == {
        "a": "b"}


# ---- a redirect loop is one line naming the file -------------------------------------------------
@pytest.mark.parametrize("on", ["head", "data"])
def test_a_redirect_loop_on_config_is_one_line_naming_the_file(hub, tmp_path, capsys, on):
    hub.add_fault(Fault("loop", on=on, match="config.json", times=-1))
    src = source(hub.endpoint, tmp_path / "cache")
    [rev] = src.resolve([2])
    with pytest.raises(HubDownloadError, match=r"download of config\.json at step2 .*: the hub's "
                                               "redirects never end") as err:
        src.config(rev)
    one_line(err.value)
    assert run_main(lambda: src.config(rev), "pythia-probe sweep") == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "config.json" in lines[0] and "Traceback" not in lines[0]
