"""Claim files: one per (model, step) task, so two machines never score the same task at once.

A sweep split over machines (``--shard i/N``, a Slurm array, ranks across nodes) writes into one
shared folder. Before a process scores a task it creates ``OUT/claims/[<model>/]step{N}.json``
atomically (:func:`pythia_probe.fileio.create_exclusive`: the whole file appears at once, or the
create fails because another process holds the claim), holding who claims it (host, pid, run,
time). While it works, a heartbeat thread touches every claim it holds; when the task's shard is
written (or its failure recorded) the claim is removed.

A claim whose holder is gone is stale and taken over: on the same host when its process no
longer exists, anywhere when its heartbeat is older than :data:`STALE_AFTER` seconds (a killed
machine). Taking over renames the stale file away first (only one process can), checks it
renamed the claim it judged stale (else puts it back), then creates its own. A claim of a live
holder is left alone and its task skipped: the holder's shard will appear. In the worst race
(three processes at one stale claim) a task is scored twice, writing the same shard twice
atomically, never half of one.

:func:`one_builder`: shards of one run started together (a Slurm array) that find their
statistics missing build them once: the first holds a lock beside the file while it builds,
the others wait for it and then read the file.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from pythia_probe.errors import FolderLockedError
from pythia_probe.fileio import FolderLock, create_exclusive, pid_alive, remove, touch
from pythia_probe.ranks import Ranks

log = logging.getLogger(__name__)

POLL = 2.0  # seconds between looks at a build lock held by another process
HEARTBEAT = 15.0  # seconds between touches of the claims a process holds
STALE_AFTER = 120.0  # a claim untouched this long belongs to a dead holder


class Claims:
    """The claims one process holds (``with Claims(root, run_id):``, heartbeat while inside)."""

    def __init__(self, root: str | os.PathLike, run_id: str | None = None) -> None:
        self.root = Path(root)
        self.me = {"host": socket.gethostname(), "pid": os.getpid(), "run_id": run_id,
                   "token": uuid.uuid4().hex}
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
            seen = self._read(path)
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
        seen = self._read(path)
        if seen is not None and self.stale(path, seen):
            self._discard_stale(path, seen)

    def release(self, path: str | os.PathLike) -> None:
        """Remove a claim this process holds."""
        path = Path(path)
        with self._lock:
            held = path in self.held
            self.held.discard(path)
        if held and (self._read(path) or {}).get("token") == self.me["token"]:
            remove(path, [self.root])

    def release_all(self) -> None:
        for path in sorted(self.held):
            self.release(path)

    def holder(self, path: str | os.PathLike) -> str:
        """Who holds ``path``, in words (for the log)."""
        seen = self._read(Path(path)) or {}
        return f"pid {seen.get('pid', '?')} on {seen.get('host', '?')}"

    # ---- staleness -------------------------------------------------------------------------
    def stale(self, path: Path, seen: dict) -> bool:
        """A dead holder's claim: its process gone (same host), or its heartbeat too old."""
        try:
            age = time.time() - path.stat(follow_symlinks=False).st_mtime
        except FileNotFoundError:
            return True
        if age > STALE_AFTER:
            return True
        if seen.get("host") == self.me["host"]:
            pid = seen.get("pid")
            return not isinstance(pid, int) or not pid_alive(pid)
        return False

    def live(self, path: str | os.PathLike) -> bool:
        """``path`` is a claim whose holder is alive (not released, not stale)."""
        seen = self._read(Path(path))
        return seen is not None and not self.stale(Path(path), seen)

    def _discard_stale(self, path: Path, seen: dict) -> None:
        """Move the stale claim away (one process wins the rename); put back a claim that is
        not the one judged stale (a fresh one created in between)."""
        tomb = path.with_name(f".{path.name}.{self.me['token']}.stale")
        try:
            os.rename(path, tomb)
        except FileNotFoundError:
            return
        moved = self._read(tomb)
        if moved is not None and moved.get("token") != seen.get("token"):
            try:
                os.link(tomb, path)
            except FileExistsError:
                pass
        log.info("took over the stale claim %s of pid %s on %s", path, seen.get("pid"),
                 seen.get("host"))
        remove(tomb, [self.root])

    @staticmethod
    def _read(path: Path) -> dict | None:
        try:
            seen = json.loads(path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {}  # unreadable: judged by its age alone
        return seen if isinstance(seen, dict) else {}

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
