"""The run's rollout entry point: `Rollouts`, built once per run around the engine(s) and the sandbox pool.

Training iterations, the warm start, eval and `swe-megatron rollout` all call `Rollouts.run(tasks, G, limits,
out_dir)`; what does not change between calls (the chat format, the prompts, the episode and grading sandbox
factories) is made once, in the constructor.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

from swe_megatron.agent.episode import EpisodeLimits
from swe_megatron.agent.prompts import load_prompts
from swe_megatron.agent.tokens import ChatFormat, ProvenancePool
from swe_megatron.config.schema import EvalConfig, RunConfig, SandboxConfig, StageConfig
from swe_megatron.engine.base import Engine
from swe_megatron.grading.grader import grade_one, task_grading
from swe_megatron.model.tokenizer import load_tokenizer
from swe_megatron.net import raise_open_files
from swe_megatron.rollout.rollouts import GradeOutcome, Grader, RolloutSetup, RolloutStats, run_rollouts
from swe_megatron.rollout.routing import SandboxPool, check_servers
from swe_megatron.sandbox import make_sandbox
from swe_megatron.sandbox.base import Sandbox, SandboxSpec
from swe_megatron.tasks.plan import plan_of
from swe_megatron.tasks.schema import Task
from swe_megatron.trajectory import Trajectory


def open_files_needed(concurrency: int) -> int:
    """Descriptors the rollout controller may hold: per episode in flight a connection to its engine and one to
    its sandbox server (net.ConnectionPool), and its grading's; a margin for logs, servers' sessions, workers."""
    return 4 * concurrency + 256


SpecFactory = Callable[[SandboxSpec], Sandbox]
"""A new, not started sandbox for a spec."""


def spec_factory(cfg: SandboxConfig, sandboxes: SandboxPool | None = None) -> SpecFactory:
    """SandboxSpec -> a new sandbox on the sandbox servers of `sandboxes` when given, else of the configured
    local backend."""
    return sandboxes.sandbox if sandboxes is not None else lambda spec: make_sandbox(spec, cfg)


def sandbox_factory(cfg: SandboxConfig, sandboxes: SandboxPool | None = None) -> Callable[[Task], Sandbox]:
    """Task -> a new sandbox made as the task's grading plan says (tasks/plan.py: its repository and environment,
    or its image; see spec_factory for where)."""
    fresh = spec_factory(cfg, sandboxes)
    return lambda task: fresh(plan_of(task).sandbox_spec())


def grading_sandbox_factory(
    cfg: SandboxConfig, sandboxes: SandboxPool | None = None
) -> Callable[[Task], Sandbox]:
    """Task -> a new, not started sandbox to grade the task in (the spec grade_one asks for: a clean copy of
    the task's repository; see spec_factory for where)."""
    fresh = spec_factory(cfg, sandboxes)
    return lambda task: fresh(task_grading(task).spec)


def swebench_grader(
    cfg: SandboxConfig, log_root: str | Path | None = None, sandboxes: SandboxPool | None = None
) -> Grader:
    """Grades with grading.grader.grade_one in `sandbox` when given one made for the task's grading spec
    (possibly started already, e.g. by grading_sandbox_factory), else in a fresh sandbox (see spec_factory).

    GradeOutcome.seconds is the raw cost: the apply and test phases, not the sandbox's start and stop.
    """
    counter = itertools.count()
    fresh = spec_factory(cfg, sandboxes)

    def grade(task: Task, patch: str, sandbox: Sandbox | None = None) -> GradeOutcome:
        log_dir = Path(log_root) / task.instance_id / str(next(counter)) if log_root else None

        given = [sandbox]

        def factory(spec: SandboxSpec) -> Sandbox:
            # The given sandbox serves once: a control run (grading.exclusion) needs a fresh one.
            ready = given.pop() if given else None
            if ready is not None and getattr(ready, "spec", None) == spec:
                return ready
            return fresh(spec)

        r = grade_one(
            task,
            patch,
            factory,
            log_dir=log_dir,
            test_timeout_s=cfg.grade_timeout_s,
            max_patch_bytes=cfg.grade_max_patch_bytes,
            apply_timeout_s=cfg.grade_apply_timeout_s,
        )
        raw = sum(v for k, v in r.timings.items() if k in ("apply", "tests"))
        marks = (("suspicious", r.suspicious), ("tampered", r.tampered), ("harness_fault", r.harness_fault))
        flags = [name for name, on in marks if on]
        return GradeOutcome(r.reward or 0.0, r.resolved, r.error, raw, dict(r.timings), flags)

    return grade


class Rollouts:
    """Tasks x G graded episodes on the run's engine and sandbox pool: the one entry point of training
    iterations, the warm start and eval. Built once per run (the caller owns the engine's and the sandbox
    servers' lifetimes)."""

    def __init__(self, cfg: RunConfig, engine: Engine, sandboxes: SandboxPool | None = None,
                 chat: ChatFormat | None = None):  # fmt: skip
        self.cfg = cfg
        """The run's config (agent, sandbox, sampling, monitor.progress are read per call)."""
        self.engine = engine
        """The policy's engine (a RoutedEngine over the run's servers)."""
        self.sandboxes = sandboxes
        """The sandbox servers (None: the configured local backend)."""
        self.chat = chat or ChatFormat(load_tokenizer(cfg.model.tokenizer))
        """Tokenizer + chat template of model.tokenizer."""
        self.prompts = load_prompts(cfg.agent.prompts)
        """The agent's prompt templates."""
        self.make_sandbox = sandbox_factory(cfg.sandbox, sandboxes)
        """Task -> a new episode sandbox."""
        self.grade_sandbox = grading_sandbox_factory(cfg.sandbox, sandboxes)
        """Task -> a new grading sandbox (a clean copy of the task's repository)."""
        raise_open_files(
            open_files_needed(cfg.agent.concurrency), f"agent.concurrency={cfg.agent.concurrency}"
        )
        workers = cfg.agent.provenance_workers
        self.provenance = ProvenancePool(self.chat, workers) if workers > 0 else None
        """agent.provenance_workers > 0: the episodes' provenance checks run in these processes."""

    def limits(self, stage: StageConfig | EvalConfig) -> EpisodeLimits:
        """Episode limits of a stage (or of eval: no demonstration); the rest from sampling and sandbox."""
        return EpisodeLimits(
            t_max=stage.t_max,
            context_length=stage.context_length,
            max_tokens_per_turn=self.cfg.sampling.max_tokens_per_turn,
            command_timeout_s=self.cfg.sandbox.command_timeout_s,
            output_cap=self.cfg.sandbox.output_cap_bytes,
            one_shot_demo=getattr(stage, "one_shot_demo", False),
        )

    def run(self, tasks: list[Task], samples: int, limits: EpisodeLimits, out_dir: Path,
            engine: Engine | None = None) -> tuple[list[Trajectory], RolloutStats]:  # fmt: skip
        """tasks x samples episodes (on `engine` instead of the run's, e.g. the warm start's scripted policy),
        graded; out_dir gets trajectories.jsonl (replaced) and the grading logs (grade/). A dead server's
        episodes are retried elsewhere; ServersDown when every sandbox server or engine is gone."""
        engine = engine or self.engine
        out_dir.mkdir(parents=True, exist_ok=True)
        traj_file = out_dir / "trajectories.jsonl"
        traj_file.unlink(missing_ok=True)
        grade = swebench_grader(self.cfg.sandbox, out_dir / "grade", self.sandboxes)
        setup = RolloutSetup(engine, self.make_sandbox, grade, self.chat, self.prompts, self.cfg.agent, limits,
                             grade_sandbox=self.grade_sandbox, provenance=self.provenance)  # fmt: skip
        label = f"rollout {out_dir.name}"  # a run's unit folder (units/stage1-3) or the command's --out
        trajs, stats = run_rollouts(tasks, samples, setup, traj_file, self.cfg.monitor.progress and label)
        check_servers(self.sandboxes, engine)
        return trajs, stats
