"""Claim files: one per (model, step) task, so two machines never score the same task at once.

A sweep split over machines (``--shard i/N``, a Slurm array, ranks across nodes) writes into one
shared folder. Before a process scores a task it creates ``OUT/claims/[<model>/]step{N}.json``
atomically (:func:`pythia_probe.fileio.create_exclusive`: the whole file appears at once, or the
create fails because another process holds the claim), holding who claims it (host, pid, run,
time, and the tool's mark :data:`TOOL`), and only then looks whether the task's shard is there
(:mod:`.tasks`): a task is scored only by the holder of its claim, and never once its shard
exists, so two workers on one share never score a task twice. While it works, a heartbeat
thread touches every claim it holds; when the task's shard is written (or its failure
recorded) the claim is removed.

A claim whose holder is gone is stale and taken over: on the same host when its process no
longer exists, anywhere when its heartbeat is older than :data:`STALE_AFTER` seconds (a killed
machine). A file that cannot be read as a claim (garbage, empty, a JSON list, a folder) is
named as such and judged by its age alone. Taking over renames the stale file away first (only
one process can), checks it renamed the claim it judged stale (else puts it back), then creates
its own. The renamed file is deleted only when it is provably a claim of this run (through
:func:`pythia_probe.fileio.remove` with :func:`proof`); anything else is kept beside, named in
a warning. A claim of a live holder is left alone and its task skipped: the holder's shard will
appear.

:func:`one_builder`: shards of one run started together (a Slurm array) that find their
statistics missing build them once: the first holds a lock beside the file while it builds,
the others wait for it and then read the file.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from pythia_probe.errors import FolderLockedError
from pythia_probe.fileio import FolderLock, create_exclusive, empty_only, pid_alive, remove, touch
from pythia_probe.ranks import Ranks

log = logging.getLogger(__name__)

POLL = 2.0  # seconds between looks at a build lock held by another process
HEARTBEAT = 15.0  # seconds between touches of the claims a process holds
STALE_AFTER = 120.0  # a claim untouched this long belongs to a dead holder


TOOL = "pythia_probe claim"  # in every claim: what tells the tool's claims from other files


def read_claim(path: Path) -> dict | str | None:
    """The claim at ``path`` (a dict), why it is none (a file that cannot be read as one of the
    tool's claims, in words), or None when nothing is there."""
    try:
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as fh:
            data = fh.read(1 << 20)
    except FileNotFoundError:
        return None
    except OSError as err:
        return ("a symbolic link" if err.errno == errno.ELOOP else "a folder"
                if err.errno == errno.EISDIR else f"unreadable ({err.strerror})")
    seen = _parse(data)
    if isinstance(seen, dict) and seen.get("tool") == TOOL:
        return seen
    return ("empty" if not data.strip() else "not JSON" if seen is None else
            f"a JSON {type(seen).__name__}, not a claim of this tool")


def _parse(data: bytes):
    try:
        return json.loads(data)
    except ValueError:
        return None


def proof(name: str, **want) -> Callable[[bytes], bool]:
    """Whether some bytes are this tool's claim ``name`` holding ``want`` (e.g. its token, its
    run): what :func:`~pythia_probe.fileio.remove` asks before deleting a claim."""
    def ours(data: bytes) -> bool:
        seen = _parse(data)
        return (isinstance(seen, dict) and seen.get("tool") == TOOL and seen.get("claim") == name
                and all(seen.get(k) == v for k, v in want.items()))
    return ours


class Claims:
    """The claims one process holds (``with Claims(root, run_id):``, heartbeat while inside)."""

    def __init__(self, root: str | os.PathLike, run_id: str | None = None) -> None:
        self.root = Path(root)
        self.me = {"tool": TOOL, "host": socket.gethostname(), "pid": os.getpid(),
                   "run_id": run_id, "token": uuid.uuid4().hex}
        self.held: set[Path] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- one claim -------------------------------------------------------------------------
    def take(self, path: str | os.PathLike) -> bool:
        """Claim ``path`` (True), or leave it to its live holder (False); a stale claim is
        taken over."""
        path = Path(path)
        body = json.dumps({**self.me, "since": time.time(), "claim": path.name}).encode()
        for _ in range(3):
            if create_exclusive(path, body):
                with self._lock:
                    self.held.add(path)
                return True
            seen = read_claim(path)
            if seen is None:
                continue  # released in between: try again
            if not self.stale(path, seen):
                return False
            self._discard_stale(path, seen)
        return False

    def clear_stale(self, path: str | os.PathLike) -> None:
        """Remove the claim of a dead holder on a task that is done (it died after writing
        the shard, before removing its claim)."""
        path = Path(path)
        seen = read_claim(path)
        if seen is not None and self.stale(path, seen):
            self._discard_stale(path, seen)

    def release(self, path: str | os.PathLike) -> None:
        """Remove a claim this process holds (only if the file there is still its own)."""
        path = Path(path)
        with self._lock:
            held = path in self.held
            self.held.discard(path)
        if held:
            remove(path, [self.root], proof(path.name, token=self.me["token"]))

    def release_all(self) -> None:
        for path in sorted(self.held):
            self.release(path)

    def holder(self, path: str | os.PathLike) -> str:
        """Who holds ``path``, in words (for the log)."""
        seen = read_claim(Path(path))
        if isinstance(seen, dict):
            return f"pid {seen.get('pid', '?')} on {seen.get('host', '?')}"
        if seen is None:
            return "a holder that released it just now"
        return (f"a claim file that cannot be read, {path} ({seen}); taken over once untouched "
                f"for {STALE_AFTER:.0f} s")

    # ---- staleness -------------------------------------------------------------------------
    def stale(self, path: Path, seen: dict | str) -> bool:
        """A dead holder's claim: its process gone (same host), or its heartbeat too old; a
        file that cannot be read as a claim is judged by its age alone."""
        try:
            age = time.time() - path.stat(follow_symlinks=False).st_mtime
        except FileNotFoundError:
            return True
        if age > STALE_AFTER:
            return True
        if isinstance(seen, dict) and seen.get("host") == self.me["host"]:
            pid = seen.get("pid")
            return not isinstance(pid, int) or not pid_alive(pid)
        return False

    def live(self, path: str | os.PathLike) -> bool:
        """``path`` is a claim of this tool whose holder is alive (not released, not stale); a
        file that cannot be read as a claim is no live holder to wait for (claims are written
        whole), only left to its age."""
        seen = read_claim(Path(path))
        return isinstance(seen, dict) and not self.stale(Path(path), seen)

    def _discard_stale(self, path: Path, seen: dict | str) -> None:
        """Move the stale claim away (one process wins the rename); put back a claim that is
        not the one judged stale (a fresh one created in between). A claim of this run is then
        deleted; anything else (a file the tool cannot prove it wrote) stays, set aside."""
        tomb = path.with_name(f".{path.name}.{self.me['token']}.stale")
        try:
            os.rename(path, tomb)
        except FileNotFoundError:
            return
        moved = read_claim(tomb)
        if isinstance(moved, dict) and moved.get("token") != (
                seen.get("token") if isinstance(seen, dict) else None):
            try:
                os.link(tomb, path)
            except FileExistsError:
                pass
        who = (f"pid {seen.get('pid')} on {seen.get('host')}" if isinstance(seen, dict) else
               seen)
        if isinstance(moved, dict) and remove(tomb, [self.root],
                                              proof(path.name, run_id=self.me["run_id"])):
            log.info("took over the stale claim %s (%s)", path, who)
        else:
            log.warning("took over %s, untouched for over %.0f s (%s): kept as %s, since this "
                        "run cannot prove it wrote it; delete it if it is not needed", path,
                        STALE_AFTER, who, tomb)

    # ---- heartbeat -------------------------------------------------------------------------
    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT):
            with self._lock:
                held = list(self.held)
            for path in held:
                touch(path)

    def __enter__(self) -> Claims:
        self._thread = threading.Thread(target=self._beat, name="claims-heartbeat",
                                        daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.release_all()


# ---- one builder of a shared file ---------------------------------------------------------------
def clear_claims(folders, out: str) -> None:
    """The claims folders of a complete run, removed: no claim can come any more."""
    for folder in folders:
        remove(folder, [out], empty_only)


class _BuildLock(FolderLock):
    def __init__(self, target: Path, holder: dict) -> None:
        super().__init__(target.parent, holder)
        self.NAME = f".{target.name}.build.lock"


@contextlib.contextmanager
def one_builder(target: str | os.PathLike, ranks: Ranks, what: str) -> Iterator[None]:
    """Inside, this launch is the only one building ``target`` (a file every shard of a run
    needs): rank 0 waits for the lock beside it (``flock``, so a dead builder's is taken over),
    then every rank goes on together (the file may exist by then: built by the one waited
    for). The other ranks wait at a barrier meanwhile (up to the process group's timeout)."""
    lock = _BuildLock(Path(target), {"what": what[:300]})
    if ranks.is_main:
        said = False
        while True:
            try:
                lock.acquire()
                break
            except FolderLockedError as err:
                if not said:
                    log.warning("waiting for another process building %s (%s)", target, err)
                    said = True
                time.sleep(POLL)
    ranks.barrier()
    try:
        yield  # (the build ends with a barrier of its own: rank 0 has written the file)
    finally:
        lock.release()
