"""The one place that writes and deletes the tool's files.

- :func:`atomic_write`: a unique temp file beside the target (so two processes never share one),
  created with the user's umask (like every other tool's output), then ``os.replace``: a reader
  sees the old file or the new one, never half of one. A full disk raises
  :class:`~pythia_probe.errors.DiskFullError` naming the file, the free bytes and (when known)
  the bytes needed, and leaves no temp file behind.
- :func:`remove`: every delete of the tool goes through here and is refused for any path outside
  the folders the caller owns (a name from the hub that is really a path cannot escape them).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pythia_probe.errors import DISK_FULL_ERRNOS, DiskFullError, UnsafeFileError

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
