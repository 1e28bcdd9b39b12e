"""Hub I/O: names checked before they touch the disk, one retry policy for every hub call, and
the one place that moves file bytes from the hub to disk.

- Names: :func:`check_sha256` (64 hex), :func:`check_oid` (40 hex: git blob ids and commits),
  :func:`check_name` (one path component: no separator, no ``..``), :func:`check_repo_path`
  (components checked one by one). A name that fails raises
  :class:`~pythia_probe.errors.UnsafeFileError` naming where it came from.
- Retries: :class:`RetryPolicy` and :func:`call`, used for every hub request (refs, tree,
  paths-info, HEAD, GET, dataset listings), each with a connect and read timeout
  (:mod:`pythia_probe.hub.net`). Transient failures (HTTP 408/429/5xx, dropped connections,
  timeouts, short bodies) are retried with exponential backoff (``Retry-After`` honoured up to
  ``max_delay``); bytes that do not match the announced hash are fetched once more, then
  reported; a host that does not resolve or refuses connections is reported at once with what
  to do offline (:class:`~pythia_probe.errors.HubUnreachableError`); anything else becomes a
  one-line user error at once. The errors live in :mod:`pythia_probe.errors`.
- Bytes: :func:`download` appends the missing bytes of a file to ``<dest>.partial`` with an HTTP
  Range request, hashing while it writes (sha256 for LFS files, the git blob id for small ones),
  stops reading at the size the hub listed, and raises :class:`~pythia_probe.errors.ChecksumError`
  (deleting the partial) when the body is longer or the result does not match. The partial's
  name is built from the validated hash, so it survives the process and a run killed mid-file
  resumes from the bytes on disk. The access token goes to the hub's own host only.

Why not ``hf_hub_download`` for the bytes: it names the cache blob after the server's ``ETag``
header, and ``.no_exist/`` entries after ``X-Repo-Commit``, without checking them, so a broken
or malicious ``HF_ENDPOINT`` could make it write outside the cache; and its temporary files are
unique per process, so a killed download starts again from zero. This module is the one
documented place that goes further than huggingface_hub's public API; it still uses that API
for everything it can (``get_hf_file_metadata`` for the HEAD that finds the CDN location,
``get_session``, ``hf_raise_for_status``, ``build_hf_headers``, ``constants``).
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx2
from huggingface_hub import constants, get_hf_file_metadata, get_session, hf_hub_url
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import build_hf_headers, hf_raise_for_status

from pythia_probe.errors import (
    ChecksumError,
    HubDownloadError,
    HubError,
    HubNotFoundError,
    HubUnreachableError,
    IncompleteDownloadError,
    MissingFileError,
    UnsafeFileError,
    UserError,
)
from pythia_probe.fileio import disk_full_error, is_disk_full, remove
from pythia_probe.hub import net as hubnet

RETRY_STATUS = (408, 429, 500, 502, 503, 504)
PARTIAL_SUFFIX = ".partial"
CHUNK = 1 << 20
_SHA256 = re.compile(r"[0-9a-f]{64}")
_OID = re.compile(r"[0-9a-f]{40}")


# ---- names from the hub ------------------------------------------------------------------------
def _unsafe(value: object, what: str, want: str) -> UnsafeFileError:
    return UnsafeFileError(f"{what} is {value!r}, not {want}; refusing to use it as a file name "
                           "(is HF_ENDPOINT a trustworthy hub?)")


def check_sha256(value: object, what: str) -> str:
    """``value`` if it is a lowercase hex sha256 (64 digits), else :class:`UnsafeFileError`."""
    if not isinstance(value, str) or not _SHA256.fullmatch(value):
        raise _unsafe(value, what, "a sha256 (64 hex digits)")
    return value


def check_oid(value: object, what: str) -> str:
    """``value`` if it is a git object id (40 hex digits: blob ids, commits)."""
    if not isinstance(value, str) or not _OID.fullmatch(value):
        raise _unsafe(value, what, "a git object id (40 hex digits)")
    return value


def check_name(value: object, what: str) -> str:
    """``value`` if it is one plain path component (no separator, not ``.``/``..``, no NUL)."""
    if (not isinstance(value, str) or not value or value in (".", "..") or "/" in value
            or "\\" in value or "\0" in value or value != value.strip()):
        raise _unsafe(value, what, "a plain file name")
    return value


def check_repo_path(value: object, what: str) -> str:
    """``value`` if it is a relative "/"-separated path whose every component is a plain name."""
    if not isinstance(value, str) or not value:
        raise _unsafe(value, what, "a relative path inside the repository")
    for part in value.split("/"):
        check_name(part, what)
    return value


# ---- retries -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff: ``base_delay * 2**k`` capped at ``max_delay``, ``attempts`` tries."""

    attempts: int = 5
    base_delay: float = 1.0
    max_delay: float = 30.0

    def __post_init__(self):
        if self.attempts < 1 or self.base_delay < 0 or self.max_delay < 0:
            raise ValueError(f"RetryPolicy needs attempts >= 1 and delays >= 0, got {self}")

    def delay(self, attempt: int, err: BaseException | None = None) -> float:
        """Seconds to wait after failed try ``attempt`` (0-based); a ``Retry-After`` header
        lengthens it (never beyond ``max_delay``)."""
        wait = min(self.max_delay, self.base_delay * 2**attempt)
        after = _retry_after(err)
        return max(wait, min(after, self.max_delay)) if after is not None else wait


DEFAULT_RETRY = RetryPolicy()


def _retry_after(err: BaseException | None) -> float | None:
    response = getattr(err, "response", None)
    value = response.headers.get("Retry-After") if response is not None else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def status_of(err: BaseException) -> int | None:
    response = getattr(err, "response", None)
    return getattr(response, "status_code", None)


def is_transient(err: BaseException) -> bool:
    """A failure worth another try: HTTP 408/429/5xx, a dropped connection, a timeout, a short
    body. A host that does not resolve or refuses connections is not: it will not appear."""
    if isinstance(err, HfHubHTTPError):
        return status_of(err) in RETRY_STATUS
    if isinstance(err, UserError):
        return isinstance(err, IncompleteDownloadError)
    if hubnet.unreachable(err):
        return False
    return isinstance(err, (httpx2.TransportError, ConnectionError, TimeoutError))


def one_line(err: BaseException, limit: int = 300) -> str:
    """``Type: message`` on one line (hub errors carry request ids and blank lines)."""
    err = hubnet.original(err)
    text = " ".join(str(err).split())
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    return f"{type(err).__name__}: {text}"


def offline_hint(repo: str = "REPO", revision: str = "REV") -> str:
    """What to do when the hub cannot be reached at all."""
    return ("no network? HF_HUB_OFFLINE=1 uses what is already cached (the tool's own cache, "
            "or an existing Hugging Face cache given with --cache-dir); fill a cache where the "
            f"network works with `hf download {repo} --revision {revision} --cache-dir DIR`, "
            "or give local files (a folder of step*/ checkpoints); check HF_ENDPOINT if it is set")


def _host() -> str:
    return hubnet.origin(endpoint())[1] or endpoint()


def _why(err: BaseException) -> str:
    """The error on one line, with what to do when it is a timeout."""
    if hubnet.timed_out(err):
        return f"{one_line(err)}: {hubnet.timeout_advice(err, hubnet.host_of(err, _host()))}"
    return one_line(err)


def user_error(err: BaseException, what: str, fail: type[HubError] = HubDownloadError,
               missing: type[MissingFileError] = HubNotFoundError,
               hint: str | None = None) -> BaseException:
    """The one-line user error for a hub failure that retrying will not fix (or ``err`` itself
    when it is not a hub failure: a bug keeps its traceback)."""
    if isinstance(err, UserError):
        return err
    if isinstance(err, (RepositoryNotFoundError, RevisionNotFoundError, EntryNotFoundError)) \
            and not isinstance(err, GatedRepoError):
        return missing(f"{what}: not found on the hub ({one_line(err)}); check the id, the "
                       "revision and HF_ENDPOINT")
    if isinstance(err, OfflineModeIsEnabled):
        return fail(f"{what}: HF_HUB_OFFLINE is set, so the hub is not asked; unset it or use "
                    "files already in the cache")
    if isinstance(err, HfHubHTTPError):
        todo = "check the access token" if status_of(err) in (401, 403) else "retry later"
        return fail(f"{what}: the hub refused it ({one_line(err)}); {todo}")
    why = hubnet.unreachable(err)
    if why:
        return HubUnreachableError(f"{what}: cannot reach {hubnet.host_of(err, _host())} "
                                   f"({why}); {hint or offline_hint()}")
    if isinstance(err, httpx2.TooManyRedirects):
        return fail(f"{what}: the hub's redirects never end ({one_line(err)}); check "
                    "HF_ENDPOINT and any proxy")
    if is_transient(err) or isinstance(err, httpx2.HTTPError):
        return fail(f"{what}: {_why(err)}")
    return err


def call(fn: Callable, what: str, policy: RetryPolicy | None = None,
         fail: type[HubError] = HubDownloadError,
         missing: type[MissingFileError] = HubNotFoundError, hint: str | None = None):
    """``fn()`` under the retry policy, every request with a timeout and no retry loop of
    huggingface_hub's inside it (:func:`~pythia_probe.hub.net.our_policy`). Transient errors
    are retried ``policy.attempts`` times in all; a :class:`ChecksumError` is retried once (a second
    mismatch is reported as is); other hub errors become one-line user errors naming ``what``
    at once (``hint``: what to do when the hub cannot be reached)."""
    policy = policy or DEFAULT_RETRY
    last: BaseException | None = None
    mismatches = 0
    for attempt in range(policy.attempts):
        try:
            with hubnet.our_policy():
                return fn()
        except ChecksumError as err:
            mismatches += 1
            if mismatches > 1:
                raise
            last = err
        except Exception as err:  # noqa: BLE001 - classified here
            if not is_transient(err):
                raise user_error(err, what, fail, missing, hint) from err
            last = err
            if attempt + 1 < policy.attempts:
                time.sleep(policy.delay(attempt, err))
    if isinstance(last, ChecksumError):
        raise last
    raise fail(f"{what} failed: the hub kept failing after {policy.attempts} attempts; last "
               f"error: {_why(last)}") from last


# ---- bytes -------------------------------------------------------------------------------------
def partial_path(dest: Path) -> Path:
    """Where the bytes of ``dest`` accumulate until they are complete and verified."""
    return dest.with_name(dest.name + PARTIAL_SUFFIX)


def new_hasher(size: int, sha256: str | None):
    """sha256 for LFS files; else the git blob id: sha1 of ``blob <size>\\0`` + bytes."""
    if sha256 is not None:
        return hashlib.sha256()
    h = hashlib.sha1()
    h.update(b"blob %d\0" % size)
    return h


def _hash_existing(part: Path, hasher) -> int:
    have = 0
    with open(part, "rb") as fh:
        while chunk := fh.read(CHUNK):
            hasher.update(chunk)
            have += len(chunk)
    return have


@dataclass(frozen=True)
class Remote:
    """One file on the hub: its resolve URL, size, and hash (sha256 or git blob id)."""

    url: str
    name: str  # for messages: "config.json of org/model@step2"
    size: int
    sha256: str | None
    git_oid: str | None

    @property
    def digest(self) -> str | None:
        return self.sha256 or self.git_oid


class _TooLong(Exception):
    """A body that goes past the listed size (``at``: the bytes it announced or reached)."""

    def __init__(self, at: int):
        super().__init__(at)
        self.at = at


def download(remote: Remote, dest: Path, owned: list[Path],
             token: str | bool | None = None) -> Path:
    """Fetch ``remote`` into ``dest.partial`` (resuming the bytes already there), check its hash
    and return the partial's path; the caller renames it into place. Reading stops at the
    listed size: a longer body (announced or sent) is cut off there. The partial is deleted
    (through :func:`~pythia_probe.fileio.remove`, inside ``owned``) when the bytes are wrong,
    raising :class:`ChecksumError`. The token goes to the hub's own host only
    (:func:`~pythia_probe.hub.net.keeps_token`), never to a CDN a redirect names."""
    hubnet.install()
    part = partial_path(dest)
    part.parent.mkdir(parents=True, exist_ok=True)
    if part.exists() and part.stat().st_size > remote.size:
        remove(part, owned)
    hasher = new_hasher(remote.size, remote.sha256)
    have = _hash_existing(part, hasher) if part.exists() else 0
    if have < remote.size or not part.exists():
        location = get_hf_file_metadata(remote.url, token=token,
                                        timeout=httpx2.Timeout(**hubnet.timeouts())).location
        headers = {**build_hf_headers(token=token), "Accept-Encoding": "identity"}
        if not hubnet.keeps_token(remote.url, location):
            headers = hubnet.without_token(headers)
        try:
            have, hasher = _append(location, part, have, hasher, remote, headers)
        except _TooLong as err:
            remove(part, owned)
            raise ChecksumError(f"{remote.name}: the server sent more than the {remote.size} "
                                f"bytes the hub lists ({err.at} or more); cut off there, the "
                                "partial download was deleted") from None
    if have < remote.size:
        raise IncompleteDownloadError(f"{remote.name}: got {have} of {remote.size} bytes")
    if have > remote.size or (remote.digest and hasher.hexdigest() != remote.digest):
        remove(part, owned)
        raise ChecksumError(f"{remote.name}: the downloaded bytes do not match the hub's "
                            f"{'sha256' if remote.sha256 else 'git blob id'} {remote.digest} "
                            f"({have} bytes, the hub announced {remote.size}); the partial "
                            "download was deleted")
    return part


def _append(url: str, part: Path, have: int, hasher, remote: Remote, headers: dict):
    """GET ``url`` from byte ``have`` on, appending to ``part``: ``(bytes now there, hasher)``."""
    if have:
        headers = {**headers, "Range": f"bytes={have}-"}
    with get_session().stream("GET", url, headers=headers, follow_redirects=True,
                                         timeout=httpx2.Timeout(**hubnet.timeouts())) as response:
        hf_raise_for_status(response)
        mode = "ab"
        if have and response.status_code == 200:  # the server ignored Range: start again
            mode, have, hasher = "wb", 0, new_hasher(remote.size, remote.sha256)
        length = response.headers.get("Content-Length", "")
        if length.isdigit() and have + int(length) > remote.size:
            raise _TooLong(have + int(length))  # announced: not one byte is read
        return _write_body(response, part, mode, have, hasher, remote.size), hasher


def _write_body(response, part: Path, mode: str, have: int, hasher, limit: int) -> int:
    try:
        with open(part, mode) as fh:
            for chunk in response.iter_bytes():  # as read from the socket (<= 64 KiB each)
                if have + len(chunk) > limit:
                    raise _TooLong(have + len(chunk))
                fh.write(chunk)
                hasher.update(chunk)
                have += len(chunk)
    except OSError as err:
        if is_disk_full(err, part.parent):
            raise disk_full_error(part, None) from err
        raise
    return have


def served_etag(url: str, token: str | bool | None = None) -> str | None:
    """What the hub says it serves at a resolve ``url``, from a HEAD (no byte of the file is
    read): ``X-Linked-Etag`` (an LFS file's sha256), else ``ETag`` (a small file's git blob
    id)."""
    return get_hf_file_metadata(url, token=token,
                                timeout=httpx2.Timeout(**hubnet.timeouts())).etag


def resolve_url(endpoint: str, repo_id: str, revision: str, path: str,
                repo_type: str = "model") -> str:
    """The hub's resolve URL of a file (``hf_hub_url`` with an explicit endpoint)."""

    return hf_hub_url(repo_id, path, revision=revision, repo_type=repo_type, endpoint=endpoint)


def endpoint() -> str:
    """The hub to talk to: ``HF_ENDPOINT`` (read now, not at import), else huggingface_hub's."""
    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def offline() -> bool:
    """huggingface_hub's own answer (``HF_HUB_OFFLINE``)."""
    return constants.is_offline_mode()


def tool_cache(kind: str) -> Path:
    """The tool's own cache folder for ``kind`` ("checkpoints", "datasets"):
    ``$PYTHIA_PROBE_CACHE/<kind>``, else ``<HF_HOME>/pythia_probe/<kind>`` (beside, never inside,
    the Hugging Face hub cache: nothing there is touched)."""
    root = os.environ.get("PYTHIA_PROBE_CACHE") or os.path.join(constants.HF_HOME, "pythia_probe")
    return Path(root).expanduser() / kind
