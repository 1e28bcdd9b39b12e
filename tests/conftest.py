"""Test isolation: no test reaches a real hub or writes into the user's Hugging Face cache.

Runs before any test module imports huggingface_hub or datasets (both read these variables at
import time). Tests that need a hub start the loopback server themselves.
"""

import os
import tempfile

import pytest
import torch

for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HF_ENDPOINT", "HF_TOKEN"):
    os.environ.pop(var, None)
os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="pythia-probe-tests-hf-")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors: one torch thread avoids OpenMP spin-waits on a shared 2-core machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
