"""Test isolation: no test reaches a real hub or writes into the user's Hugging Face cache.

Runs before any test module imports huggingface_hub or datasets (both read these variables at
import time). Tests that need a hub start the loopback server themselves. The temporary HF_HOME
is deleted when the session ends.
"""

import os
import shutil
import tempfile

import pytest
import torch

for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HF_ENDPOINT", "HF_TOKEN"):
    os.environ.pop(var, None)
HF_HOME = tempfile.mkdtemp(prefix="pythia-probe-tests-hf-")
os.environ["HF_HOME"] = HF_HOME
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session", autouse=True)
def _remove_hf_home():
    """The suite's HF_HOME (tool caches, hub caches) goes when the session ends."""
    yield
    shutil.rmtree(HF_HOME, ignore_errors=True)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors: one torch thread avoids OpenMP spin-waits on a shared 2-core machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def sleeps(monkeypatch):
    """Every ``time.sleep`` of the test (any thread), its seconds in order; the sleeps still
    happen. Tests count retries and backoff waits with it instead of timing them: on a busy
    machine a wall-clock limit fails for reasons of its own."""
    import time

    real, seen = time.sleep, []

    def sleep(seconds):
        seen.append(seconds)
        real(seconds)

    monkeypatch.setattr(time, "sleep", sleep)
    return seen


@pytest.fixture
def hub(hub_root, monkeypatch):
    """A loopback hub serving the test module's ``hub_root`` (each module builds its own repos;
    a module may define its own ``hub``)."""
    from huggingface_hub import constants

    from pythia_probe.testing.hub import HubServer

    monkeypatch.setattr(constants, "HF_HUB_DISABLE_PROGRESS_BARS", True)
    with HubServer(hub_root) as server:
        yield server


@pytest.fixture(scope="session")
def analyses_script():
    """Import a script of analyses/ by its module name (the folder on sys.path meanwhile)."""
    import importlib
    import sys
    from pathlib import Path

    folder = str(Path(__file__).resolve().parents[1] / "analyses")
    sys.path.insert(0, folder)
    try:
        yield importlib.import_module
    finally:
        sys.path.remove(folder)
