"""Rollouts ahead of the trainer (algo.max_staleness >= 1), and how long each side waits for the other.

Rank 0 runs an RL iteration's rollouts while every trainer rank updates on the previous iteration: the units
i+1..i+k of a stage start when the trainer starts on unit i (their tasks are sampled then, on the main thread,
from the same seeded pool stream as the synchronous loop), and unit j's batch waits for its rollouts. They run
in a process of their own (pipeline/rollout_process.py; on threads of the trainer's process they slowed its
steps through the GIL), one unit at a time, each waited for by one background thread here. Weight updates
land between turns (engine/gate.py, in both processes), so a trajectory's tokens are at most k updates behind
the trainer when it is trained on; algo/staleness.py drops any that are not.
Nothing rolled out ahead is committed with an earlier unit: a stop or a crash leaves it uncommitted, and the
next attempt rolls that unit out again (counted as redone).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from swe_megatron.engine.gate import VersionGate
from swe_megatron.pipeline.rollout_process import RolloutProcess, RolloutProcessError

STOPPING = (
    "rollouts cancelled: the run is stopping (this unit was not committed and is rolled out again on resume)"
)
"""EngineError text of the turns refused once the run stops with rollouts in flight."""


class BusyClock:
    """Seconds in which rollouts ran, read per cycle (between two reads)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._running = 0
        self._since: float | None = None
        self._busy = 0.0
        self._mark = time.monotonic()

    @contextmanager
    def busy(self) -> Iterator[None]:
        """Count the block's time as busy."""
        with self._lock:
            if not self._running:
                self._since = time.monotonic()
            self._running += 1
        try:
            yield
        finally:
            with self._lock:
                self._running -= 1
                if not self._running:
                    self._busy += time.monotonic() - self._since
                    self._since = None

    def take(self) -> tuple[float, float]:
        """(busy seconds, wall seconds) since the previous take; the next cycle starts now."""
        with self._lock:
            now = time.monotonic()
            busy = self._busy
            if self._since is not None:
                busy += now - self._since
                self._since = now
            wall, self._busy, self._mark = now - self._mark, 0.0, now
        return busy, wall


class Ahead:
    """Rank 0's rollouts of later units on one thread (one unit at a time, in order), and the rollout clock."""

    def __init__(self, gate: VersionGate | None = None):
        self.gate = gate
        """The run's engine gate (closed when the run stops with rollouts in flight)."""
        self.clock = BusyClock()
        """Busy time of the rollouts, inline and ahead (engine idle fraction = 1 - busy / cycle)."""
        self.stage: str | None = None
        """The stage whose cycles the clock measures."""
        self.process: RolloutProcess | None = None
        """Async mode: the process the rollouts run in (pipeline/rollout_process.py), once started."""
        self._futures: dict[str, Future] = {}
        self._pool: ThreadPoolExecutor | None = None

    def start_process(self, start: Callable[[], RolloutProcess]) -> None:
        """Run every later rollout in the process start() starts (once; call it on the main thread)."""
        if self.process is None:
            self.process = start()

    def pause(self) -> None:
        """Hold back new turns here and in the rollout process, and wait for those in flight (a weight sync
        follows)."""
        if self.gate is not None:
            self.gate.pause()
        if self.process is not None:
            try:
                self.process.pause()
            except BaseException:
                if self.gate is not None:
                    self.gate.resume(None)
                raise

    def resume(self, version: int | None) -> None:
        """Let turns run again, on `version` (None: the update failed; the version stays)."""
        if self.gate is not None:
            self.gate.resume(version)
        if self.process is not None:
            try:
                self.process.resume(version)
            except RolloutProcessError:
                if version is not None:
                    raise  # else the failed update's own error is the one the run stops with

    def begin(self, stage: str) -> None:
        """Start measuring cycles anew at the first iteration of a stage (or of this attempt)."""
        if stage != self.stage:
            self.stage = stage
            self.clock.take()

    def cycle(self, trainer_wait_s: float) -> dict[str, float]:
        """time/* scalars of the cycle ending now (since the previous one, or `begin`): its length, the fraction
        the trainer waited for rollouts (trainer_wait_s of it) and the fraction no rollout ran (engine idle)."""
        busy, wall = self.clock.take()
        return {
            "cycle_s": wall,
            "trainer_idle_frac": trainer_wait_s / wall if wall else 0.0,
            # Not clamped: busy time is measured inside the cycle, so a value below 0 is a clock bug to see.
            "engine_idle_frac": 1.0 - busy / wall if wall else 0.0,
        }

    def run(self, fn: Callable[..., Any], *args) -> Any:
        """fn(*args) now, on this thread, timed as rollouts."""
        with self.clock.busy():
            return fn(*args)

    def submit(self, unit: str, fn: Callable[..., Any], *args) -> None:
        """fn(*args) on the rollout thread after those submitted before; `take(unit)` gets its result."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollouts-ahead")
        self._futures[unit] = self._pool.submit(self.run, fn, *args)

    def started(self, unit: str) -> bool:
        """Whether unit's rollouts were submitted (and not taken yet)."""
        return unit in self._futures

    def take(self, unit: str) -> Any:
        """The result of unit's rollouts, waiting for them (their error raised here); None if none were submitted."""
        fut = self._futures.pop(unit, None)
        return None if fut is None else fut.result()

    def close(self) -> None:
        """Stop rollouts still in flight (their turns are refused; nothing of them is kept) and the thread."""
        if self._futures and self.gate is not None:
            self.gate.close(STOPPING)
        if self.process is not None:  # it returns the unit in flight, its turns refused, then exits
            self.process.close(STOPPING if self._futures else None)
            self.process = None
        for fut in self._futures.values():
            fut.exception()  # wait; an error of rollouts nobody will train on is dropped with them
        self._futures.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
