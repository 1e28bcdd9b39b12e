"""Pythia's checkpoint schedule and the ``--steps`` grammar.

Pythia models have 154 revisions, branch ``step{N}`` for N in {0, 1, 2, 4, ..., 512} and every
1000 from 1000 to 143000 (``step143000`` == ``main``). :func:`revision` is the one place that
turns a step into a branch name.

Grammar of a steps spec (comma-separated items, union, sorted, deduplicated):

- ``1000-143000``       every available step in the closed range (both ends must be available)
- ``1000-143000:5000``  ``1000, 6000, 11000, ...`` (each must be available: nothing is rounded)
- ``0,1,2,4,512``       single steps
- ``early`` (steps <= 512), ``all``, ``log`` (the available step nearest each power of two,
  plus the first and last)

A step the model does not have raises :class:`StepError` naming the nearest valid steps.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence

from huggingface_hub import HfApi

from pythia_probe.errors import HubError, HubUnreachableError, StepError
from pythia_probe.hub import io as hubio

PYTHIA_STEPS: tuple[int, ...] = (0, *(2**k for k in range(10)), *range(1000, 143_001, 1000))
_STEP_BRANCH = re.compile(r"step(\d+)")
_RANGE = re.compile(r"(\d+)-(\d+)(?::(\d+))?")
PRESETS = ("early", "all", "log")


def revision(step: int) -> str:
    """The hub branch name of a training step: ``step{n}``."""
    if not isinstance(step, int) or step < 0:
        raise StepError(f"step must be a non-negative int, got {step!r}")
    return f"step{step}"


def step_of(branch: str) -> int | None:
    """Inverse of :func:`revision`: ``"step1000" -> 1000``; None for other branch names."""
    m = _STEP_BRANCH.fullmatch(branch)
    return int(m.group(1)) if m else None


def nearest_steps(step: int, available: Sequence[int], k: int = 2) -> list[int]:
    """The valid steps just below and above ``step`` (up to ``k`` in total)."""
    avail = sorted(available)
    i = bisect.bisect_left(avail, step)
    near = avail[max(i - 1, 0) : i + 1] if avail else []
    return sorted(near, key=lambda s: (abs(s - step), s))[:k]


def _check(step: int, avail: set[int], available: Sequence[int]) -> int:
    if step not in avail:
        near = ", ".join(map(str, sorted(nearest_steps(step, available))))
        raise StepError(f"step {step} is not available for this model; nearest valid steps: {near}")
    return step


def log_steps(available: Sequence[int]) -> list[int]:
    """First and last step plus the available step nearest each power of two in between."""
    avail = sorted(available)
    if not avail:
        return []
    chosen = {avail[0], avail[-1]}
    p = 1
    while p <= avail[-1]:
        chosen.add(min(avail, key=lambda s, p=p: (abs(s - p), s)))
        p *= 2
    return sorted(chosen)


def _parse_item(item: str, avail: set[int], available: Sequence[int]) -> list[int]:
    if item == "all":
        return sorted(available)
    if item == "early":
        return sorted(s for s in available if s <= 512)
    if item == "log":
        return log_steps(available)
    if item.isdigit():
        return [_check(int(item), avail, available)]
    m = _RANGE.fullmatch(item)
    if not m:
        raise StepError(
            f"cannot parse steps item {item!r}; valid forms: N, A-B, A-B:STRIDE, "
            f"or a preset ({', '.join(PRESETS)})"
        )
    lo, hi = _check(int(m[1]), avail, available), _check(int(m[2]), avail, available)
    if lo > hi:
        raise StepError(f"empty range {item!r}: start {lo} > end {hi}")
    if m[3] is None:
        return [s for s in sorted(available) if lo <= s <= hi]
    stride = int(m[3])
    if stride <= 0:
        raise StepError(f"stride must be positive in {item!r}")
    return [_check(s, avail, available) for s in range(lo, hi + 1, stride)]


def parse_steps(spec: str, available: Sequence[int] = PYTHIA_STEPS) -> list[int]:
    """Parse a ``--steps`` spec into a sorted list of distinct available steps."""
    items = [s.strip() for s in str(spec).split(",")]
    if not spec or not all(items):
        raise StepError(f"empty item in steps spec {spec!r}")
    avail = set(available)
    out: set[int] = set()
    for item in items:
        out.update(_parse_item(item.lower(), avail, available))
    return sorted(out)


def is_pythia(model_id: str) -> bool:
    """True for EleutherAI/pythia-* repos, whose branches follow :data:`PYTHIA_STEPS`."""
    return model_id.lower().startswith("eleutherai/pythia-")


def available_steps(model_id: str, api=None) -> list[int]:
    """Steps a hub model has: the Pythia schedule for Pythia ids, else its ``step*`` branches."""
    if is_pythia(model_id) and api is None:
        return list(PYTHIA_STEPS)
    if api is None:

        api = HfApi(endpoint=hubio.endpoint())
    where = getattr(api, "endpoint", "the hub")
    try:
        refs = hubio.call(lambda: api.list_repo_refs(model_id),
                          f"listing the branches of {model_id} on {where}",
                          hint=hubio.offline_hint(model_id, "step1000"))
    except HubUnreachableError:
        raise  # its message already says what to do offline
    except (HubError, OSError) as e:  # OSError: a resolver or socket failure outside httpx
        raise HubError(f"cannot list the branches of {model_id} on {where} ({hubio.one_line(e)}). "
                       "Offline? Pass a local folder of step*/ checkpoints, or set "
                       "HF_HUB_OFFLINE=1 with a populated cache") from e
    steps = sorted({s for b in refs.branches if (s := step_of(b.name)) is not None})
    if not steps:
        names = ", ".join(sorted(b.name for b in refs.branches)) or "none"
        raise StepError(f"{model_id} has no step* branches (branches: {names})")
    return steps
