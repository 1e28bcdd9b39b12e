"""The network rules of every hub call: timeouts, one retry policy, and which hosts get the
access token.

- Timeouts: huggingface_hub's shared client (``get_session()``) is built with ``timeout=None``
  and most ``HfApi`` calls (refs, tree, paths-info, dataset listings) pass none, so a hub that
  accepts a connection and never answers would hang its caller forever. :func:`install` makes
  huggingface_hub build that client (now and whenever it rebuilds it, e.g. after a connection
  error or a fork) with a request hook that gives every request a connect timeout of
  ``HF_HUB_ETAG_TIMEOUT`` seconds and read / write / pool timeouts of ``HF_HUB_DOWNLOAD_TIMEOUT``
  seconds (huggingface_hub's own variables, 10 s by default) where the caller set none; a
  caller's own timeout is kept. Every request of huggingface_hub, of datasets' ``hf://`` reads
  and of this tool goes through that client, so one hook bounds them all.
- One retry policy: huggingface_hub retries transport failures inside some calls
  (``http_backoff``: tree listings, ``HfFileSystem`` reads; 5 retries, up to 23 s of sleep),
  which multiplies with :func:`pythia_probe.hub.io.call`'s own retries. The client's transport
  therefore re-raises a transport failure as :class:`PolicyError` (a ``TransportError`` that
  those loops do not retry) while :func:`our_policy` is active, which ``hubio.call`` sets
  around every call, and for an unreachable host always.
- Failures: :func:`unreachable` is a host that does not resolve or refuses connections (no
  network, a mistyped ``HF_ENDPOINT``): retrying cannot help, so it is never retried;
  :func:`timed_out` is a host that did not answer in time (retried, then reported with
  :func:`timeout_advice`).
- Credentials: :func:`keeps_token` is huggingface_hub's own rule for its downloads
  (``file_download._get_metadata_or_catch_error`` drops ``authorization`` unless
  ``_is_same_or_hub_host``): the token goes to the hub's own origin and the known Hub origins,
  never to a CDN or any other host a redirect names (LFS CDN URLs are signed, they need none).

:func:`install` is the one place that reaches into huggingface_hub's internals: it wraps the
client factory that is current (``utils._http._GLOBAL_CLIENT_FACTORY``, so a factory the user
set, e.g. for a proxy, is kept) and the client's transport (``Client._transport``); the tests
of timeouts fail if either moves.
"""

from __future__ import annotations

import contextvars
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlparse

import httpx2
from huggingface_hub import constants, set_client_factory
from huggingface_hub.utils import _http as hf_http

#: origins that get the token besides the one asked (huggingface_hub 2.4's ``_HUB_ORIGINS``)
HUB_ORIGINS = ("https://huggingface.co", "https://hub-ci.huggingface.co", "https://hf.co")
_DEFAULT_PORTS = {"http": 80, "https": 443}
_KINDS = ("connect", "read", "write", "pool")
_RETRIED_INSIDE = (httpx2.TimeoutException, httpx2.NetworkError, httpx2.RemoteProtocolError)
_OUR_POLICY = contextvars.ContextVar("pythia_probe_hub_policy", default=False)
_INSTALL_LOCK = threading.Lock()


class PolicyError(httpx2.TransportError):
    """A transport failure handed straight to the caller's retry policy (``__cause__``: the
    original error)."""


def timeouts() -> dict[str, float]:
    """Seconds per phase of a request, read now (tests and users may change the constants)."""
    connect, read = float(constants.HF_HUB_ETAG_TIMEOUT), float(constants.HF_HUB_DOWNLOAD_TIMEOUT)
    return {"connect": connect, "read": read, "write": read, "pool": read}


def _bound_timeouts(request: httpx2.Request) -> None:
    """Request hook: a timeout for every phase the caller left unbounded."""
    have = request.extensions.get("timeout") or {}
    limits = timeouts()
    if any(have.get(k) is None for k in _KINDS):
        bounded = {k: have[k] if have.get(k) is not None else limits[k] for k in _KINDS}
        request.extensions = {**request.extensions, "timeout": bounded}


class _OnePolicy(httpx2.BaseTransport):
    """The client's transport, with failures turned into :class:`PolicyError` where
    huggingface_hub's own retry loops must not retry them."""

    def __init__(self, inner: httpx2.BaseTransport):
        self.inner = inner

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        try:
            return self.inner.handle_request(request)
        except _RETRIED_INSIDE as err:
            if _OUR_POLICY.get() or unreachable(err):
                raise PolicyError(str(err), request=request) from err
            raise

    def close(self) -> None:
        self.inner.close()


def _bounded_factory(base):
    def factory() -> httpx2.Client:
        client = base()
        hooks = client.event_hooks
        client.event_hooks = {**hooks, "request": [*hooks.get("request", []), _bound_timeouts]}
        client._transport = _OnePolicy(client._transport)
        return client

    factory.pythia_probe = True
    return factory


def install() -> None:
    """Make huggingface_hub's shared client bounded (a no-op when it already is)."""
    if getattr(hf_http._GLOBAL_CLIENT_FACTORY, "pythia_probe", False):
        return
    with _INSTALL_LOCK:
        current = hf_http._GLOBAL_CLIENT_FACTORY
        if not getattr(current, "pythia_probe", False):
            set_client_factory(_bounded_factory(current))


@contextmanager
def our_policy() -> Iterator[None]:
    """Within the block (this thread), transport failures go straight to the caller's retry
    policy instead of huggingface_hub's inner retry loops."""
    install()
    token = _OUR_POLICY.set(True)
    try:
        yield
    finally:
        _OUR_POLICY.reset(token)


# ---- failures ----------------------------------------------------------------------------------
def _chain(err: BaseException):
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__


def original(err: BaseException) -> BaseException:
    """The error a :class:`PolicyError` stands for (any other error: itself)."""
    return err.__cause__ if isinstance(err, PolicyError) and err.__cause__ else err


def unreachable(err: BaseException) -> str | None:
    """Why the host cannot be reached at all ("name resolution failed", "connection refused"),
    or None when it can (or the failure is something else)."""
    for e in _chain(err):
        if isinstance(e, socket.gaierror):
            return f"name resolution failed: {e.strerror or e}"
        if isinstance(e, ConnectionRefusedError):
            return "connection refused"
    return None


def timed_out(err: BaseException) -> bool:
    return any(isinstance(e, (httpx2.TimeoutException, TimeoutError)) for e in _chain(err))


def host_of(err: BaseException, default: str) -> str:
    """``host[:port]`` of the request that failed (``default`` when the error has none)."""
    for e in _chain(err):
        try:
            request = e.request if isinstance(e, httpx2.RequestError) else None
        except RuntimeError:  # an httpx error raised without its request
            request = None
        if request is not None:
            return request.url.netloc.decode("ascii")
        response = getattr(e, "response", None)
        if response is not None and getattr(response, "request", None) is not None:
            return response.request.url.netloc.decode("ascii")
    return default


def timeout_advice(err: BaseException, host: str) -> str:
    """What a timeout means and what to do, in words."""
    t = timeouts()
    if any(isinstance(e, httpx2.ConnectTimeout) for e in _chain(err)):
        what = (f"{host} did not accept a connection within {t['connect']:g} s "
                "(HF_HUB_ETAG_TIMEOUT)")
    else:
        what = (f"{host} accepted the connection but sent nothing for {t['read']:g} s "
                "(HF_HUB_DOWNLOAD_TIMEOUT)")
    return (f"{what}; check the network, HF_ENDPOINT and any proxy, raise the timeout if the "
            "link is just slow, or work offline (HF_HUB_OFFLINE=1 with a populated cache)")


# ---- credentials -------------------------------------------------------------------------------
def origin(url: str) -> tuple[str, str, int]:
    """``(scheme, host, port)`` of a URL, the scheme's default port filled in."""
    p = urlparse(url)
    return p.scheme, (p.hostname or "").lower(), p.port or _DEFAULT_PORTS.get(p.scheme, 0)


def keeps_token(url: str, target: str) -> bool:
    """Whether a request to ``target``, reached from the hub URL ``url``, may carry the token:
    the same origin as ``url``, or a known Hub origin (including ``HF_ENDPOINT``)."""
    hubs = {origin(u) for u in (*HUB_ORIGINS, constants.ENDPOINT)}
    return origin(target) in {origin(url), *hubs}


def without_token(headers: dict) -> dict:
    """``headers`` with any Authorization header removed (whatever its case)."""
    return {k: v for k, v in headers.items() if k.lower() != "authorization"}
