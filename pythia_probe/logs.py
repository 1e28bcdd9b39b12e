"""Logging for the commands: one rank-aware format set at the entry point, through tqdm so
messages do not break a progress bar. Modules log with ``logging.getLogger(__name__)``;
importing them configures nothing. The rank comes from the entry point (:func:`set_rank`,
called by :func:`pythia_probe.ranks.from_env`), never from the environment."""

from __future__ import annotations

import logging
import sys

from tqdm import tqdm

LEVELS = ("debug", "info", "warning", "error")
_RANK: list[int | None] = [None]  # this process's rank under a multi-process launch


class _TqdmHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        try:
            # the line and its end in one write: two ranks' lines never merge into one
            tqdm.write(self.format(record) + "\n", file=sys.stderr, end="")  # stdout: results
        except Exception:  # noqa: BLE001 - logging must never raise
            self.handleError(record)


def _formatter() -> logging.Formatter:
    where = f" [rank {_RANK[0]}]" if _RANK[0] is not None else ""
    return logging.Formatter(f"%(asctime)s %(levelname)s{where} %(message)s", datefmt="%H:%M:%S")


def setup(level: str = "info", rank: int | None = None) -> None:
    """Configure the ``pythia_probe`` loggers: ``level`` and, under a multi-process launch,
    ``rank`` in every line (None: keep the rank already set, if any)."""
    if level not in LEVELS:
        raise ValueError(f"--log-level {level!r}; valid: {', '.join(LEVELS)}")
    if rank is not None:
        _RANK[0] = rank
    handler = _TqdmHandler()
    handler.setFormatter(_formatter())
    root = logging.getLogger("pythia_probe")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


def set_rank(rank: int | None) -> None:
    """Put ``rank`` (None: no rank, a single process) in every later line."""
    _RANK[0] = rank
    for handler in logging.getLogger("pythia_probe").handlers:
        handler.setFormatter(_formatter())
