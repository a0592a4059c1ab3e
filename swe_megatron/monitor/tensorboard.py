"""Run monitoring: TensorBoard scalars, histograms and trajectory text, and terminal progress bars.

`Monitor` writes event files under `<run_dir>/tensorboard`; `NullMonitor` has the same methods and
does nothing (non-zero ranks, tests), so the driver loop never branches on whether it logs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from torch.utils.tensorboard import SummaryWriter

T = TypeVar("T")


def _finite(value: Any) -> float | None:
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


class Monitor:
    """TensorBoard writer for one run; tags are "<group>/<name>" and x is the global iteration."""

    def __init__(self, log_dir: str | Path, progress: bool = True):
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._writer = SummaryWriter(str(self.log_dir))
        self.progress_enabled = progress

    def scalars(self, group: str, values: Mapping[str, Any], step: int) -> None:
        """Log every finite numeric value as `group/name`; None and NaN are skipped, not written as 0."""
        for name, value in values.items():
            f = _finite(value)
            if f is not None:
                self._writer.add_scalar(f"{group}/{name}", f, step)

    def histogram(self, tag: str, values: Iterable[float], step: int) -> None:
        """Log a histogram of values (skipped when empty)."""
        data = [float(v) for v in values]
        if data:
            import numpy as np

            self._writer.add_histogram(tag, np.asarray(data), step)

    def text(self, tag: str, text: str, step: int) -> None:
        """Log text (markdown) such as a sample trajectory."""
        self._writer.add_text(tag, text, step)

    def progress(self, items: Iterable[T], total: int | None = None, desc: str = "") -> Iterator[T]:
        """Iterate with a terminal progress bar (tqdm) when enabled."""
        if not self.progress_enabled:
            yield from items
            return
        from tqdm import tqdm

        yield from tqdm(items, total=total, desc=desc, dynamic_ncols=True, leave=False)

    def flush(self) -> None:
        """Write pending events to disk (call at the end of each iteration, before the checkpoint)."""
        self._writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        self._writer.close()


class NullMonitor(Monitor):
    """A Monitor that records nothing (same signatures)."""

    def __init__(self, log_dir: str | Path | None = None, progress: bool = False):
        self.log_dir = Path(log_dir) if log_dir else None
        self.progress_enabled = progress

    def scalars(self, group: str, values: Mapping[str, Any], step: int) -> None:
        """Drop the values."""

    def histogram(self, tag: str, values: Iterable[float], step: int) -> None:
        """Drop the values."""

    def text(self, tag: str, text: str, step: int) -> None:
        """Drop the text."""

    def flush(self) -> None:
        """Nothing to flush."""

    def close(self) -> None:
        """Nothing to close."""


def read_scalars(log_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the event files under log_dir: tag -> [(step, value)], for tests and reports."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, list[tuple[int, float]]] = {}
    for events in sorted(Path(log_dir).rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0, "histograms": 0, "tensors": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return out
