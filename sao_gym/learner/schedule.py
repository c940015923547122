"""Learning-rate schedules of the learner: a factor on the base rates per step.

Pure and derived from the learner step alone, so a resumed run continues the
schedule exactly (the step is in every checkpoint).

>>> [round(lr_scale(s, 10, "linear", 0.1), 2) for s in (0, 5, 10, 20)]
[1.0, 0.55, 0.1, 0.1]
>>> round(lr_scale(5, 10, "cosine", 0.0), 3), lr_scale(7, None, "constant", 0.1)
(0.5, 1.0)
>>> [warmup_scale(s, 4) for s in (0, 1, 3, 9)]
[0.25, 0.5, 1.0, 1.0]
"""

from __future__ import annotations

import math

LR_SCHEDULES = ("constant", "linear", "cosine")


def lr_scale(step: int, total_steps: int | None, schedule: str, final_ratio: float) -> float:
    """Factor on the base learning rates for learner step ``step`` (0-based).

    ``constant``: 1. ``linear`` and ``cosine`` fall from 1 at step 0 to
    ``final_ratio`` at ``total_steps`` and stay there.
    """
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"lr_schedule must be one of {LR_SCHEDULES}, got {schedule!r}")
    if schedule == "constant":
        return 1.0
    if not total_steps or total_steps < 1:
        raise ValueError(f"lr_schedule {schedule!r} needs total_steps >= 1, got {total_steps}")
    progress = min(1.0, max(0, step) / total_steps)
    shape = 1.0 - progress if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
    return final_ratio + (1.0 - final_ratio) * shape


def warmup_scale(step: int, warmup_steps: int) -> float:
    """Linear warm-up factor for a model's ``step``-th update (0-based).

    ``(step + 1) / warmup_steps`` up to 1, so the first update already moves
    (at ``1 / warmup_steps`` of the rate); 1 throughout when ``warmup_steps`` is
    0. A fresh Adam state makes every parameter's first steps about ``lr`` long
    whatever its gradient: the warm-up keeps those first steps small.
    """
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
    if warmup_steps == 0:
        return 1.0
    return min(1.0, (max(0, step) + 1) / warmup_steps)
