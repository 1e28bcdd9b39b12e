"""Logging for the commands: one rank-aware format set at the entry point, through tqdm so
messages do not break a progress bar. Modules log with ``logging.getLogger(__name__)``;
importing them configures nothing."""

from __future__ import annotations

import logging
import os
import sys

from tqdm import tqdm

LEVELS = ("debug", "info", "warning", "error")


class _TqdmHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=sys.stderr)  # stdout is the results'
        except Exception:  # noqa: BLE001 - logging must never raise
            self.handleError(record)


def setup(level: str = "info") -> None:
    """Configure the ``pythia_probe`` loggers: ``level`` and, under a multi-process launch
    (RANK in the environment), the rank in every line."""
    if level not in LEVELS:
        raise ValueError(f"--log-level {level!r}; valid: {', '.join(LEVELS)}")
    rank = os.environ.get("RANK") if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None
    where = f" [rank {rank}]" if rank is not None else ""
    handler = _TqdmHandler()
    handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s{where} %(message)s",
                                           datefmt="%H:%M:%S"))
    root = logging.getLogger("pythia_probe")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
