"""Run tasks x G episodes concurrently, grade model outcomes, retry infrastructure failures, write JSONL.

Each episode gets a fresh sandbox and a sticky engine session ("TASK/SAMPLE/ATTEMPT"). Endings that are model
outcomes (submit, turn/context/format limit) are graded; infrastructure failures (engine, sandbox, grading,
harness errors) are retried up to `agent.infra_retries` times and, if they persist, kept but excluded
(`Trajectory.excluded`), never scored 0 (design.md invariant 4). Drifted trajectories are masked and
counted (invariant 1).
"""

from __future__ import annotations

import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from swe_megatron.agent.episode import EpisodeLimits, run_episode
from swe_megatron.agent.prompts import Prompts
from swe_megatron.agent.tokens import ChatFormat
from swe_megatron.config.schema import AgentConfig
from swe_megatron.engine.base import Engine
from swe_megatron.engine.scripted import SESSION_SEP
from swe_megatron.sandbox.base import Sandbox
from swe_megatron.tasks.schema import Task
from swe_megatron.trajectory import ExitReason, Trajectory


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
    """Wall-clock seconds of the test run (raw cost, for overhead figures)."""


Grader = Callable[[Task, str], GradeOutcome]
"""grade(task, patch) -> GradeOutcome."""


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


@dataclass
class RolloutStats:
    """Counts and timings of one rollout phase."""

    episodes: int = 0
    exit_reasons: Counter = field(default_factory=Counter)
    infra_failures: int = 0
    """Trajectories still an infrastructure failure after their retries (excluded)."""
    retries: int = 0
    drifted: int = 0
    retokenized_turns: int = 0
    resolved: int = 0
    malformed_turns: int = 0
    turns: int = 0
    seconds: dict[str, float] = field(default_factory=lambda: Counter())
    """Summed per-phase seconds over episodes: generate, tool, exec_raw, grade, grade_raw, episode."""
    wall_s: float = 0.0

    def add(self, traj: Trajectory, retries: int) -> None:
        """Count one finished trajectory."""
        self.episodes += 1
        self.exit_reasons[traj.exit_reason.value] += 1
        self.infra_failures += traj.infra_failure is not None or traj.exit_reason.is_infra
        self.retries += retries
        self.drifted += traj.drifted
        self.retokenized_turns += traj.retokenized_turns
        self.resolved += traj.resolved
        self.malformed_turns += len(traj.malformed_turns)
        self.turns += traj.num_steps
        for k, v in traj.timings.items():
            self.seconds[k] += v

    def summary(self) -> dict:
        """A JSON-ready summary with episodes/minute."""
        return {
            "episodes": self.episodes,
            "episodes_per_min": 60 * self.episodes / self.wall_s if self.wall_s else 0.0,
            "wall_s": round(self.wall_s, 3),
            "resolved": self.resolved,
            "exit_reasons": dict(self.exit_reasons),
            "infra_failures": self.infra_failures,
            "retries": self.retries,
            "drifted": self.drifted,
            "retokenized_turns": self.retokenized_turns,
            "turns": self.turns,
            "malformed_turns": self.malformed_turns,
            "seconds": {k: round(v, 3) for k, v in sorted(self.seconds.items())},
        }


def _harness_failure(task: Task, k: int, e: BaseException) -> Trajectory:
    detail = "".join(traceback.format_exception_only(type(e), e)).strip()
    return Trajectory(
        task_id=task.instance_id,
        sample_index=k,
        exit_reason=ExitReason.harness_error,
        infra_failure=f"harness: {detail}",
    )


def rollout_one(task: Task, k: int, setup: RolloutSetup) -> tuple[Trajectory, int]:
    """One sample of one task with infrastructure retries; returns (trajectory, retries used)."""
    traj = None
    for attempt in range(setup.agent.infra_retries + 1):
        session = SESSION_SEP.join([task.instance_id, str(k), str(attempt)])
        try:
            sandbox = setup.make_sandbox(task)
            spec = getattr(sandbox, "spec", None)  # backends made from a SandboxSpec know their workdir
            traj = run_episode(
                task,
                k,
                sandbox,
                setup.engine,
                setup.chat,
                setup.prompts,
                setup.agent,
                setup.limits,
                spec.workdir if spec is not None else setup.workdir,
                session,
            )
            if not traj.exit_reason.is_infra and not traj.drifted:
                t = time.perf_counter()
                g = setup.grade(task, traj.patch)
                traj.timings["grade"] = time.perf_counter() - t
                traj.timings["grade_raw"] = g.seconds
                traj.reward, traj.resolved = g.reward, g.resolved
                if g.infra_failure:
                    traj.infra_failure = f"grading: {g.infra_failure}"
        except Exception as e:  # noqa: BLE001 - a harness bug must not kill the other episodes; it is counted
            traj = _harness_failure(task, k, e)
        if traj.infra_failure is None and not traj.exit_reason.is_infra:
            return traj, attempt
    return traj, setup.agent.infra_retries


def run_rollouts(
    tasks: list[Task],
    samples_per_task: int,
    setup: RolloutSetup,
    out_file: str | Path | None = None,
    progress: bool = True,
) -> tuple[list[Trajectory], RolloutStats]:
    """All tasks x samples, `agent.concurrency` at a time; trajectories in (task, sample) order."""
    jobs = [(t, k) for t in tasks for k in range(samples_per_task)]
    stats = RolloutStats()
    results: dict[tuple[int, int], Trajectory] = {}
    lock = threading.Lock()
    sink = open(out_file, "a", encoding="utf-8") if out_file else None  # noqa: SIM115 - closed below
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(jobs), desc="rollout", unit="ep", dynamic_ncols=True)
    t0 = time.perf_counter()
    try:
        with ThreadPoolExecutor(max_workers=max(1, setup.agent.concurrency)) as pool:
            futures = {pool.submit(rollout_one, t, k, setup): (i, k) for i, (t, k) in enumerate(jobs)}
            for fut in as_completed(futures):
                traj, retries = fut.result()
                with lock:
                    results[futures[fut]] = traj
                    stats.add(traj, retries)
                    if sink:
                        sink.write(traj.to_json() + "\n")
                        sink.flush()
                if bar is not None:
                    bar.set_postfix(resolved=stats.resolved, infra=stats.infra_failures, drift=stats.drifted)
                    bar.update(1)
    finally:
        stats.wall_s = time.perf_counter() - t0
        if bar is not None:
            bar.close()
        if sink:
            sink.close()
    return [results[key] for key in sorted(results)], stats
