"""Point huggingface_hub and datasets at another hub endpoint inside a running process.

Both libraries read ``HF_ENDPOINT`` once, at import: ``huggingface_hub.constants.ENDPOINT`` and
``HUGGINGFACE_CO_URL_TEMPLATE``, the default client behind module-level functions
(``huggingface_hub.list_repo_files`` is ``hf_api.api.list_repo_files``), and
``datasets.config.HF_ENDPOINT`` / ``HUB_DATASETS_URL`` (the endpoint ``load_dataset`` gives the
``HfFileSystem`` it reads ``hf://`` files with). Setting the environment variable after import
changes none of them, so tests that run library code in-process against a
:class:`~pythia_probe.testing.hub.HubServer` use :func:`use_endpoint`, which sets the variable
and these values together and restores all of them on exit. A fresh process started with
``HF_ENDPOINT=...`` needs none of this. On exit the cached ``HfFileSystem`` instances (and their
directory listings) are dropped, so a later hub on a reused port is listed afresh.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from contextlib import contextmanager

from huggingface_hub import HfFileSystem, constants, hf_api


def _targets(endpoint: str) -> list[tuple[object, str, object]]:
    """``(object, attribute, new value)`` for every import-time copy of the endpoint."""

    out = [(constants, "ENDPOINT", endpoint),
           (constants, "HUGGINGFACE_CO_URL_TEMPLATE",
            endpoint + "/{repo_id}/resolve/{revision}/{filename}"),
           (hf_api.api, "endpoint", endpoint)]
    try:
        config = importlib.import_module("datasets.config")
    except ImportError:
        return out
    return out + [(config, "HF_ENDPOINT", endpoint),
                  (config, "HUB_DATASETS_URL",
                   endpoint + "/datasets/{repo_id}/resolve/{revision}/{path}")]


@contextmanager
def use_endpoint(endpoint: str) -> Iterator[str]:
    """Within the block, huggingface_hub and datasets talk to ``endpoint`` (e.g. a loopback hub)
    exactly as if the process had been started with ``HF_ENDPOINT=endpoint``."""
    endpoint = endpoint.rstrip("/")
    if not endpoint.startswith(("http://", "https://")):
        raise ValueError(f"endpoint must be an http(s) URL, got {endpoint!r}")
    targets = _targets(endpoint)
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in targets]
    old_env = os.environ.get("HF_ENDPOINT")
    os.environ["HF_ENDPOINT"] = endpoint
    try:
        for obj, name, value in targets:
            setattr(obj, name, value)
        yield endpoint
    finally:
        for obj, name, value in saved:
            setattr(obj, name, value)

        HfFileSystem.clear_instance_cache()  # cached listings of this endpoint (port reuse)
        if old_env is None:
            os.environ.pop("HF_ENDPOINT", None)
        else:
            os.environ["HF_ENDPOINT"] = old_env
