"""Sandbox lifecycle off the critical path: start sandboxes before they are needed, stop them after, in threads.

    pool = Prewarmer(capacity=2, reserve=4)
    pool.prefetch("task-1", lambda: make_sandbox(spec, cfg))   # starts in the background
    sb = pool.take("task-1") or pool.lease(make_sandbox(spec, cfg))   # started (waits if still starting;
                                                                # one not begun yet is cancelled: None)
    ... sb.exec(...) ...
    sb.stop()                                                   # returns at once; a reaper thread stops it
    pool.close()                                                # stops everything; nothing of it runs after

Every sandbox is handed out once (a fresh sandbox per episode or grading, never a reused one). A prefetched
sandbox is a new sandbox of its own (its own workspace copy and processes): starting it early changes when
it starts, not what it is. A prefetch is made inside sandbox.base.ahead_of_need(reserve): on sandbox servers
with limited slots it never waits for a slot and is placed only while the prefetches not yet taken leave
`reserve` slots to the sandboxes needed now, else it is skipped; `take` claims it. A skipped prefetch, and
one whose start fails, is dropped (`take` returns None and the caller starts a fresh one itself, where a
failure is reported as usual). `close()` (also on errors) stops the
sandboxes waiting to be taken, those still starting, and those handed out and not yet stopped, and waits
for every stop, so no sandbox of the pool outlives it.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from swe_megatron.sandbox.base import ExecResult, NoFreeSlot, Sandbox, SandboxError, ahead_of_need

log = logging.getLogger(__name__)


def _call_quietly(fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - background work must not fail a sandbox
        log.warning("%s failed: %s", getattr(fn, "__name__", "a sandbox callback"), e)


class Leased:
    """A sandbox handed out by a Prewarmer: the Sandbox protocol, with stop() handed to a reaper thread.

    start() is idempotent (a prefetched sandbox is already started). stop() returns at once; the sandbox's
    processes are killed and its workspace removed by the pool's reaper (or right away once the pool is
    closed). A stop that arrives while start() runs takes effect when start() returns. `after_start` is
    called once when the first start() ends (however it ends): the owner can hold background work back
    until then, so that it does not compete with a start someone is waiting for.
    """

    def __init__(
        self,
        sandbox: Sandbox,
        pool: Prewarmer,
        started: bool = False,
        after_start: Callable[[], None] | None = None,
    ):
        self.sandbox = sandbox
        """The backend's sandbox."""
        self._after_start = None if started else after_start
        self._pool = pool
        self._lock = threading.Lock()
        self._started = started
        self._starting = False
        self._released = False
        self._idle = threading.Event()  # set whenever no start() is running
        self._idle.set()

    @property
    def spec(self):
        """The SandboxSpec the sandbox was made from (None when the backend does not keep one)."""
        return getattr(self.sandbox, "spec", None)

    def start(self) -> None:
        """Start the sandbox unless it already is; SandboxError if it was stopped meanwhile."""
        with self._lock:
            if self._released:
                raise SandboxError("the sandbox was stopped before it started")
            if self._started:
                return
            self._starting = True
            self._idle.clear()
        ok = False
        try:
            self.sandbox.start()
            ok = True
        finally:
            with self._lock:
                self._starting = False
                self._started = ok
                released = self._released
            if released:  # stopped while starting: the stop was left to us
                self._pool._stop_now(self.sandbox)
                self._pool._forget(self)
            self._idle.set()
            hook, self._after_start = self._after_start, None
            if hook is not None:
                _call_quietly(hook)
        if released:
            raise SandboxError("the sandbox was stopped while it started")

    def exec(self, command: str, timeout_s: float | None = None) -> ExecResult:
        """Run a command in the sandbox's persistent shell."""
        return self.sandbox.exec(command, timeout_s=timeout_s)

    def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        """Read a repository file (or its last max_bytes bytes)."""
        return self.sandbox.read_file(path, max_bytes)

    def write_file(self, path: str, data: bytes) -> None:
        """Write a repository file."""
        self.sandbox.write_file(path, data)

    def host_patch(self, max_bytes: int) -> str:
        """The workspace's diff, taken on the host."""
        return self.sandbox.host_patch(max_bytes)

    def stop(self) -> None:
        """Hand the sandbox to the reaper (idempotent); a command running now ends with SandboxError."""
        with self._lock:
            if self._released:
                return
            self._released = True
            defer = self._starting
        self._pool._release(self, defer)

    def __enter__(self) -> Leased:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class Prewarmer:
    """Starts sandboxes ahead of need (keyed, at most `capacity` waiting) and stops them in the background."""

    def __init__(
        self, capacity: int, *, reserve: int = 0, background_stop: bool = True, name: str = "sandbox"
    ):
        self.capacity = max(0, capacity)
        """Prefetched sandboxes (starting or started) that may wait to be taken at once."""
        self.reserve = max(0, reserve)
        """Sandbox server slots a prefetch leaves free for the sandboxes needed now (see the module docstring)."""
        self.background_stop = background_stop
        """stop() of a handed-out sandbox returns at once and a reaper thread stops it; else it stops inline."""
        self._lock = threading.Lock()
        self._waiting: dict[str, collections.deque[Future]] = collections.defaultdict(collections.deque)
        self._n_waiting = 0
        self._live: set[Leased] = set()
        self._deferred: set[Leased] = set()  # stopped mid-start: their start() stops them when it returns
        self._closed = False
        self._starter = ThreadPoolExecutor(
            max_workers=max(1, min(4, self.capacity)), thread_name_prefix=f"{name}-warm"
        )
        self._reaper = ThreadPoolExecutor(max_workers=2, thread_name_prefix=f"{name}-reap")
        self._stops: list[Future] = []
        self.prefetched = 0
        """Sandboxes asked for ahead of need (prefetch() calls that were accepted)."""
        self.hits = 0
        """take() calls answered with a prefetched sandbox."""
        self.skipped = 0
        """Prefetches not made for want of a sandbox server slot to spare (the caller made one when needed)."""
        self.failed_starts = 0
        """Prefetches whose start failed (the caller started a fresh sandbox instead)."""
        self.unstarted = 0
        """Prefetches still queued (not begun) when taken, cancelled: the caller started a fresh sandbox."""
        self.stop_errors = 0
        """Stops that raised (logged; the sandbox's outcome stands)."""

    @property
    def closed(self) -> bool:
        """close() was called: nothing new is started or handed out."""
        return self._closed

    # -- handing out ---------------------------------------------------------------------------------------

    def room(self) -> int:
        """How many more sandboxes prefetch() would start now."""
        with self._lock:
            return 0 if self._closed else max(0, self.capacity - self._n_waiting)

    def prefetch(self, key: str, make: Callable[[], Sandbox], then: Callable[[], None] | None = None) -> bool:
        """Start `make()`'s sandbox in the background for a later take(key); False when full or closed.

        then: called (from the starting thread) once that start has ended, however it ended.
        """
        with self._lock:
            if self._closed or self._n_waiting >= self.capacity:
                return False
            fut = self._starter.submit(self._start, make)
            self._waiting[key].append(fut)
            self._n_waiting += 1
            self.prefetched += 1
        if then is not None:
            fut.add_done_callback(lambda _: _call_quietly(then))
        return True

    def _start(self, make: Callable[[], Sandbox]) -> Sandbox:
        with ahead_of_need(self.reserve):
            sandbox = make()
        try:
            sandbox.start()
        except BaseException:
            self._stop_now(sandbox)
            raise
        return sandbox

    def _pop(self, key: str) -> Future | None:
        """The oldest prefetch for key, no longer waiting to be taken (None if there is none)."""
        with self._lock:
            queue = self._waiting.get(key)
            if self._closed or not queue:
                return None
            fut = queue.popleft()
            if not queue:
                del self._waiting[key]
            self._n_waiting -= 1
            return fut

    def take(self, key: str) -> Leased | None:
        """The oldest sandbox prefetched for key, started (waits while it starts); None if there is none,
        it was skipped, its start failed, or it has not begun: one still queued behind other prefetches is
        cancelled, so the caller starts its own now instead of waiting for those (with a thousand episodes
        in flight the queue of the 4 starter threads was minutes long: tools/sim_scale.py)."""
        fut = self._pop(key)
        if fut is None:
            return None
        if fut.cancel():
            with self._lock:
                self.unstarted += 1
            return None
        try:
            sandbox = fut.result()
        except NoFreeSlot as e:
            log.debug("the prefetch for %s was skipped: %s", key, e)
            with self._lock:
                self.skipped += 1
            return None
        except Exception as e:  # noqa: BLE001 - the caller starts a fresh one and reports its failure, if any
            log.warning("a prefetched sandbox for %s did not start (a fresh one is used): %s", key, e)
            with self._lock:
                self.failed_starts += 1
            return None
        claim = getattr(sandbox, "claim", None)
        if claim is not None:
            claim()  # in use now: no longer a slot taken ahead of need
        with self._lock:
            self.hits += 1
        return self._register(sandbox, started=True)

    def discard(self, key: str) -> None:
        """The oldest prefetch for key is not needed: cancelled if it has not begun, else stopped by the reaper
        once its start ends. Returns at once (the episode that will not be graded does not wait for the start
        of the sandbox it would have been graded in)."""
        fut = self._pop(key)
        if fut is None or fut.cancel():
            return
        with self._lock:
            self._stops.append(self._reaper.submit(self._stop_started, fut))

    def _stop_started(self, fut: Future) -> None:
        try:
            sandbox = fut.result()
        except Exception:  # noqa: BLE001 - it did not start (or was skipped): nothing to stop
            return
        self._stop_now(sandbox)

    def lease(self, sandbox: Sandbox, after_start: Callable[[], None] | None = None) -> Leased:
        """Hand out a sandbox the caller made (not started): tracked, and stopped in the background;
        after_start: see Leased."""
        return self._register(sandbox, started=False, after_start=after_start)

    def _register(
        self, sandbox: Sandbox, started: bool, after_start: Callable[[], None] | None = None
    ) -> Leased:
        leased = Leased(sandbox, self, started, after_start)
        with self._lock:
            if not self._closed:
                self._live.add(leased)
                return leased
        self._stop_now(sandbox)
        raise SandboxError("the sandbox pool is closed (the rollout ended or was cancelled)")

    # -- stopping ------------------------------------------------------------------------------------------

    def _release(self, leased: Leased, defer: bool) -> None:
        with self._lock:
            self._live.discard(leased)
            background = self.background_stop and not self._closed
            if defer:  # start() is running: it stops the sandbox when it returns
                self._deferred.add(leased)
                return
            if background:
                self._stops.append(self._reaper.submit(self._stop_now, leased.sandbox))
                self._stops = [f for f in self._stops if not f.done()]
                return
        self._stop_now(leased.sandbox)

    def _forget(self, leased: Leased) -> None:
        with self._lock:
            self._deferred.discard(leased)

    def _stop_now(self, sandbox: Sandbox) -> None:
        try:
            sandbox.stop()
        except Exception as e:  # noqa: BLE001 - a failing stop must not take other sandboxes with it
            with self._lock:
                self.stop_errors += 1
            log.warning("stopping a sandbox failed: %s", e)

    def stop_live(self) -> int:
        """Stop every handed-out sandbox now (commands running in them end with SandboxError); returns how many."""
        with self._lock:
            live = list(self._live)
        for leased in live:
            leased.stop()
        return len(live)

    def close(self) -> None:
        """Stop everything of the pool (waiting, starting, handed out) and wait for it; idempotent."""
        with self._lock:
            self._closed = True
            waiting = [f for queue in self._waiting.values() for f in queue]
            self._waiting.clear()
            self._n_waiting = 0
            live = list(self._live)
            self._live.clear()
            stops = list(self._stops)
        for leased in live:
            leased.stop()  # the pool is closed: stops inline (or, mid-start, when start returns)
        with self._lock:
            deferred = list(self._deferred)
        for leased in deferred:
            leased._idle.wait()
        for fut in waiting:
            with contextlib.suppress(Exception):
                self._stop_now(fut.result())
        for fut in stops:
            with contextlib.suppress(Exception):
                fut.result()
        self._starter.shutdown(wait=True)
        self._reaper.shutdown(wait=True)

    def __enter__(self) -> Prewarmer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
