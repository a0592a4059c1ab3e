"""Split one iteration's kept trajectories into optimiser steps (one epoch over the batch)."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def num_optimizer_steps(n_items: int, batch_size: int, min_steps: int, max_steps: int) -> int:
    """ceil(n_items / batch_size) clamped to [min_steps, max_steps] (max_steps 0: no cap), and to n_items.

    So a step holds at most batch_size trajectories unless max_steps caps the count (then every kept
    trajectory is still used once, in larger steps); never an empty step; 0 steps for no items.
    """
    if batch_size < 1 or min_steps < 1 or max_steps < 0 or (max_steps and max_steps < min_steps):
        raise ValueError(
            f"num_optimizer_steps: batch_size={batch_size}, min_steps={min_steps}, max_steps={max_steps} are "
            "invalid; allowed: batch_size >= 1, 1 <= min_steps <= max_steps, or max_steps 0 for no cap"
        )
    if n_items <= 0:
        return 0
    steps = max(math.ceil(n_items / batch_size), min_steps)
    if max_steps:
        steps = min(steps, max_steps)
    return min(steps, n_items)


def split_optimizer_steps(
    items: Sequence[T], batch_size: int, min_steps: int, max_steps: int, seed: int | None = None
) -> list[list[T]]:
    """Partition items into num_optimizer_steps(...) steps whose sizes differ by at most one (larger first).

    items: [N] trajectories. seed: shuffle with random.Random(seed) first (so one step does not hold
    only a few tasks' groups); None keeps the input order. Returns the steps, every item exactly once.
    """
    steps = num_optimizer_steps(len(items), batch_size, min_steps, max_steps)
    order = list(items)
    if seed is not None:
        random.Random(seed).shuffle(order)
    out: list[list[T]] = []
    start = 0
    for s in range(steps):
        size = len(order) // steps + (1 if s < len(order) % steps else 0)
        out.append(order[start : start + size])
        start += size
    return out
