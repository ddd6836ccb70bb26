"""Schedules of the rollout filter's value (an extension: the reference release uses a fixed value).

The value is `filter.value` in YAML, `value` here and `filter/value` in MLflow; a schedule starts at
it and moves to `filter.schedule.end`.

Usage:
    top_p = filter_value(step, total_steps=400, kind="cosine", start=1.0, end=0.6, warmup_steps=20)
"""
from __future__ import annotations

import math

KINDS = ("const", "linear", "cosine", "step", "exp")


def filter_value(
    step: int,
    *,
    total_steps: int,
    kind: str,
    start: float,
    end: float,
    warmup_steps: int = 0,
) -> float:
    """The filter's value (e.g. top_p) at a training step; `start` is filter.value.

    `step` is clamped to [0, total_steps]. Steps before `warmup_steps` hold `start`; afterwards the
    progress t = (step - warmup_steps) / (total_steps - warmup_steps) runs from 0 to 1 and
        const:        start
        linear:       start + (end - start) * t
        cosine:       end + (start - end) * (1 + cos(pi * t)) / 2
        step:         start while t < 0.5, end from the midpoint on
        exp:          start * (end / start) ** t   (geometric; start and end must be > 0)
    If warmup_steps == total_steps, t is 1 once warmup is over.
    """
    if kind not in KINDS:
        raise ValueError(f"filter_value: unknown kind {kind!r}; expected one of {KINDS}")
    if total_steps < 1:
        raise ValueError(f"filter_value: total_steps must be >= 1, got {total_steps}")
    if not 0 <= warmup_steps <= total_steps:
        raise ValueError(f"filter_value: warmup_steps must be in [0, total_steps={total_steps}], got {warmup_steps}")
    if kind == "exp" and (start <= 0 or end <= 0):
        raise ValueError(f"filter_value: exp needs start > 0 and end > 0, got start={start}, end={end}")

    step = min(max(step, 0), total_steps)
    if kind == "const" or step < warmup_steps:
        return float(start)
    span = total_steps - warmup_steps
    t = 1.0 if span == 0 else (step - warmup_steps) / span
    if kind == "linear":
        return start + (end - start) * t
    if kind == "cosine":
        return end + (start - end) * 0.5 * (1.0 + math.cos(math.pi * t))
    if kind == "step":
        return float(start) if t < 0.5 else float(end)
    return start * (end / start) ** t
