"""Spread episodes over many sandbox servers and vLLM servers; take dead servers out of rotation.

    sandboxes = SandboxPool.connect(rv.sandbox_servers, rv.token)   # a sandbox factory: sandboxes.sandbox(spec)
    engine = RoutedEngine.vllm(rv.engines, "policy", cfg.sampling, [eos_id])
    rollouts = Rollouts(cfg, engine, sandboxes)                      # rollout/setup.py, once per run
    trajs, stats = rollouts.run(tasks, G, limits, out_dir)           # ServersDown if a kind is all gone

Placement: a new sandbox goes to the live server holding the fewest of this run's sandboxes (ties in turn),
not past the server's max_concurrent. A sandbox needed now waits for a slot while every live server is full
(at most SLOT_WAIT_S, then it overcommits, which the server may refuse). A sandbox made ahead of need (the
rollout manager's prefetches, made inside sandbox.base.ahead_of_need(reserve)) never waits: it is placed only
while the sandboxes placed ahead and not yet claimed by their user, itself included, leave `reserve` slots of
the live servers (the rollout's agent.concurrency: one per running episode) to the sandboxes needed now;
else it is not made (NoFreeSlot). So a prefetched sandbox never holds a slot that a running episode's own
sandbox or grading waits for. An episode's
engine session sticks to one vLLM server (its prefix cache), assigned the same way on the first turn.

Failover: a SandboxError or EngineError from a server triggers a short health probe of that server, repeated
twice more over ~6 s while it fails. A server that answers none is out of rotation for the rest of the run
(one warning): a killed one refuses at once, and an overloaded one that misses one probe is not dropped (at 1024
episodes in flight a dropped slow server's load made the next one slow: tools/sim_scale.py). A server that
answers stays (the error was the request's: an unusable answer, a sandbox that failed to start). The failing
episode stays what it already is, an infrastructure failure, which rollout_one retries (agent.infra_retries)
as a new episode placed on a live server; episodes still pinned to the dead server fail at their next call.
With no server of a kind left, placement fails at once, the remaining episodes end quickly as
infrastructure failures, and check_servers() turns that into one ServersDown error for the iteration.
A server that hangs instead of dying is noticed when a request to it times out (engine.request_timeout_s,
the command's timeout + 60 s for sandboxes).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from swe_megatron.engine.base import EngineError, Generation
from swe_megatron.engine.vllm import VllmEngine
from swe_megatron.errors import UsageError
from swe_megatron.net import http_health
from swe_megatron.sandbox.base import (
    ExecResult,
    NoFreeSlot,
    SandboxError,
    SandboxServerLost,
    SandboxSpec,
    slot_reserve,
)
from swe_megatron.sandbox.client import SandboxClient

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 10.0
"""Timeout of one health probe of a server after a failed request."""
PROBE_ATTEMPTS = 3
"""Probes of a server after a failed request before it is out of rotation (a dead one refuses each at once; an
overloaded one that misses one probe is not dead, and dropping it would pile its load on the others)."""
PROBE_INTERVAL_S = 2.0
"""Wait before the second probe (doubling after it)."""
SLOT_WAIT_S = 120.0
"""Longest wait of a needed placement for a free sandbox slot before placing over a server's max_concurrent
anyway (a run that needs more sandboxes at once than the servers allow: more episodes than slots)."""


class ServersDown(UsageError):
    """Every server of one kind is out of rotation: the iteration cannot go on (nothing is committed)."""


class NoServerLeft(RuntimeError):
    """Placement found no live server (raised as SandboxError / EngineError by the callers below)."""


class NoRoom(RuntimeError):
    """A speculative placement found no slot to spare (raised as NoFreeSlot by SandboxPool)."""


class Rotation:
    """Live/dead state and load of the servers of one kind (thread-safe)."""

    def __init__(
        self,
        kind: str,
        names: Sequence[str],
        probe: Callable[[int], str | None],
        capacity: Sequence[int | None] | None = None,
    ):
        self.kind = kind
        """What the servers are, for messages ("sandbox server", "vLLM server")."""
        self.names = list(names)
        """Server names (URLs), by index."""
        self.capacity = list(capacity) if capacity is not None else [None] * len(self.names)
        """Most of our placements at once per server (None: no limit)."""
        self.load = [0] * len(self.names)
        """Our placements on each server now."""
        self.ahead = [0] * len(self.names)
        """Of those, the speculative placements not yet claimed (acquire(reserve=N), see claim())."""
        self.dead: dict[int, str] = {}
        """Servers out of rotation, with the reason."""
        self.slot_wait_s = SLOT_WAIT_S
        """How long a needed placement waits for a free slot when every live server is full."""
        self.longest_wait_s = 0.0
        """Longest time a placement waited for a free slot so far."""
        self.overcommits = 0
        """Placements made over a server's capacity after slot_wait_s (each warned)."""
        self.probe_attempts = PROBE_ATTEMPTS
        """Probes of a server after a failed request before it is dropped."""
        self.probe_interval_s = PROBE_INTERVAL_S
        """Wait before the second probe (doubling)."""
        self._probe = probe
        self._cond = threading.Condition()
        self._seq = itertools.count(1)
        self._last = [0] * len(self.names)

    @property
    def live(self) -> list[int]:
        """Indices of the servers still in rotation."""
        return [i for i in range(len(self.names)) if i not in self.dead]

    def is_dead(self, i: int) -> bool:
        """True once server i is out of rotation."""
        return i in self.dead

    def acquire(self, reserve: int | None = None) -> int:
        """A live server with room, the least loaded first; NoServerLeft if none lives.

        reserve None (a placement needed now): while all are full it waits up to slot_wait_s, then overcommits
        the least-loaded one (which may refuse: an infra failure). reserve N (a speculative placement, counted
        in `ahead` until claim() or release()): it never waits, and is made only when the unclaimed
        speculative placements, itself included, leave N slots of the live servers' capacity; else NoRoom.
        """
        t0 = time.monotonic()
        with self._cond:
            while True:
                live = self.live
                if not live:
                    raise NoServerLeft(self.down_message())
                free = [i for i in live if self.capacity[i] is None or self.load[i] < self.capacity[i]]
                if reserve is not None:
                    total = sum(float("inf") if self.capacity[i] is None else self.capacity[i] for i in live)
                    if not free or sum(self.ahead[i] for i in live) + 1 > total - reserve:
                        raise NoRoom(
                            f"no {self.kind} slot to spare ({reserve} kept for sandboxes needed now)"
                        )
                elif not free and time.monotonic() - t0 > self.slot_wait_s:
                    free = live  # never wait forever: a caller holding slots may be the one we wait for
                    self.overcommits += 1
                    log.warning(
                        "no %s had a free slot for %.0f s: placing over max_concurrent (more sandboxes needed "
                        "at once than the servers allow; it may be refused)", self.kind, self.slot_wait_s,
                    )  # fmt: skip
                if free:
                    i = min(free, key=lambda k: (self.load[k], self._last[k]))
                    self.load[i] += 1
                    self.ahead[i] += reserve is not None
                    self._last[i] = next(self._seq)
                    self.longest_wait_s = max(self.longest_wait_s, time.monotonic() - t0)
                    return i
                self._cond.wait(1.0)

    def claim(self, i: int) -> None:
        """A speculative placement on server i is now in use (it counts as needed from here on)."""
        with self._cond:
            self.ahead[i] = max(0, self.ahead[i] - 1)

    def release(self, i: int, ahead: bool = False) -> None:
        """One placement on server i has ended (ahead: a speculative one never claimed)."""
        with self._cond:
            self.load[i] = max(0, self.load[i] - 1)
            if ahead:
                self.ahead[i] = max(0, self.ahead[i] - 1)
            self._cond.notify_all()

    def failed(self, i: int, error: BaseException | str) -> bool:
        """A request to server i failed: probe it (up to probe_attempts times, probe_interval_s apart, doubling)
        ; True if it is (now) out of rotation: no probe answered."""
        for attempt in range(self.probe_attempts):
            if i in self.dead:
                return True
            if attempt:
                time.sleep(self.probe_interval_s * 2 ** (attempt - 1))
            reason = self._probe(i)
            if reason is None:
                return False
        tries = f" ({self.probe_attempts} probes)" if self.probe_attempts > 1 else ""
        self.drop(i, f"{error}; health probe{tries}: {reason}")
        return True

    def drop(self, i: int, reason: str) -> None:
        """Take server i out of rotation for the rest of the run (warns once)."""
        with self._cond:
            if i in self.dead:
                return
            self.dead[i] = reason
            self._cond.notify_all()
            left = len(self.live)
        log.warning(
            "%s %s is out of rotation for the rest of the run (%d of %d left): %s",
            self.kind, self.names[i], left, len(self.names), reason,
        )  # fmt: skip

    def down_message(self) -> str:
        """Why no server is left, naming each."""
        each = "; ".join(f"{self.names[i]}: {r}" for i, r in sorted(self.dead.items()))
        return f"no {self.kind} is left in rotation ({each})"


def check_servers(*routed) -> None:
    """ServersDown if any of the given SandboxPool / RoutedEngine objects has no live server left."""
    for r in routed:
        rot = getattr(r, "rotation", None)
        if rot is not None and not rot.live:
            raise ServersDown(
                f"{rot.down_message()}; the iteration is not committed: restart the servers (resubmit the "
                "Slurm job; their logs are in RUN_DIR/jobs/JOBID/logs) and rerun to resume"
            )


# --- sandboxes -------------------------------------------------------------------------------------------
class SandboxPool:
    """Many sandbox servers behind one sandbox factory (see the module docstring)."""

    def __init__(
        self,
        clients: Sequence[SandboxClient],
        capacity: Sequence[int | None] | None = None,
        probe_timeout_s: float = PROBE_TIMEOUT_S,
    ):
        if not clients:
            raise ValueError("SandboxPool needs at least one sandbox server")
        self.clients = list(clients)
        """One session per server, by index."""
        self.probe_timeout_s = probe_timeout_s
        self.rotation = Rotation("sandbox server", [c.url for c in self.clients], self._probe, capacity)

    @classmethod
    def connect(
        cls,
        urls: Sequence[str],
        token: str,
        *,
        command_timeout_s: float = 900.0,
        probe_timeout_s: float = PROBE_TIMEOUT_S,
    ) -> SandboxPool:
        """Sessions with every server in urls; one that does not answer is left out (warned), none: ServersDown."""
        clients = [SandboxClient(u, token, command_timeout_s=command_timeout_s) for u in urls]
        capacity, unreachable = [], {}
        for i, c in enumerate(clients):
            try:
                capacity.append(int(c.health(probe_timeout_s)["max_concurrent"]))
            except (SandboxError, OSError, KeyError, TypeError, ValueError) as e:
                capacity.append(None)
                unreachable[i] = f"not answering at start: {e}"
        pool = cls(clients, capacity, probe_timeout_s)
        for i, reason in unreachable.items():
            pool._drop(i, reason)
        try:
            check_servers(pool)
        except ServersDown:
            pool.close()
            raise
        return pool

    def _probe(self, i: int) -> str | None:
        try:
            self.clients[i].health(self.probe_timeout_s)
            return None
        except (SandboxError, OSError) as e:
            return str(e)

    def _drop(self, i: int, reason: str) -> None:
        self.rotation.drop(i, reason)
        self._close_later(i)

    def _close_later(self, i: int) -> None:
        # A dead client's session thread keeps reconnecting; close it off the caller's thread, since a hung
        # server makes close() wait for its request timeout.
        threading.Thread(target=self.clients[i].close, name="sandbox-close", daemon=True).start()

    def failed(self, i: int, error: BaseException) -> bool:
        """A request to server i failed: probe it, take it out of rotation if it does not answer; True if it
        is out of rotation."""
        was_dead = self.rotation.is_dead(i)
        dead = self.rotation.failed(i, error)
        if dead and not was_dead:
            self._close_later(i)
        return dead

    def sandbox(self, spec: SandboxSpec) -> RoutedSandbox | Unplaced:
        """A new sandbox (not started) on the least-loaded live server; with none left, one that fails to start.
        Inside sandbox.base.ahead_of_need(reserve): placed without waiting, only with `reserve` slots left to
        the sandboxes needed now, else NoFreeSlot; its user claim()s it (see the module docstring)."""
        reserve = slot_reserve()
        try:
            i = self.rotation.acquire(reserve)
        except NoServerLeft as e:
            return Unplaced(spec, str(e))
        except NoRoom as e:
            raise NoFreeSlot(str(e)) from None
        return RoutedSandbox(self, i, self.clients[i].sandbox(spec), ahead=reserve is not None)

    def close(self) -> None:
        """End every live server session (stops this run's sandboxes there); idempotent."""
        for i, c in enumerate(self.clients):
            if not self.rotation.is_dead(i):
                with contextlib.suppress(Exception):  # best effort while shutting down
                    c.close()


class RoutedSandbox:
    """A RemoteSandbox that reports server failures to its pool and frees its slot when stopped."""

    def __init__(self, pool: SandboxPool, index: int, inner, ahead: bool = False):
        self.pool = pool
        self.index = index
        """Index of its server in the pool."""
        self.inner = inner
        self.spec = inner.spec
        self.ahead = ahead
        """Placed ahead of need and not claimed yet (see claim())."""
        self._released = False
        self._lock = threading.Lock()

    @property
    def server(self) -> str:
        """URL of the server it lives on."""
        return self.pool.clients[self.index].url

    def _call(self, fn, *args, **kwargs):
        if self.pool.rotation.is_dead(self.index):
            raise SandboxServerLost(
                f"sandbox server {self.server} is out of rotation: {self.pool.rotation.dead[self.index]}"
            )
        try:
            return fn(*args, **kwargs)
        except SandboxError as e:
            if self.pool.failed(self.index, e):  # the server itself is gone, not just this sandbox
                raise SandboxServerLost(f"sandbox server {self.server} stopped answering: {e}") from e
            raise

    def claim(self) -> None:
        """Its user has it now: a sandbox placed ahead of need counts as needed from here on (idempotent)."""
        with self._lock:
            ahead, self.ahead = self.ahead, False
        if ahead:
            self.pool.rotation.claim(self.index)

    def start(self) -> None:
        """Start it on its server."""
        self._call(self.inner.start)

    def exec(self, command: str, timeout_s: float | None = None) -> ExecResult:
        """Run a command in its shell."""
        return self._call(self.inner.exec, command, timeout_s)

    def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        """Read a repository file (or its last max_bytes bytes)."""
        return self._call(self.inner.read_file, path, max_bytes)

    def write_file(self, path: str, data: bytes) -> None:
        """Write a repository file."""
        self._call(self.inner.write_file, path, data)

    def host_patch(self, max_bytes: int) -> str:
        """The workspace's diff, taken on its server's host."""
        return self._call(self.inner.host_patch, max_bytes)

    def stop(self) -> None:
        """Stop it (nothing to stop on a server out of rotation) and free its slot; idempotent."""
        try:
            if self.inner.id is not None and not self.pool.rotation.is_dead(self.index):
                self._call(self.inner.stop)
        finally:
            with self._lock:
                release, self._released = not self._released, True
                ahead, self.ahead = self.ahead, False
            if release:
                self.pool.rotation.release(self.index, ahead)

    def __enter__(self) -> RoutedSandbox:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class Unplaced:
    """The sandbox SandboxPool gives when no server is left: it fails like a dead server's (SandboxError), so
    the episode ends as a sandbox error."""

    def __init__(self, spec: SandboxSpec, reason: str):
        self.spec = spec
        self.reason = reason
        """Why it could not be placed."""

    def start(self) -> None:
        """Raises SandboxError."""
        raise SandboxError(self.reason)

    def exec(self, command: str, timeout_s: float | None = None) -> ExecResult:
        """Raises SandboxError."""
        raise SandboxError(self.reason)

    def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        """Raises SandboxError."""
        raise SandboxError(self.reason)

    def write_file(self, path: str, data: bytes) -> None:
        """Raises SandboxError."""
        raise SandboxError(self.reason)

    def host_patch(self, max_bytes: int) -> str:
        """Raises SandboxError."""
        raise SandboxError(self.reason)

    def stop(self) -> None:
        """Nothing to stop."""


# --- engines ---------------------------------------------------------------------------------------------
class RoutedEngine:
    """Many single-server engines behind one Engine: sticky sessions, dead servers dropped from routing."""

    def __init__(self, engines: Sequence, names: Sequence[str], probe: Callable[[int], str | None]):
        if not engines:
            raise ValueError("RoutedEngine needs at least one engine")
        self.engines = list(engines)
        self.rotation = Rotation("vLLM server", names, probe)
        self._lock = threading.Lock()
        self._route: dict[str, int] = {}

    @classmethod
    def vllm(
        cls,
        urls: Sequence[str],
        model: str,
        sampling,
        stop_token_ids: list[int],
        timeout_s: float = 600.0,
        probe_timeout_s: float = PROBE_TIMEOUT_S,
    ) -> RoutedEngine:
        """One VllmEngine per server URL."""
        urls = [u.rstrip("/") for u in urls]
        engines = [VllmEngine(u, model, sampling, stop_token_ids, timeout_s) for u in urls]
        return cls(engines, urls, lambda i: http_health(urls[i], probe_timeout_s))

    @property
    def urls(self) -> list[str]:
        """URLs of the servers still in rotation."""
        return [self.rotation.names[i] for i in self.rotation.live]

    def _server_for(self, session: str) -> int:
        with self._lock:
            i = self._route.get(session)
            if i is None:
                try:
                    i = self.rotation.acquire()
                except NoServerLeft as e:
                    raise EngineError(str(e)) from None
                if not session:  # no sticky key: just the least-loaded server for this request
                    self.rotation.release(i)
                    return i
                self._route[session] = i
        if self.rotation.is_dead(i):
            raise EngineError(
                f"vLLM server {self.rotation.names[i]} is out of rotation: {self.rotation.dead[i]}"
            )
        return i

    def generate(self, prompt_ids: list[int], max_tokens: int, session: str = "") -> Generation:
        """One turn on the session's server; an EngineError there gets the server probed."""
        i = self._server_for(session)
        try:
            return self.engines[i].generate(prompt_ids, max_tokens, session)
        except EngineError as e:
            self.rotation.failed(i, e)
            raise

    def end_session(self, session: str) -> None:
        """Free the session's server slot."""
        with self._lock:
            i = self._route.pop(session, None)
        if i is not None:
            self.rotation.release(i)
            self.engines[i].end_session(session)

    def reload_weights(self, path: str) -> None:
        """Every live server reloads from path, all at once; one that fails is dropped (it would serve stale
        weights)."""

        def reload(i: int) -> None:
            t = time.perf_counter()
            try:
                self.engines[i].reload_weights(path)
            except EngineError as e:
                self.rotation.drop(i, f"weight reload failed after {time.perf_counter() - t:.1f} s: {e}")

        live = self.rotation.live
        if live:
            with ThreadPoolExecutor(len(live)) as pool:
                list(pool.map(reload, live))
        check_servers(self)


def policy_engine(cfg, urls: Sequence[str], eos_id: int) -> RoutedEngine:
    """The run's policy on the vLLM servers at urls, sampling as cfg.sampling says (cfg: a RunConfig)."""
    return RoutedEngine.vllm(urls, "policy", cfg.sampling, [eos_id], cfg.engine.request_timeout_s)


def run_sandboxes(cfg, urls: Sequence[str], token: str) -> SandboxPool:
    """Sessions with the sandbox servers at urls; exec calls without a timeout allow for a grading's
    (cfg.sandbox.grade_timeout_s; cfg: a RunConfig)."""
    return SandboxPool.connect(urls, token, command_timeout_s=cfg.sandbox.grade_timeout_s)
