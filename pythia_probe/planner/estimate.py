"""How long a sweep will take, before it starts, from rates measured now (never assumed):

- scoring: the planned multiply-adds of every checkpoint to score (:mod:`.step`, dense
  and sparse) at the dense and sparse rates measured on the scoring device now
  (:mod:`.rates`, the rates the plan's per-step line uses); the products
  reach at most those, so this is a lower bound;
- downloads: the bytes still to fetch at the rate the planning fetches reached (the tokenizer
  files each model's first revision ships, when they were not cached: :class:`Rate`); with
  nothing fetched yet the download time is unknown, and said so (the progress display measures
  it from the first checkpoints);
- together: with prefetch (``--prefetch`` >= 1) downloads overlap scoring, so the sweep takes
  about the longer of the two; without, their sum.
"""

from __future__ import annotations

from dataclasses import dataclass

from pythia_probe.planner.budget import human_bytes

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


def hms(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def estimate(score: float, flops: float, rates: dict[str, float], nbytes: float,
             fetch: Rate | None, prefetch: int) -> str:
    """One line: scoring time (``score`` seconds: ``flops`` at the measured ``rates``),
    download time and the two together."""
    parts = [f"scoring >= {hms(score)} ({flops:.2e} flops at {rates['dense'] / 1e9:.1f} dense, "
             f"{rates['sparse'] / 1e9:.2f} sparse G multiply-adds/s measured here now)"]
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
