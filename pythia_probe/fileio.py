"""The one place that writes and deletes the tool's files.

- :func:`atomic_write`: a unique temp file beside the target (so two processes never share one),
  created with the user's umask (like every other tool's output), then ``os.replace``: a reader
  sees the old file or the new one, never half of one. A full disk raises
  :class:`~pythia_probe.errors.DiskFullError` naming the file, the free bytes and (when known)
  the bytes needed, and leaves no temp file behind.
- :func:`remove`: every delete of the tool goes through here and is refused for any path outside
  the folders the caller owns (a name from the hub that is really a path cannot escape them);
  below a results folder only files whose content proves the tool wrote them.
- :func:`check_folders`: the folders a run writes below its results folder are real folders
  there (no symlink, no other filesystem), checked before anything is written.
- :class:`FolderLock`: one writer per output folder (an exclusive ``flock`` on ``FOLDER/.lock``,
  released by the kernel when its process dies, so a dead holder's lock is simply taken over;
  shared by the cooperating holders of one key, e.g. the shards of one sweep).
- :func:`create_exclusive` (a whole file created only where none is, e.g. a claim) and
  :func:`touch` (a heartbeat).
- :func:`check_writable`: every command's output folder (or output file's folder) proven
  creatable and writable before any work, refused in one line naming the path as the user gave
  it; it creates nothing (a command that fails later on leaves nothing behind).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pythia_probe.errors import (
    DISK_FULL_ERRNOS,
    BadInputError,
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


def check_writable(path: str | os.PathLike, flag: str = "--out", is_file: bool = False) -> Path:
    """Before any work: the folder ``path`` (``is_file``: the folder of the file ``path``), or
    the nearest folder above it that exists (where the missing ones will be made), must be a
    folder where a probe file can be made (and is removed at once). Nothing else is created,
    so ranks may check one folder together and a command failing later leaves nothing. Any
    failure is one line naming ``flag`` and ``path`` as given (not a temp file's name).
    Returns the folder."""
    folder = Path(path).parent if is_file else Path(path)
    there = next(p for p in [folder, *folder.parents] if p.exists() or p.is_symlink())
    try:
        if not there.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, f"{there} is not a folder")
        fd, probe = tempfile.mkstemp(dir=there, prefix=".write-check-")
        os.close(fd)
        os.unlink(probe)  # the empty file made just above, by name, never a link's target
    except OSError as err:
        where = f"its folder {str(folder)!r}" if is_file else "that folder"
        raise BadInputError(f"{flag} {str(path)!r}: cannot create or write {where} "
                            f"({err.strerror or err}); choose a folder you can write") from err
    return folder


def write_text(path: str | os.PathLike, text: str) -> Path:
    data = text.encode()
    return atomic_write(path, lambda tmp: tmp.write_bytes(data), len(data))


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_bytes(data), len(data))


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    return write_text(path, json.dumps(obj, indent=2, default=str) + "\n")


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host (another user's process counts as alive): how
    a lock or claim of a dead holder is told apart from a live one."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _inside(path: Path, roots: Iterable[Path]) -> bool:
    real = Path(os.path.realpath(path.parent)) / path.name  # the entry itself, not its target
    return any(real != r and real.is_relative_to(r) for r in roots)


def empty_only(data: bytes) -> bool:
    """The proof of :func:`remove` that accepts no file: only empty folders go."""
    return False


def remove(path: str | os.PathLike, owned: Iterable[str | os.PathLike],
           proof: Callable[[bytes], bool] | None = None) -> bool:
    """Delete a file, symlink or folder, only if it lies strictly inside one of ``owned``;
    True if it is gone. Symlinks are removed, never followed. Missing paths are fine.

    ``proof`` (for folders a user can reach, e.g. below a sweep's ``--out``): a file goes only
    when ``proof(its bytes)`` shows the tool wrote it (a claim it can parse, of its run), a
    folder only when empty, a symlink or anything else never; what is left returns False.
    Without it (caches whose ownership is recorded apart) files and whole folders go."""
    path = Path(path)
    roots = [Path(os.path.realpath(r)) for r in owned]
    if not _inside(path, roots):
        raise UnsafeFileError(f"refused to delete {path}: outside the folders this tool owns "
                              f"({', '.join(map(str, roots))})")
    if proof is not None:
        return _remove_proven(path, proof)
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    elif path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    return True


def _remove_proven(path: Path, proof: Callable[[bytes], bool]) -> bool:
    try:
        st = os.lstat(path)
        if stat.S_ISDIR(st.st_mode):
            os.rmdir(path)  # only an empty one
            return True
        if not stat.S_ISREG(st.st_mode) or st.st_size > 1 << 20:
            return False
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as fh:
            if not proof(fh.read()):
                return False
        path.unlink()
    except FileNotFoundError:
        return True
    except OSError:  # a folder not empty, a file replaced in between: left as it is
        return False
    return True


def with_subfolders(folder: str | os.PathLike) -> list[Path]:
    """``folder`` and the folders (or links to one) already in it."""
    folder = Path(folder)
    return [folder, *sorted(p for p in folder.iterdir() if p.is_dir())] if folder.is_dir() \
        else [folder]


def check_folders(root: str | os.PathLike, folders: Iterable[str | os.PathLike]) -> None:
    """Refuse, before anything is written, a folder below ``root`` the tool will write into or
    delete from when any existing part of it below ``root`` is a symlink, not a folder, or on
    another filesystem (a mount): one line naming the path. ``root`` itself may be a link;
    folders elsewhere are the user's choice and not checked."""
    root = Path(root)
    if not root.is_dir():
        return
    dev = os.stat(root).st_dev
    for folder in (Path(f) for f in folders if Path(f).is_relative_to(root)):
        path = root
        for part in folder.relative_to(root).parts:
            path = path / part
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                break
            why = (f"a symbolic link to {os.readlink(path)}" if stat.S_ISLNK(st.st_mode) else
                   "not a folder" if not stat.S_ISDIR(st.st_mode) else
                   "on another filesystem (a mount)" if st.st_dev != dev else None)
            if why:
                raise UnsafeFileError(f"{path} is {why}: the tool writes and deletes only in "
                                      f"real folders inside {root}; make it a plain folder or "
                                      "choose another --out")


class FolderLock:
    """A lock on ``folder`` for as long as this object holds it (``with`` block).

    ``FOLDER/.lock`` is opened (never through a symlink) and ``flock``-ed; the holder's
    description (pid, host, what it runs) is written into it for the refusal message. The
    kernel drops the lock when the holding process exits or is killed, so a lock left by a dead
    process is simply taken over. A second holder gets :class:`FolderLockedError` naming the
    folder and the holder. Released, the file is removed (a locker that opened it just before
    checks afterwards that it holds the file now at that path, else tries again).

    ``key``: holders that cooperate (the shards of one run, on one machine or several sharing
    the folder) share the lock. The first writes its description with the key and holds the
    lock shared; one with the same key joins (:attr:`info` is then the first one's description,
    e.g. the run id it chose); one with another key, or with none, is refused while any of them
    holds it. The last to release removes the file.
    """

    NAME = ".lock"
    WAIT = 2.0  # seconds a joiner waits while the first holder writes its description

    def __init__(self, folder: str | os.PathLike, holder: dict[str, Any],
                 key: str | None = None) -> None:
        self.folder, self.holder, self.key, self._fd = Path(folder), dict(holder), key, None
        self.info: dict[str, Any] = {}

    @property
    def path(self) -> Path:
        return self.folder / self.NAME

    def acquire(self) -> FolderLock:
        self.folder.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + self.WAIT
        for _ in range(1000):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666 & ~umask())
            state = self._take(fd)
            if state in ("first", "joined") and _same_file(fd, self.path):
                self._fd = fd
                return self
            if state in ("refused", "busy") and (state == "refused" or
                                                 time.monotonic() > deadline):
                held = _read_holder(fd)
                os.close(fd)
                raise FolderLockedError(f"{self.folder} is in use by another run ({held}); "
                                        "wait for it to end or choose another output "
                                        "folder") from None
            os.close(fd)  # removed by its holder in between, or its first holder is writing
            time.sleep(0.01 if state in ("first", "joined") else 0.05)
        raise FolderLockedError(f"{self.folder}: could not take {self.NAME}")

    def _take(self, fd: int) -> str:
        """Lock ``fd``: "first" (exclusive; shared after writing the key), "joined" (shared
        with holders of the same key), "refused" (held by another run), "busy" (held
        exclusively, maybe by a first holder still writing), "retry" (an empty file)."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return "refused" if self.key is None else self._join(fd)
        self.info = {**self.holder, "pid": os.getpid(), "host": os.uname().nodename,
                     **({} if self.key is None else {"key": self.key})}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(self.info).encode(), 0)
        if self.key is not None:
            fcntl.flock(fd, fcntl.LOCK_SH)  # others with the key may join now
        return "first"

    def _join(self, fd: int) -> str:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return "busy"
        try:
            info = json.loads(os.pread(fd, 1 << 16, 0) or b"{}")
        except (OSError, ValueError):
            info = {}
        if isinstance(info, dict) and info.get("key") == self.key:
            self.info = info
            return "joined"
        fcntl.flock(fd, fcntl.LOCK_UN)
        return "refused" if info else "retry"

    def release(self) -> None:
        if self._fd is None:
            return
        last = True
        if self.key is not None:  # shared: only the last holder removes the file
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                last = False
        if last and _same_file(self._fd, self.path):
            self.path.unlink(missing_ok=True)  # while still holding it
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> FolderLock:
        return self.acquire() if self._fd is None else self

    def __exit__(self, *exc) -> None:
        self.release()


def create_exclusive(path: str | os.PathLike, data: bytes) -> bool:
    """Create ``path`` holding ``data`` only if nothing (a file, a symlink) is there: the whole
    file appears at once (a unique temp file beside it, the user's umask, then a hard link,
    which fails when the name exists), or False. Where hard links are not supported it is
    created with ``O_EXCL`` and written in place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, 0o666 & ~umask())
        try:
            os.link(tmp, path, follow_symlinks=False)
        except FileExistsError:
            return False
        except OSError as err:
            if is_disk_full(err, path.parent):
                raise
            return _create_in_place(path, data)
        return True
    except Exception as err:
        if is_disk_full(err, path.parent):
            raise disk_full_error(path, len(data)) from err
        raise
    finally:
        tmp.unlink(missing_ok=True)


def _create_in_place(path: Path, data: bytes) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                     0o666 & ~umask())
    except FileExistsError:
        return False
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    return True


def touch(path: str | os.PathLike) -> None:
    """Set ``path``'s modification time to now (a heartbeat), never through a symlink; a
    missing file is fine."""
    try:
        os.utime(path, follow_symlinks=False)
    except FileNotFoundError:
        pass


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
