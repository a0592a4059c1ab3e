"""Run tasks x G episodes concurrently, grade model outcomes, retry infrastructure failures, write JSONL.

Each episode gets a fresh sandbox and a sticky engine session ("TASK/SAMPLE/ATTEMPT"). Endings that are model
outcomes (submit, turn/context/format limit) are graded; infrastructure failures (engine, sandbox, grading,
harness errors) are retried up to `agent.infra_retries` times and, if they persist, kept but excluded
(`Trajectory.excluded`), never scored 0 (design.md invariant 4). Drifted trajectories are masked and
counted (invariant 1).

Time limits: an episode past agent.episode_timeout_s ends as harness_timeout (excluded, counted, not
retried). Past agent.rollout_timeout_s the episodes and gradings still running are stopped, those not
started are skipped, and after a short grace the call returns without waiting for stragglers (a thread
stuck in a generation request finishes in the background; its result is dropped); all of them are
harness_timeout trajectories counted in `RolloutStats.cancelled`.

Sandbox lifecycle off the critical path (sandbox/prewarm.py): the next episodes' sandboxes start in the
background while the current ones run (agent.prewarm_sandboxes), each episode's grading sandbox (a clean
copy of the task repository, never the agent's sandbox) starts while the episode runs (agent.prewarm_grading),
and finished sandboxes are stopped by a reaper thread (agent.background_teardown). Every episode and every
grading still gets a sandbox of its own, and nothing started here outlives run_rollouts, errors included.
On sandbox servers with limited slots a sandbox started ahead takes only a slot the running episodes cannot
need (agent.concurrency of them stay free for their own sandboxes and gradings) and never waits for one;
without such a slot it is skipped (`RolloutStats.prewarm["skipped"]`) and the sandbox starts when needed.

Concurrency model (all in the caller's process: rank 0's in synchronous training, eval and the warm start; in
async training (algo.max_staleness >= 1) the RL units' rollouts run in a process of their own, so that the
trainer's process shares its GIL with none of this: pipeline/rollout_process.py):
- `agent.concurrency` episode threads ("episode-N", one ThreadPoolExecutor per call) each run rollout_one for
  one job at a time: its sandbox start, every turn (a blocking generate() on the session's engine server, then
  a blocking sandbox exec), the provenance check, grading. Episodes in flight = agent.concurrency, bounded by
  the sandbox slots (config/validate.py) and, on the engines, by nothing here (each server queues).
- The caller's thread (_collect) records finished trajectories (JSONL, counts, progress) and enforces the
  rollout deadline; it never runs an episode.
- Per sandbox pool (sandbox/prewarm.py): up to 4 "-warm" threads start sandboxes ahead of need (one not begun
  when its episode needs it is cancelled, never waited for), 2 "-reap" threads stop finished ones; per
  episode with a deadline, one threading.Timer that stops its sandbox.
- Connections: to each engine server and each sandbox server a pool of kept HTTP/1.1 connections
  (net.ConnectionPool, at most one per request in flight), plus one session-holding thread per sandbox server.
  Sandbox starts are paced per server by its max_starting (sandbox/client.py `start_slots`): at a phase's
  start every episode asks at once, and the starts wait here, not in the server's queue.
- Shared state behind locks: routing (rollout/routing.py Rotation, a Condition), the prompt-JSON cache
  (PromptJson), the tokenizer's small LRU caches. Everything else an episode touches is its own.
- Memory: glibc gives each new thread a malloc arena of its own (up to 8 per core), and each arena keeps the
  peak of the large transient buffers its thread made (a turn's request body, an observation's encoding, the
  trajectory's JSON line) however short-lived. With hundreds of episode threads that retained memory, not the
  episodes' live data, was most of the controller's RSS, so the process's arenas are capped at MALLOC_ARENAS
  (`few_malloc_arenas`, before the episode threads start; an explicit MALLOC_ARENA_MAX wins).
tools/sim_scale.py measures what this costs per turn and per episode in flight (docs/benchmarks.md, "Scale").
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from swe_megatron.agent.episode import EPISODE_TIMEOUT, Episode, EpisodeLimits, Scaffold
from swe_megatron.agent.prompts import Prompts
from swe_megatron.agent.tokens import ChatFormat, ProvenanceReport
from swe_megatron.config.schema import AgentConfig
from swe_megatron.engine.base import Engine
from swe_megatron.engine.scripted import SESSION_SEP
from swe_megatron.sandbox.base import Sandbox, SandboxError
from swe_megatron.sandbox.prewarm import Leased, Prewarmer
from swe_megatron.tasks.schema import Task
from swe_megatron.trajectory import ExitReason, Trajectory

log = logging.getLogger(__name__)


@dataclass
class GradeOutcome:
    """What grading one patch said."""

    reward: float
    """1.0 if the task's tests pass with the patch, else 0.0."""
    resolved: bool
    """SWE-bench "resolved"."""
    infra_failure: str | None = None
    """Set when grading itself failed (not the patch's fault): the trajectory is excluded."""
    seconds: float = 0.0
    """Wall-clock seconds of the commands grading ran (apply + test run), the raw cost for overhead figures;
    not the grading sandbox's start and stop, which are harness overhead."""
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds per grading phase (start, apply, tests, stop) where the grader reports them."""
    flags: list[str] = field(default_factory=list)
    """What grading flagged ("suspicious", "tampered", "harness_fault"; Trajectory.grading_flags)."""


Grader = Callable[..., GradeOutcome]
"""grade(task, patch) -> GradeOutcome. A grader paired with RolloutSetup.grade_sandbox also takes a keyword
`sandbox`: a sandbox made by grade_sandbox(task), perhaps started already, to grade in (the grader stops it)."""

TIMEOUT = "timeout: "
"""Prefix of `Trajectory.infra_failure` for episodes a time limit ended (exit harness_timeout)."""
CANCELLED = TIMEOUT + "rollout deadline: "
"""Prefix for episodes that agent.rollout_timeout_s stopped or skipped."""


@dataclass
class RolloutSetup:
    """Everything episodes need besides the tasks."""

    engine: Engine
    """Generation (sticky per session across servers)."""
    make_sandbox: Callable[[Task], Sandbox]
    """A new, not started sandbox for a task (local backend or a sandbox server's client)."""
    grade: Grader
    """Grades a patch."""
    chat: ChatFormat
    """Tokenizer + chat template."""
    prompts: Prompts
    """Prompt templates."""
    agent: AgentConfig
    """Scaffold settings, concurrency and retries."""
    limits: EpisodeLimits
    """Per-stage limits."""
    workdir: str = "/testbed"
    """Where the repository is inside the sandbox."""
    grade_sandbox: Callable[[Task], Sandbox] | None = None
    """A new, not started grading sandbox for a task (a clean copy of its repository); when set, `grade`
    takes it as `sandbox=`, and the manager can start it while the episode runs (agent.prewarm_grading)
    and stop it in the background. None: the grader makes and stops its own."""
    provenance: Callable[..., ProvenanceReport] | None = None
    """Scaffold.provenance: the provenance check off the episode threads (a ProvenancePool); None: on them."""

    @property
    def scaffold(self) -> Scaffold:
        """What the episodes share."""
        return Scaffold(self.engine, self.chat, self.prompts, self.agent, self.limits, self.provenance)


@dataclass
class RolloutStats:
    """Counts and timings of one rollout phase."""

    episodes: int = 0
    exit_reasons: Counter = field(default_factory=Counter)
    infra_failures: int = 0
    """Trajectories still an infrastructure failure after their retries (excluded)."""
    timeouts: int = 0
    """Trajectories a time limit ended (agent.episode_timeout_s or rollout_timeout_s; among infra_failures)."""
    cancelled: int = 0
    """Episodes the rollout deadline stopped or never started (among timeouts)."""
    retries: int = 0
    drifted: int = 0
    retokenized_turns: int = 0
    resolved: int = 0
    malformed_turns: int = 0
    turns: int = 0
    seconds: dict[str, float] = field(default_factory=lambda: Counter())
    """Summed per-phase seconds over episodes: generate, tool, exec_raw, grade, grade_raw, episode."""
    wall_s: float = 0.0
    prewarm: dict[str, int] = field(default_factory=dict)
    """Sandbox pool counts: prefetched, hits (episodes and gradings served by a prefetched sandbox),
    skipped (prefetches not made for want of a spare sandbox server slot), failed_starts (prefetches that
    did not start), unstarted (prefetches not begun when needed, cancelled: a fresh one was started),
    stop_errors."""

    def add(self, traj: Trajectory, retries: int) -> None:
        """Count one finished trajectory."""
        self.episodes += 1
        self.exit_reasons[traj.exit_reason.value] += 1
        self.infra_failures += traj.infra_failure is not None or traj.exit_reason.is_infra
        failure = traj.infra_failure or ""
        self.timeouts += failure.startswith(TIMEOUT)
        self.cancelled += failure.startswith(CANCELLED)
        self.retries += retries
        self.drifted += traj.drifted
        self.retokenized_turns += traj.retokenized_turns
        self.resolved += traj.resolved
        self.malformed_turns += len(traj.malformed_turns)
        self.turns += traj.num_steps
        for k, v in traj.timings.items():
            self.seconds[k] += v

    def time_split(self) -> dict[str, float]:
        """Wall seconds of the rollout (rollout_s) and the shares of it spent grading (grade_s) and generating
        (generate_s): grading runs inside each episode's slot, so its share is reported apart."""
        episode_sum = max(self.seconds.get("episode", 0.0) + self.seconds.get("grade", 0.0), 1e-9)
        share = {k: self.wall_s * self.seconds.get(k, 0.0) / episode_sum for k in ("grade", "generate")}
        return {"rollout_s": self.wall_s, "grade_s": share["grade"], "generate_s": share["generate"]}

    def summary(self) -> dict:
        """A JSON-ready summary with episodes/minute."""
        return {
            "episodes": self.episodes,
            "episodes_per_min": 60 * self.episodes / self.wall_s if self.wall_s else 0.0,
            "wall_s": round(self.wall_s, 3),
            "resolved": self.resolved,
            "exit_reasons": dict(self.exit_reasons),
            "infra_failures": self.infra_failures,
            "timeouts": self.timeouts,
            "cancelled": self.cancelled,
            "retries": self.retries,
            "drifted": self.drifted,
            "retokenized_turns": self.retokenized_turns,
            "turns": self.turns,
            "malformed_turns": self.malformed_turns,
            "seconds": {k: round(v, 3) for k, v in sorted(self.seconds.items())},
            "prewarm": dict(self.prewarm),
        }


def _harness_failure(task: Task, k: int, e: BaseException) -> Trajectory:
    detail = "".join(traceback.format_exception_only(type(e), e)).strip()
    return Trajectory(
        task_id=task.instance_id,
        sample_index=k,
        exit_reason=ExitReason.harness_error,
        infra_failure=f"harness: {detail}",
    )


def _cancelled(task: Task, k: int, what: str) -> Trajectory:
    return Trajectory(
        task_id=task.instance_id,
        sample_index=k,
        exit_reason=ExitReason.harness_timeout,
        infra_failure=CANCELLED + what,
    )


class RolloutSandboxes:
    """The sandboxes of one run_rollouts call: lookahead starts, grading prewarm, background stops.

    For the agent.prewarm_sandboxes jobs after the ones running, in job order, the episode sandbox and (with
    agent.prewarm_grading) the grading sandbox are started ahead, keyed by task; an episode that finds no
    grading sandbox started for it (the first ones, retries) has one started when it begins. Every start
    ahead of need leaves agent.concurrency sandbox server slots free (each running episode needs one at a
    time: its sandbox, then its grading sandbox) and is skipped rather than waiting (see the module
    docstring). close() stops all of them, whatever happened.
    """

    def __init__(self, setup: RolloutSetup, jobs: list[tuple[Task, int]]):
        a = setup.agent
        self.setup = setup
        reserve = max(1, a.concurrency)
        self.episodes = Prewarmer(
            a.prewarm_sandboxes, reserve=reserve, background_stop=a.background_teardown, name="episode-sbx"
        )
        """Episode sandboxes (setup.make_sandbox)."""
        ahead = max(1, a.concurrency) + a.prewarm_sandboxes
        grading = a.prewarm_grading and setup.grade_sandbox is not None
        self.grading = Prewarmer(
            ahead if grading else 0, reserve=reserve, background_stop=a.background_teardown, name="grade-sbx"
        )
        """Grading sandboxes (setup.grade_sandbox)."""
        self._jobs = jobs
        self._next = min(max(1, a.concurrency), len(jobs))  # the first ones start right away: no lookahead
        self._ahead: Counter = Counter()  # grading sandboxes prefetched by the lookahead, per task
        self._lock = threading.Lock()

    def _top_up(self) -> None:
        with self._lock:
            while self._next < len(self._jobs) and self.episodes.room() > 0:
                task = self._jobs[self._next][0]
                self._next += 1
                self.episodes.prefetch(task.instance_id, functools.partial(self.setup.make_sandbox, task))
                if self.grading.capacity and self.grading.prefetch(
                    task.instance_id, functools.partial(self.setup.grade_sandbox, task)
                ):
                    self._ahead[task.instance_id] += 1

    def episode(self, task: Task) -> Leased:
        """A fresh sandbox for an episode of task (prefetched and started, or new and not started)."""
        with self._lock:
            ahead = self._ahead[task.instance_id] > 0
            if ahead:
                self._ahead[task.instance_id] -= 1

        def prefetch() -> None:  # this episode's grading sandbox first, then the lookahead
            if ahead or not self.grading.capacity:
                self._top_up()
                return
            make = functools.partial(self.setup.grade_sandbox, task)
            if not self.grading.prefetch(task.instance_id, make, then=self._top_up):
                self._top_up()

        sandbox = self.episodes.take(task.instance_id)
        if sandbox is not None:
            prefetch()
            return sandbox
        # a start the episode waits for: the background starts begin once it is done, not alongside it
        return self.episodes.lease(self.setup.make_sandbox(task), after_start=prefetch)

    def grade(self, task: Task, patch: str) -> GradeOutcome:
        """Grade through setup.grade, in a grading sandbox of ours when the setup can make one."""
        if self.setup.grade_sandbox is None:
            return self.setup.grade(task, patch)
        sandbox = self.grading.take(task.instance_id)
        if sandbox is None:
            try:
                made = self.setup.grade_sandbox(task)
            except Exception:  # noqa: BLE001 - e.g. a task that cannot be graded: the grader says what is wrong
                return self.setup.grade(task, patch)
            sandbox = self.grading.lease(made)
        try:
            return self.setup.grade(task, patch, sandbox=sandbox)
        finally:
            sandbox.stop()  # idempotent: the grader stops it unless it did not need it (an empty patch)

    def drop_grading(self, task: Task) -> None:
        """The episode will not be graded: the grading sandbox prefetched for it is cancelled or stopped (in
        the background)."""
        self.grading.discard(task.instance_id)

    @property
    def closed(self) -> bool:
        """close() was called: no sandbox is handed out any more."""
        return self.episodes.closed

    def stop_live(self) -> None:
        """Stop every sandbox in use now (running commands end with SandboxError)."""
        self.episodes.stop_live()
        self.grading.stop_live()

    def counts(self) -> dict[str, int]:
        """Pool counts for RolloutStats.prewarm."""
        pools = (self.episodes, self.grading)
        return {
            key: sum(getattr(p, key) for p in pools)
            for key in ("prefetched", "hits", "skipped", "failed_starts", "unstarted", "stop_errors")
        }

    def close(self) -> None:
        """Stop everything (waiting, starting, in use) and wait for the stops."""
        try:
            self.episodes.close()
        finally:
            self.grading.close()


def _deadline(*ends: float | None) -> float | None:
    ends = [e for e in ends if e is not None]
    return min(ends) if ends else None


def rollout_one(
    task: Task,
    k: int,
    setup: RolloutSetup,
    *,
    sandboxes: RolloutSandboxes | None = None,
    rollout_deadline: float | None = None,
) -> tuple[Trajectory, int]:
    """One sample of one task with infrastructure retries; returns (trajectory, retries used).

    sandboxes: the rollout's sandbox lifecycle (None: a private one for this call); rollout_deadline:
    time.monotonic() of agent.rollout_timeout_s, past which nothing new starts and the episode is cancelled.
    """
    own = sandboxes is None
    if own:
        sandboxes = RolloutSandboxes(setup, [])
    try:
        return _rollout_one(task, k, setup, sandboxes, rollout_deadline)
    finally:
        if own:
            sandboxes.close()


def _rollout_one(task, k, setup, sandboxes, rollout_deadline) -> tuple[Trajectory, int]:
    """See rollout_one. The returned trajectory's timings["retried"]: the wall seconds of the attempts before
    it that failed and were retried (what faults cost this sample)."""
    traj, retried = None, 0.0
    limit = setup.agent.episode_timeout_s
    for attempt in range(setup.agent.infra_retries + 1):
        if sandboxes.closed and traj is not None:  # the rollout ended (an error elsewhere): no retry
            return traj, attempt
        if _past(rollout_deadline):
            what = "not started" if traj is None else f"not retried after: {traj.infra_failure}"
            return _retried(_cancelled(task, k, what), retried), attempt
        session = SESSION_SEP.join([task.instance_id, str(k), str(attempt)])
        episode_deadline = time.monotonic() + limit if limit > 0 else None
        started = time.perf_counter()
        traj = _attempt(task, k, setup, sandboxes, session, _deadline(episode_deadline, rollout_deadline))
        _retried(traj, retried)
        retried += time.perf_counter() - started
        if traj.infra_failure is None and not traj.exit_reason.is_infra:
            return traj, attempt
        detail = (traj.infra_failure or "").removeprefix(EPISODE_TIMEOUT).strip(" ()")
        if _past(rollout_deadline):
            traj.exit_reason = ExitReason.harness_timeout
            traj.infra_failure = CANCELLED + (f"stopped ({detail})" if detail else "stopped")
            return traj, attempt
        if traj.exit_reason == ExitReason.harness_timeout:
            traj.infra_failure = f"{TIMEOUT}past agent.episode_timeout_s={limit:g} s" + (
                f" ({detail})" if detail else ""
            )
            return traj, attempt  # a straggler is not run again: it would most likely straggle again
    return traj, setup.agent.infra_retries


def _retried(traj: Trajectory, seconds: float) -> Trajectory:
    if seconds:
        traj.timings["retried"] = seconds
    return traj


def _past(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() >= deadline


def _attempt(task, k, setup, sandboxes, session: str, deadline: float | None) -> Trajectory:
    """One episode of task, graded when its ending is a model outcome and its tokens did not drift."""
    graded = False
    try:
        sandbox = sandboxes.episode(task)
        spec = sandbox.spec  # backends made from a SandboxSpec know their workdir
        workdir = spec.workdir if spec is not None else setup.workdir
        traj = Episode(setup.scaffold, task, k, sandbox, workdir, session, deadline).run()
        if not traj.exit_reason.is_infra and not traj.drifted:
            graded = True
            _grade(traj, task, sandboxes)
    except Exception as e:  # noqa: BLE001 - a harness bug must not kill the other episodes; it is counted
        traj = _harness_failure(task, k, e)
    if not graded:
        sandboxes.drop_grading(task)
    return traj


def _grade(traj: Trajectory, task: Task, sandboxes: RolloutSandboxes) -> None:
    """Grade traj's patch into its reward, resolved flag, grading flags and timings."""
    t = time.perf_counter()
    try:
        g = sandboxes.grade(task, traj.patch)
    except SandboxError:
        raise  # the grading sandboxes' own machinery (closed, lost): excluded as before
    except Exception:  # noqa: BLE001 - grading crashed on what the agent produced: scored, not excluded
        log.exception("grading %s crashed on the episode's patch (scored 0, harness_fault)", task.instance_id)
        g = GradeOutcome(0.0, False, flags=["harness_fault"])
    traj.timings["grade"] = time.perf_counter() - t
    traj.timings["grade_raw"] = g.seconds
    for phase in ("start", "stop"):
        if phase in g.timings:
            traj.timings[f"grade_sandbox_{phase}"] = g.timings[phase]
    traj.reward, traj.resolved, traj.grading_flags = g.reward, g.resolved, list(g.flags)
    if g.infra_failure:
        traj.infra_failure = f"grading: {g.infra_failure}"


class _Record:
    """Finished trajectories of a run_rollouts call: kept by (job, sample), counted, appended to the JSONL
    file and shown on the progress bar."""

    def __init__(self, jobs: int, out_file: str | Path | None, progress: bool | str):
        self.results: dict[tuple[int, int], Trajectory] = {}
        self.stats = RolloutStats()
        # backslashreplace: a lone surrogate (a non-UTF-8 byte in a patch, decoded with surrogateescape) can
        # only sit inside a JSON string, where its backslash-u form is the JSON escape that reads back as the
        # same text.
        self.sink = open(out_file, "a", encoding="utf-8", errors="backslashreplace") if out_file else None  # noqa: SIM115
        label = progress if isinstance(progress, str) else "rollout"  # the unit's name, on a run
        self.bar = tqdm(total=jobs, desc=label, unit="ep", dynamic_ncols=True) if progress else None

    def __call__(self, key: tuple[int, int], traj: Trajectory, retries: int) -> None:
        """Record one finished trajectory."""
        self.results[key] = traj
        self.stats.add(traj, retries)
        if self.sink:
            self.sink.write(traj.to_json() + "\n")
            self.sink.flush()
        if self.bar is not None:
            s = self.stats
            self.bar.set_postfix(resolved=s.resolved, infra=s.infra_failures, drift=s.drifted)
            self.bar.update(1)

    def close(self) -> None:
        """Close the file and the bar."""
        if self.bar is not None:
            self.bar.close()
        if self.sink:
            self.sink.close()


MALLOC_ARENAS = 2
"""glibc malloc arenas of a process that runs rollouts. At 32 episodes in flight with contexts grown to 131k
(mean 87k), RSS above idle per episode in flight: 9.1 MiB with glibc's default, 5.4 MiB capped here, 3.8 MiB
with MALLOC_ARENA_MAX=2 from the process's start (docs/benchmarks.md, "Scale"). Python's own allocator serves
small objects under the GIL either way."""

_M_ARENA_MAX = -8
"""mallopt's parameter number for the arena cap (glibc malloc.h)."""


@functools.cache
def few_malloc_arenas() -> bool:
    """Cap this process's glibc malloc arenas at MALLOC_ARENAS (once; arenas made before stay). False when the
    C library is not glibc or MALLOC_ARENA_MAX is set (the user's choice stands)."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    return mallopt(_M_ARENA_MAX, MALLOC_ARENAS) == 1


def run_rollouts(
    tasks: list[Task],
    samples_per_task: int,
    setup: RolloutSetup,
    out_file: str | Path | None = None,
    progress: bool | str = True,
    *,
    timeout_s: float | None = None,
    cancel_grace_s: float = 2.0,
) -> tuple[list[Trajectory], RolloutStats]:
    """All tasks x samples, `agent.concurrency` at a time; trajectories in (task, sample) order.

    progress: show a progress bar (a string: the bar's label, e.g. the unit's name).

    timeout_s: wall-clock limit of the whole call (None: agent.rollout_timeout_s; 0: none). Past it the
    running episodes and gradings are stopped, the rest skipped; after cancel_grace_s more the call
    returns with every unfinished job as a cancelled trajectory.
    """
    jobs = [(t, k) for t in tasks for k in range(samples_per_task)]
    record = _Record(len(jobs), out_file, progress)
    limit = setup.agent.rollout_timeout_s if timeout_s is None else timeout_s
    t0 = time.perf_counter()
    deadline = time.monotonic() + limit if limit and limit > 0 else None
    few_malloc_arenas()  # before any thread of this call starts (the sandbox pools' included)
    sandboxes = RolloutSandboxes(setup, jobs)
    pool = ThreadPoolExecutor(max_workers=max(1, setup.agent.concurrency), thread_name_prefix="episode")
    futures: dict[Future, tuple[int, int]] = {}
    cancelled = False
    try:
        for i, (t, k) in enumerate(jobs):
            fut = pool.submit(rollout_one, t, k, setup, sandboxes=sandboxes, rollout_deadline=deadline)
            futures[fut] = (i, k)
        cancelled = _collect(futures, record, sandboxes, deadline, cancel_grace_s)
        for fut, key in futures.items():  # skipped, or still running past the grace: cancelled
            if key not in record.results:
                what = "not started" if fut.cancelled() else f"still running {cancel_grace_s:g} s past it"
                record(key, _cancelled(jobs[key[0]][0], key[1], what), 0)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        try:
            sandboxes.close()  # also ends the commands of episodes still running (an error, the deadline)
            if not cancelled:  # an error: let the other episodes see their sandboxes gone
                wait([f for f in futures if not f.done()], timeout=cancel_grace_s)
        finally:
            record.stats.prewarm = sandboxes.counts()
            record.stats.wall_s = time.perf_counter() - t0
            record.close()
    return [record.results[key] for key in sorted(record.results)], record.stats


def _collect(futures: dict[Future, tuple[int, int]], record: _Record, sandboxes: RolloutSandboxes,
             deadline: float | None, grace_s: float) -> bool:  # fmt: skip
    """Record the jobs as they finish until all are done, or until grace_s past the deadline (at which what
    runs is stopped and what waits is skipped); whether the deadline was reached."""
    pending = set(futures)
    cancelled_at = None
    while pending:
        now = time.monotonic()
        if deadline is not None and now >= deadline and cancelled_at is None:
            cancelled_at = now  # stop what runs, skip what waits, give the stops a moment
            for fut in pending:
                fut.cancel()
            sandboxes.stop_live()
        if cancelled_at is not None:
            wait_s = cancelled_at + grace_s - now
            if wait_s <= 0:
                break
        else:
            wait_s = None if deadline is None else deadline - now
        done, pending = wait(pending, timeout=wait_s, return_when=FIRST_COMPLETED)
        for fut in done:
            if not fut.cancelled():
                record(futures[fut], *fut.result())
    return cancelled_at is not None
