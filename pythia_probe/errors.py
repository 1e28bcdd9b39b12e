"""The one hierarchy of errors a user can fix.

Every command prints a :class:`UserError` as one line (``prog: error: ...``) and exits with
code 2; anything else is a bug and keeps its traceback (exit 1). Each message says what was
wrong (naming the file, tensor, flag or step) and what is valid.

Each kind also subclasses the builtin a caller would expect (``BadInputError`` is a
``ValueError``, ``MissingFileError`` a ``FileNotFoundError`` ...), so library users can catch
either.
"""

from __future__ import annotations

import errno

DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class UserError(Exception):
    """Base class: something the user can fix (input, files, disk, network, device)."""


class BadInputError(UserError, ValueError):
    """A flag, config value, step or data in a form the tool does not accept."""


class MismatchError(BadInputError):
    """Inputs that do not belong together: statistics from another tokenizer, a resume into a
    folder that holds a different run, a checkpoint of another configuration."""


class CorruptFileError(UserError, ValueError):
    """A file whose bytes are wrong: a hash mismatch, a truncated or unparseable file."""


class UnsafeFileError(CorruptFileError):
    """A file that would execute code or escape the tool's folders if used as given."""


class MissingFileError(UserError, FileNotFoundError):
    """A file, folder, revision or cached entry that is not there."""


class DiskFullError(UserError, OSError):
    """A write that ran out of disk space; the message says where and how much is needed."""


class ResourceError(UserError, MemoryError):
    """A run whose planned memory or disk does not fit; the message gives the numbers."""


class HubError(UserError, ConnectionError):
    """The hub (or a dataset server) could not be reached, or kept failing after retries."""


class DeviceError(UserError, RuntimeError):
    """``--device`` names a device this machine does not have."""


class KernelError(BadInputError):
    """A compiled kernel refused its input, or was asked for (``PYTHIA_PROBE_KERNEL=c``) but is
    not built; the message names what was wrong."""


# ---- the hub, checkpoints and steps ------------------------------------------------------------
class StepError(BadInputError):
    """A steps spec that names a step the model does not have, or is malformed."""


class ChecksumError(CorruptFileError):
    """Bytes from the hub (or in a cache) that do not match the size and hash the hub listed:
    weights, config, index, tokenizer files and dataset shards alike, including a body longer
    than the listed size (cut off there). Fetched once more, then reported naming the file."""


class HubDownloadError(HubError):
    """The hub refused a request, kept failing after all retries, or never answered."""


class HubUnreachableError(HubDownloadError):
    """The hub's host does not resolve or refuses connections (no network, a mistyped
    ``HF_ENDPOINT``): not retried; the message says how to work offline."""


class HubNotFoundError(MissingFileError):
    """The hub has no such repository, revision or file."""


class IncompleteDownloadError(HubError):
    """The server closed a body early (transient: the next try resumes)."""


class CheckpointError(UserError):
    """Base class of the checkpoint errors below (one line on the command line)."""


class CheckpointNotCachedError(CheckpointError, MissingFileError):
    """A revision, file or folder that is not there: a local step folder, a file of a
    revision, or (offline) an entry of the cache."""


class CorruptCheckpointError(CheckpointError, CorruptFileError):
    """A weight, config or index file that is truncated or cannot be parsed."""


class UnsafeCheckpointError(CheckpointError, UnsafeFileError):
    """A pickle that ``torch.load(weights_only=True)`` refuses (it would execute code), or a
    name from the hub that is really a path."""


class CheckpointDiskError(CheckpointError, ResourceError):
    """A revision that does not fit the disk budget (``max_disk``)."""


class MissingTensorError(CheckpointError, MismatchError, KeyError):
    """Asked tensors that the checkpoint does not have."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class ResultsError(CorruptFileError):
    """A results table, shard or manifest that does not follow the schema."""


class UnsupportedConfigError(BadInputError):
    """A GPT-NeoX config with fields or values :mod:`pythia_probe.arch` does not understand."""


class WeightShapeError(MismatchError):
    """A tensor whose shape is not the one the config implies (names the tensor)."""


class OutOfRangeError(UserError, ArithmeticError):
    """A computed number outside its known range (a cosine beyond [-1, 1]): the inputs are
    corrupt (a damaged cache, wrong statistics) or the code has a bug; never written."""


class FolderLockedError(UserError, BlockingIOError):
    """An output folder another live process is writing (names the folder and the holder)."""


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM: the job stops where it is; what is written stays and a rerun
    resumes. A KeyboardInterrupt, so cleanup that ignores kills ignores it too."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum


def user_message(err: BaseException) -> str | None:
    """The one line for a user-facing error, or None for a bug.

    A :class:`UserError`, and an operating-system error about a named file (permission denied,
    not found, no space left), are the user's to fix; anything else is a bug."""
    if isinstance(err, UserError):
        return " ".join(str(err).split())
    if isinstance(err, OSError) and err.errno in DISK_FULL_ERRNOS:
        where = f" writing {err.filename}" if err.filename else ""
        return f"disk full{where}: {err.strerror}; free space or choose another folder"
    if isinstance(err, OSError) and err.filename is not None and err.strerror:
        return f"{err.filename}: {err.strerror}"
    return None
