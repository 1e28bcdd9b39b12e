"""The step axis every figure shares: log2 of the step, so Pythia's 1, 2, 4, ..., 512 are evenly
spaced and 1000..143000 follow on the same scale (no categorical axis mixing the two).

Step 0 has no logarithm: it is placed one octave left of the first positive step, behind a
break drawn on the axis (``//``), never dropped. Ticks sit at 0, powers of two, 1k times powers
of two and the last step, labelled ``512``, ``1k``, ``143k``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.transforms import ScaledTranslation

from pythia_probe.summary.table import step_label as label

#: closest two tick labels may sit, in octaves
MIN_TICK_GAP = 0.45


def positions(steps: Sequence[int]) -> np.ndarray:
    """x position of each step: log2(step); step 0 one octave left of the first positive one."""
    s = np.asarray(steps, dtype=float)
    pos = s[s > 0]
    first = np.log2(pos.min()) if pos.size else 1.0
    with np.errstate(divide="ignore"):
        return np.where(s > 0, np.log2(np.where(s > 0, s, 1)), first - 1.0)


def edges(steps: Sequence[int]) -> np.ndarray:
    """Cell edges around the sorted ``steps`` (midpoints; the outer cells as wide as their
    neighbour's half gap, or one octave for a lone step)."""
    x = positions(sorted(steps))
    if x.size == 1:
        return np.array([x[0] - 0.5, x[0] + 0.5])
    mid = (x[1:] + x[:-1]) / 2
    return np.concatenate([[x[0] - (mid[0] - x[0])], mid, [x[-1] + (x[-1] - mid[-1])]])


def width(steps: Sequence[int], per_octave: float = 0.6, least: float = 2.5) -> float:
    """Inches for a panel showing ``steps``: proportional to the octaves the axis spans."""
    e = edges(sorted({int(s) for s in steps}))
    return max(least, per_octave * float(e[-1] - e[0]))


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _nice(step: int) -> bool:
    return step == 0 or _pow2(step) or (step % 1000 == 0 and _pow2(step // 1000))


def ticks(steps: Sequence[int], max_ticks: int = 22) -> list[int]:
    """The steps to label: 0, powers of two, 1k x powers of two and the last step, none closer
    than :data:`MIN_TICK_GAP` octaves to the next."""
    steps = sorted({int(s) for s in steps})
    if not steps:
        return []
    chosen = [s for s in steps if _nice(s)]
    if steps[-1] not in chosen:
        chosen.append(steps[-1])
    x = dict(zip(steps, positions(steps), strict=True))
    kept: list[int] = []
    for s in chosen:
        if kept and x[s] - x[kept[-1]] < MIN_TICK_GAP:
            if s != steps[-1]:
                continue
            kept.pop()
        kept.append(s)
    if len(kept) > max_ticks:
        every = -(-len(kept) // max_ticks)
        kept = sorted(set(kept[::every]) | {kept[-1]})
    return kept


def break_at(steps: Sequence[int]) -> float | None:
    """x of the break between step 0 and the first positive step (None without step 0)."""
    steps = sorted({int(s) for s in steps})
    if len(steps) < 2 or steps[0] != 0:
        return None
    x = positions(steps)
    return float((x[0] + x[1]) / 2)


def setup(ax, steps: Sequence[int], *, label_axis: bool = True) -> None:
    """Ticks, limits and the step-0 break on ``ax`` for a figure drawn at :func:`positions`."""
    steps = sorted({int(s) for s in steps})
    x = dict(zip(steps, positions(steps), strict=True))
    shown = ticks(steps)
    ax.set_xticks([x[s] for s in shown], [label(s) for s in shown], fontsize=7)
    e = edges(steps)
    ax.set_xlim(e[0], e[-1])
    if label_axis:
        ax.set_xlabel("training step (log scale)", fontsize=8)
    gap = break_at(steps)
    if gap is not None:
        mark_break(ax, gap)


def mark_break(ax, x: float) -> None:
    """``//`` on the bottom spine at data x, and a thin white gap through the plot."""
    ax.axvline(x, color="white", lw=2.5, zorder=3)
    for dx in (-2.0, 2.0):  # points
        at = ax.get_xaxis_transform() + ScaledTranslation(dx / 72, 0, ax.figure.dpi_scale_trans)
        ax.plot([x], [0], marker=[(-1, -2), (1, 2)], ms=9, mew=1, color="k", transform=at,
                clip_on=False, zorder=5)
