"""The one place that writes and deletes the tool's files.

- :func:`atomic_write`: a unique temp file beside the target (so two processes never share one),
  created with the user's umask (like every other tool's output), then ``os.replace``: a reader
  sees the old file or the new one, never half of one. A full disk raises
  :class:`~pythia_probe.errors.DiskFullError` naming the file, the free bytes and (when known)
  the bytes needed, and leaves no temp file behind.
- :func:`remove`: every delete of the tool goes through here and is refused for any path outside
  the folders the caller owns (a name from the hub that is really a path cannot escape them).
- :class:`FolderLock`: one writer per output folder (an exclusive ``flock`` on ``FOLDER/.lock``,
  released by the kernel when its process dies, so a dead holder's lock is simply taken over).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pythia_probe.errors import (
    DISK_FULL_ERRNOS,
    DiskFullError,
    FolderLockedError,
    UnsafeFileError,
)

_UMASK_LOCK = threading.Lock()


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file, read in 4 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def umask() -> int:
    """The process umask (read without changing it for longer than one call)."""
    with _UMASK_LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def free_bytes(path: str | os.PathLike) -> int:
    """Free bytes on the filesystem holding ``path`` (or its nearest existing parent)."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


def is_disk_full(err: BaseException, folder: str | os.PathLike) -> bool:
    """An OSError with ENOSPC/EDQUOT, a library's error naming one (safetensors reports "No
    space left on device (os error 28)" in its own type, after deleting its partial file), or
    any write error while the filesystem has < 64 KiB free."""
    if isinstance(err, OSError) and err.errno in DISK_FULL_ERRNOS:
        return True
    if any(f"(os error {n})" in str(err) for n in DISK_FULL_ERRNOS):
        return True
    try:
        return free_bytes(folder) < 1 << 16
    except OSError:
        return False


def disk_full_error(path: Path, nbytes: int | None) -> DiskFullError:
    need = f"; needs about {nbytes:,} bytes" if nbytes else ""
    return DiskFullError(f"disk full writing {path}: {free_bytes(path.parent):,} bytes free on "
                         f"its filesystem{need}; free space there or choose another folder")


def check_free(folder: str | os.PathLike, nbytes: int, what: str) -> None:
    """Refuse up front when ``nbytes`` will not fit on the filesystem of ``folder``."""
    free = free_bytes(folder)
    if nbytes > free:
        raise DiskFullError(f"{what} needs {nbytes / 1e9:.2f} GB on the disk of {folder}, only "
                            f"{free / 1e9:.2f} GB free; free space or choose another folder")


def atomic_write(path: str | os.PathLike, write: Callable[[Path], Any],
                 nbytes: int | None = None) -> Path:
    """Create ``path`` by calling ``write(tmp)`` on a unique temp file beside it, then rename.

    ``nbytes`` (if known) is named in the disk-full message."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~umask())  # after write: a writer may have replaced the file
        os.replace(tmp, path)
    except Exception as err:
        if is_disk_full(err, path.parent):
            tmp.unlink(missing_ok=True)
            raise disk_full_error(path, nbytes) from err
        raise
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_text(path: str | os.PathLike, text: str) -> Path:
    data = text.encode()
    return atomic_write(path, lambda tmp: tmp.write_bytes(data), len(data))


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_bytes(data), len(data))


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    return write_text(path, json.dumps(obj, indent=2, default=str) + "\n")


def _inside(path: Path, roots: Iterable[Path]) -> bool:
    real = Path(os.path.realpath(path.parent)) / path.name  # the entry itself, not its target
    return any(real != r and real.is_relative_to(r) for r in roots)


def remove(path: str | os.PathLike, owned: Iterable[str | os.PathLike]) -> None:
    """Delete a file, symlink or folder, only if it lies strictly inside one of ``owned``.

    Symlinks are removed, never followed. Missing paths are fine."""
    path = Path(path)
    roots = [Path(os.path.realpath(r)) for r in owned]
    if not _inside(path, roots):
        raise UnsafeFileError(f"refused to delete {path}: outside the folders this tool owns "
                              f"({', '.join(map(str, roots))})")
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    elif path.is_dir():
        shutil.rmtree(path, ignore_errors=True)


class FolderLock:
    """An exclusive lock on ``folder`` for as long as this object holds it (``with`` block).

    ``FOLDER/.lock`` is opened (never through a symlink) and ``flock``-ed; the holder's
    description (pid, host, what it runs) is written into it for the refusal message. The
    kernel drops the lock when the holding process exits or is killed, so a lock left by a dead
    process is simply taken over. A second holder gets :class:`FolderLockedError` naming the
    folder and the holder. Released, the file is removed (a locker that opened it just before
    checks afterwards that it holds the file now at that path, else tries again).
    """

    NAME = ".lock"

    def __init__(self, folder: str | os.PathLike, holder: dict[str, Any]) -> None:
        self.folder, self.holder, self._fd = Path(folder), dict(holder), None

    @property
    def path(self) -> Path:
        return self.folder / self.NAME

    def acquire(self) -> FolderLock:
        self.folder.mkdir(parents=True, exist_ok=True)
        for _ in range(100):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666 & ~umask())
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                held = _read_holder(fd)
                os.close(fd)
                raise FolderLockedError(f"{self.folder} is in use by another run ({held}); "
                                        "wait for it to end or choose another output "
                                        "folder") from None
            if _same_file(fd, self.path):
                break
            os.close(fd)  # the file was removed by its holder in between: lock the new one
        else:
            raise FolderLockedError(f"{self.folder}: could not take {self.NAME}")
        info = json.dumps({**self.holder, "pid": os.getpid(), "host": os.uname().nodename})
        os.ftruncate(fd, 0)
        os.pwrite(fd, info.encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            self.path.unlink(missing_ok=True)  # while still holding it
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> FolderLock:
        return self.acquire() if self._fd is None else self

    def __exit__(self, *exc) -> None:
        self.release()


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return (st.st_dev, st.st_ino) == (os.fstat(fd).st_dev, os.fstat(fd).st_ino)


def _read_holder(fd: int) -> str:
    """The holder's description from a lock file, as one phrase."""
    try:
        info = json.loads(os.pread(fd, 1 << 16, 0) or b"{}")
    except (OSError, ValueError):
        info = {}
    if not isinstance(info, dict) or "pid" not in info:
        return "holder unknown"
    what = f": {info['what']}" if info.get("what") else ""
    since = f", since {info['since']}" if info.get("since") else ""
    return f"pid {info['pid']} on {info.get('host', '?')}{since}{what}"
