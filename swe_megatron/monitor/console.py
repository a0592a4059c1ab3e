"""What a run prints: one line per committed unit, and library warnings kept in a log file, off the console.

clock = UnitClock(planned_units, done)                 # at the start of a run
print(clock.line("stage1:3", metrics))                 # after each commit
# run: stage1:3 committed in 41 s: resolved 0.50, gave up 0.19, loss 0.0123; 5 unit(s) left, ETA 3m25s
# an RL iteration that made no optimiser step says why, before the units left:
# run: stage1:4 committed in 38 s: resolved 0.00, gave up 0.00; trained nothing: every group had zero advantage (6
# group(s), all rewards equal); 4 unit(s) left, ETA 2m40s

library_warnings_to(run_dir / "library-warnings.log")  # once per process, before the libraries load
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from pathlib import Path

from swe_megatron.monitor.tensorboard import key_curves

CONSOLE_FIGURES = (
    ("resolved_rate", "resolved", ".2f"),
    ("give_up_rate", "gave up", ".2f"),
    ("loss", "loss", ".4g"),
)
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


ITERATION_KINDS = ("rft", "stage1", "stage2")
"""Kinds of unit that are one iteration each (rollouts, batch, update, export): an unmeasured one is estimated
from the measured others, as is the eval unit (rollouts only, on the test tasks)."""


def unit_kind(unit: str) -> str:
    """The kind a unit's duration is estimated by: init, warm_start, rft, stage1, stage2 or eval."""
    stage, _, index = unit.partition(":")
    return "warm_start" if index == "warm_start" else stage


def nothing_trained(metrics: dict) -> str | None:
    """Why a unit that should have trained made no optimiser step (from its metrics.json), or None when it
    trained or trains nothing by design (init, eval: no `train` group)."""
    steps = metrics.get("train", {}).get("optimizer_steps")
    if steps is None or steps > 0:
        return None
    ds = metrics.get("dynamic_sampling")
    if ds is not None:
        groups = int(ds.get("groups_in", 0))
        if groups and int(ds.get("dropped_all_equal_groups", 0)) == groups:
            return f"trained nothing: every group had zero advantage ({groups} group(s), all rewards equal)"
        return "trained nothing: dynamic sampling kept no trajectory with a nonzero advantage"
    if "rft" in metrics:
        return "trained nothing: no resolved trajectory to fine-tune on"
    return "trained nothing"


class UnitClock:
    """Times the units this process commits and estimates the rest of the schedule kind by kind: a unit takes
    the mean of the committed units of its kind (unit_kind), an iteration or the eval with none of its kind yet
    the mean of all committed iterations; the warm start and init have no stand-in, so until one of those
    commits the ETA names the unit it waits for."""

    def __init__(self, planned: Iterable[str] = (), done: Iterable[str] = ()):
        committed = set(done)
        self.remaining = [u for u in planned if u not in committed]
        self.t = time.monotonic()
        self.durations: dict[str, list[float]] = {}

    def estimate(self, unit: str) -> float | None:
        """Seconds `unit` is expected to take (None: nothing committed yet says)."""
        kind = unit_kind(unit)
        same = self.durations.get(kind) or (
            [d for k in ITERATION_KINDS for d in self.durations.get(k, [])]
            if kind in (*ITERATION_KINDS, "eval")
            else []
        )
        return sum(same) / len(same) if same else None

    def eta(self) -> str:
        """The remaining units' expected time, or which unit must commit before there is one."""
        total = 0.0
        for unit in self.remaining:
            seconds = self.estimate(unit)
            if seconds is None:
                return f"ETA unknown until {unit} commits"
            total += seconds
        return f"ETA {_hms(total)}"

    def line(self, unit: str, metrics: dict | None = None) -> str:
        """The console line of a unit that has just committed (metrics: its metrics.json, if it has one)."""
        now = time.monotonic()
        seconds, self.t = now - self.t, now
        self.durations.setdefault(unit_kind(unit), []).append(seconds)
        if unit in self.remaining:
            self.remaining.remove(unit)
        curves = key_curves(metrics or {})
        parts = [f"{label} {curves[k]:{fmt}}" for k, label, fmt in CONSOLE_FIGURES if k in curves]
        idle = nothing_trained(metrics or {})
        left = len(self.remaining)
        rest = f"{left} unit(s) left, {self.eta()}" if left else "schedule done"
        return (
            f"run: {unit} committed in {seconds:.0f} s"
            + (": " + ", ".join(parts) if parts else "")
            + (f"; {idle}" if idle else "")
            + f"; {rest}"
        )
