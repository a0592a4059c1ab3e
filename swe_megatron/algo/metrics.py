"""Statistics: the unbiased pass@k estimator, mean +- standard error over runs, and the counters of reports."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass


@dataclass
class Counts:
    """Base of a report made of integer counters (dynamic sampling, RFT selection)."""

    def as_metrics(self, prefix: str = "") -> dict[str, float]:
        """The counters as a flat dict of floats for the monitor, each name after prefix."""
        return {prefix + k: float(v) for k, v in asdict(self).items()}


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c passed: 1 - C(n - c, k) / C(n, k).

    Computed as 1 - prod_{i = n - c + 1}^{n} (1 - k / i), which avoids huge binomials.
    """
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def mean_pass_at_k(results: Mapping[str, Sequence[bool]], k: int) -> float:
    """pass@k averaged over tasks; results maps a task id to the pass/fail of each of its n runs."""
    if not results:
        raise ValueError("mean_pass_at_k: no tasks")
    return sum(pass_at_k(len(r), sum(map(bool, r)), k) for r in results.values()) / len(results)


def pass_rate_per_run(results: Mapping[str, Sequence[bool]]) -> list[float]:
    """pass@1 of each run r (fraction of tasks whose r-th run passed); every task needs the same run count."""
    counts = {len(r) for r in results.values()}
    if len(counts) != 1:
        raise ValueError(f"pass_rate_per_run: tasks have different run counts {sorted(counts)}")
    runs = counts.pop()
    return [sum(bool(r[j]) for r in results.values()) / len(results) for j in range(runs)]


def mean_sem(values: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (sample std with n - 1, over sqrt(n)); SEM is NaN for one value."""
    n = len(values)
    if n == 0:
        raise ValueError("mean_sem: no values")
    mean = sum(values) / n
    if n == 1:
        return mean, math.nan
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)
