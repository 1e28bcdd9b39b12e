"""One progress display for a job made of stages (statistics pass 1, pass 2, the sweep's steps).

Each stage counts in its own unit (tokens, steps) and has a planned size. The display is one
tqdm line: the running stage's bar, and a time estimate for the whole job: the running stage's
remaining work at its measured rate, plus each later stage's planned size at its measured rate,
or, before it has run, at the rate of the stage it is said to resemble (pass 2 reads the tokens
pass 1 read). A stage with no rate yet is shown as such, never guessed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from tqdm.auto import tqdm


@dataclass
class Stage:
    """One stage: ``total`` units planned (None: unknown), ``like``: an earlier stage whose rate
    estimates this one's until it has run."""

    name: str
    total: float | None
    unit: str
    like: str | None = None
    done: float = 0.0
    started: float | None = None
    seconds: float = 0.0

    @property
    def rate(self) -> float | None:
        """Units per second measured so far (None before any unit was done)."""
        if self.done <= 0:
            return None
        busy = self.seconds + (time.monotonic() - self.started if self.started else 0.0)
        return self.done / busy if busy > 0 else None


class JobProgress:
    """Stages run one after another; :meth:`stage` returns the running stage's update function.

    ``disable``: no display (e.g. not rank 0, or --no-progress); the bookkeeping still runs."""

    def __init__(self, stages: list[Stage], disable: bool = False) -> None:
        self.stages = {s.name: s for s in stages}
        self.order = [s.name for s in stages]
        self.disable = disable
        self.bar: tqdm | None = None  # drawn when a stage starts: never an empty bar before
        self.current: Stage | None = None

    def stage(self, name: str, total: float | None = None):
        """Start stage ``name`` (``total`` overrides its planned size); returns ``update(n)``."""
        self.finish()
        s = self.stages[name]
        s.total = s.total if total is None else total
        s.started = time.monotonic()
        self.current = s
        desc = f"[{self.order.index(name) + 1}/{len(self.order)}] {name}"
        if self.bar is None:  # drawn once, named: no nameless 0% line first (a log shows it)
            self.bar = tqdm(total=s.total, desc=desc, unit=s.unit, disable=self.disable,
                            dynamic_ncols=True, unit_scale=True)
            return self.update
        self.bar.unit = s.unit
        self.bar.set_description(desc, refresh=False)
        self.bar.reset(total=s.total)
        return self.update

    def counter(self, name: str, total: float | None = None) -> _Counter:
        """Stage ``name`` as a tqdm-like object (``update(n)``, ``close()``)."""
        return _Counter(self.stage(name, total), self.finish)

    def update(self, n: float) -> None:
        s = self.current
        if s is None:
            return
        s.done += n
        self.bar.update(n)
        eta = self.eta()
        self.bar.set_postfix_str("job " + ("ETA ?" if eta is None else f"ETA {_hms(eta)}"),
                                 refresh=False)

    def finish(self) -> None:
        """End the running stage (its measured time is kept for the estimate)."""
        s = self.current
        if s is not None and s.started is not None:
            s.seconds += time.monotonic() - s.started
            s.started = None
        self.current = None

    def eta(self) -> float | None:
        """Seconds left for the whole job, or None while some stage's rate is unknown."""
        left = 0.0
        running = self.current.name if self.current else None
        after = self.order[self.order.index(running):] if running else self.order
        for name in after:
            s = self.stages[name]
            rate = s.rate or (self.stages[s.like].rate if s.like else None)
            if s.total is None or rate is None:
                return None
            left += max(s.total - s.done, 0.0) / rate
        return left

    def close(self) -> None:
        self.finish()
        if self.bar is not None:
            self.bar.close()


@dataclass
class _Counter:
    update: object
    close: object


def _hms(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"
