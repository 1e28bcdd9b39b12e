"""What the loopback hub (:mod:`pythia_probe.testing.hub`) can do wrong on purpose.

:class:`Fault`: one injected failure, consumed in order per request. ``on`` says which requests
it hits: "data" (file bodies: resolve GETs and CDN GETs), "head" (resolve HEADs), "api"
(``/api/...``) or "any"; ``match`` is an fnmatch on the file name (data/head) or the API path.

- ``drop``: close the connection after ``after_bytes`` of the body (default half of it);
- ``500``, ``429`` (with ``Retry-After: retry_after``);
- ``slow``: send the body at ``bandwidth`` bytes/s;
- ``corrupt``: flip one byte of the body (the middle one, or ``at_byte``);
- ``oversize``: send ``extra_bytes`` more than the file holds; ``announce``: the
  ``Content-Length`` header counts them (else there is none and the connection closes at the
  end, as a hostile server may do);
- ``stall``: read the request, then send nothing for ``stall_s`` seconds (None: until the
  server stops), then close the connection;
- ``redirect``: answer 302 to ``to`` + the same path (another server, e.g. one recording the
  headers it is sent);
- ``loop``: answer 302 to the very URL asked (a redirect loop).

:class:`Tamper`: metadata that lies (``hub.tamper(field, value, match)``): every API answer and
header about matching files says ``value`` instead of the truth, as a broken or hostile
``HF_ENDPOINT`` could: ``sha256`` (LFS oid in tree / paths-info / info), ``oid`` (git blob id),
``path`` (the file's name in listings), ``size``, ``commit`` (refs' targetCommit and info sha),
``etag`` (``ETag`` / ``X-Linked-Etag`` headers), ``repo-commit`` (``X-Repo-Commit`` header);
``branch`` (fnmatch on the branch answered for) limits it to some branches, e.g. a tree listing
that gives step2's weight file step0's sha256 while its bytes and ``X-Linked-Etag`` are its own.
``HubServer.phantom_branches``: branch names the refs list but nothing else serves (404).
"""

from __future__ import annotations

from dataclasses import dataclass

FAULT_KINDS = ("drop", "500", "429", "slow", "corrupt", "oversize", "stall", "redirect", "loop")
FAULT_TARGETS = ("data", "head", "api", "any")
#: kinds answered before any body is sent (the others shape the body)
ANSWERING_KINDS = ("500", "429", "stall", "redirect", "loop")
TAMPER_FIELDS = ("sha256", "oid", "path", "size", "commit", "etag", "repo-commit")


@dataclass
class Fault:
    """One injected fault (see the module docstring for the kinds)."""

    kind: str
    match: str = "*"  # fnmatch on the file name (data/head) or the API path
    on: str = "data"
    times: int = 1  # how many requests it hits; -1 = forever
    after_bytes: int | None = None  # drop: bytes sent first (default half the body)
    retry_after: int = 0
    bandwidth: float = 1e6
    at_byte: int | None = None  # corrupt: which byte to flip (default the middle one)
    extra_bytes: int = 0  # oversize: bytes sent beyond the file
    announce: bool = True  # oversize: Content-Length includes them
    stall_s: float | None = None  # stall: seconds of silence (None: until the server stops)
    to: str | None = None  # redirect: base URL of the server redirected to

    def __post_init__(self):
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; valid: {FAULT_KINDS}")
        if self.on not in FAULT_TARGETS:
            raise ValueError(f"fault 'on' must be data, head, api or any; got {self.on!r}")
        if self.kind == "redirect" and not self.to:
            raise ValueError("a redirect fault needs to= (the base URL redirected to)")


@dataclass
class Tamper:
    """Metadata that lies: ``field`` of files matching ``match`` (fnmatch on the path; the
    commit fields ignore it) on branches matching ``branch`` is reported as ``value``."""

    field: str
    value: object
    match: str = "*"
    branch: str = "*"

    def __post_init__(self):
        if self.field not in TAMPER_FIELDS:
            raise ValueError(f"unknown tamper field {self.field!r}; valid: {TAMPER_FIELDS}")
