"""How long a sweep will take, before it starts, from rates measured now (never assumed):

- scoring: the planned flops of every checkpoint to score (``analysis/plan.py``, from the
  analyses' declared costs) at the rate of a float32 matmul timed on the scoring device now
  (:func:`matmul_rate`); the analyses reach at most that, so this is a lower bound;
- downloads: the bytes still to fetch at the rate the planning fetches reached (the tokenizer
  files each model's first revision ships, when they were not cached: :class:`Rate`); with
  nothing fetched yet the download time is unknown, and said so (the progress display measures
  it from the first checkpoints);
- together: with prefetch (``--prefetch`` >= 1) downloads overlap scoring, so the sweep takes
  about the longer of the two; without, their sum.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from pythia_probe.resources import human_bytes

SAMPLE_BYTES = 256_000  # planning fetches smaller than this say nothing about bandwidth


@dataclass(frozen=True)
class Rate:
    """Bytes fetched in seconds."""

    nbytes: float
    seconds: float

    @property
    def per_second(self) -> float | None:
        if self.nbytes < SAMPLE_BYTES or self.seconds <= 0:
            return None
        return self.nbytes / self.seconds


def matmul_rate(device: str, n: int = 512, repeats: int = 8) -> float:
    """Float32 flops per second of an n x n matmul on ``device``, timed now (after a warm-up)."""
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    (a @ b).sum().item()
    start = time.perf_counter()
    for _ in range(repeats):
        c = a @ b
    c.sum().item()  # waits for the device
    return 2 * n**3 * repeats / max(time.perf_counter() - start, 1e-9)


def hms(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def estimate(flops: float, nbytes: float, flop_rate: float, fetch: Rate | None,
             prefetch: int) -> str:
    """One line: scoring time, download time and the two together."""
    score = flops / flop_rate
    parts = [f"scoring >= {hms(score)} ({flops:.2e} flops at {flop_rate / 1e9:.1f} GFLOP/s of "
             "a float32 matmul timed here now)"]
    bandwidth = None if fetch is None else fetch.per_second
    if nbytes == 0:
        parts.append("nothing to download")
        return "; ".join(parts) + f"; about {hms(score)} in all"
    if bandwidth is None:
        parts.append(f"downloads of {human_bytes(nbytes)}: time unknown until the first "
                     "checkpoint arrives (no planning fetch to measure); the progress display "
                     "estimates it then")
        return "; ".join(parts)
    down = nbytes / bandwidth
    parts.append(f"downloads {hms(down)} ({human_bytes(nbytes)} at {human_bytes(bandwidth)}/s, "
                 "the rate of this run's tokenizer fetches)")
    total = max(score, down) if prefetch >= 1 else score + down
    how = "overlapping (prefetch)" if prefetch >= 1 else "one after the other (no prefetch)"
    return "; ".join(parts) + f"; about {hms(total)} in all, {how}"
