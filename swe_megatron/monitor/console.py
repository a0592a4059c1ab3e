"""What a run prints: one line per committed unit, and library warnings kept in a log file, off the console.

clock = UnitClock(planned_units, done)                 # at the start of a run
print(clock.line("stage1:3", metrics))                 # after each commit
# run: stage1:3 committed in 41 s: resolved 0.50, gave up 0.19, loss 0.0123; 5 unit(s) left, ETA 3m25s

library_warnings_to(run_dir / "library-warnings.log")  # once per process, before the libraries load
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from pathlib import Path

from swe_megatron.monitor.tensorboard import key_curves

CONSOLE_FIGURES = (("resolved_rate", "resolved", ".2f"), ("give_up_rate", "gave up", ".2f"), ("loss", "loss", ".4g"))
"""The key curves (monitor.tensorboard.KEY_CURVES) a unit's console line shows: (curve, label, format)."""

LIBRARY_LOGGERS = ("py.warnings", "megatron", "transformers", "torch", "vllm", "huggingface_hub")
"""Loggers whose WARNING records go to the log file only: Python's `warnings` (Megatron's GPTModel deprecation,
Apex / Transformer Engine fallbacks, cuda-graph scope, ...) and the libraries' own loggers."""


def library_warnings_to(path: Path) -> None:
    """Send library warnings (LIBRARY_LOGGERS) to `path` instead of the console; each `warnings` message once
    per place, as Python's default filter shows it. Errors still reach the console."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    logging.captureWarnings(True)
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        if any(getattr(h, "baseFilename", None) == handler.baseFilename for h in logger.handlers):
            continue  # already routed there (a second command in one process)
        logger.addHandler(handler)
        logger.propagate = False  # not to the console (the root's handlers, or Python's last resort)
        errors = logging.StreamHandler()
        errors.setLevel(logging.ERROR)
        logger.addHandler(errors)


def _hms(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class UnitClock:
    """Times the units this process commits and estimates the rest of the schedule from their mean."""

    def __init__(self, planned: Iterable[str] = (), done: Iterable[str] = ()):
        committed = set(done)
        self.remaining = [u for u in planned if u not in committed]
        self.t = time.monotonic()
        self.durations: list[float] = []

    def line(self, unit: str, metrics: dict | None = None) -> str:
        """The console line of a unit that has just committed (metrics: its metrics.json, if it has one)."""
        now = time.monotonic()
        seconds, self.t = now - self.t, now
        self.durations.append(seconds)
        if unit in self.remaining:
            self.remaining.remove(unit)
        curves = key_curves(metrics or {})
        parts = [f"{label} {curves[k]:{fmt}}" for k, label, fmt in CONSOLE_FIGURES if k in curves]
        left = len(self.remaining)
        mean = sum(self.durations) / len(self.durations)
        rest = f"{left} unit(s) left, ETA {_hms(mean * left)}" if left else "schedule done"
        return (
            f"run: {unit} committed in {seconds:.0f} s"
            + (": " + ", ".join(parts) if parts else "")
            + f"; {rest}"
        )
