"""Build a RolloutSetup from a RunConfig: engine (vLLM servers, transformers, or the scripted fake), sandboxes, grader."""

from __future__ import annotations

import json
from pathlib import Path

from swe_megatron.agent.episode import EpisodeLimits
from swe_megatron.agent.prompts import load_prompts
from swe_megatron.agent.tokens import ChatFormat
from swe_megatron.config.schema import RunConfig, SandboxConfig, StageConfig
from swe_megatron.rollout.rollouts import GradeOutcome, Grader, RolloutSetup
from swe_megatron.sandbox.base import Sandbox, SandboxSpec
from swe_megatron.tasks.schema import Task


def load_tasks(path: str | Path) -> list[Task]:
    """Tasks from a JSONL file (one SWE-bench row per line); unknown keys go to Task.extra; relative
    extra.repo_dir / env_dir are taken from the file's folder."""
    p = Path(path)
    known = set(Task.__dataclass_fields__)
    tasks = []
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{p}:{n}: not JSON ({e})") from e
        extra = dict(row.get("extra") or {})
        extra.update({k: v for k, v in row.items() if k not in known})
        for key in ("repo_dir", "env_dir"):
            if extra.get(key) and not Path(extra[key]).is_absolute():
                extra[key] = str((p.parent / extra[key]).resolve())
        row = {k: v for k, v in row.items() if k in known}
        row["extra"] = extra
        try:
            tasks.append(Task(**row))
        except TypeError as e:
            raise ValueError(f"{p}:{n}: not a task row ({e})") from e
    return tasks


def limits_for(cfg: RunConfig, stage: StageConfig) -> EpisodeLimits:
    """Episode limits of a stage."""
    return EpisodeLimits(
        t_max=stage.t_max,
        context_length=stage.context_length,
        max_tokens_per_turn=cfg.sampling.max_tokens_per_turn,
        command_timeout_s=cfg.sandbox.command_timeout_s,
        output_cap=cfg.sandbox.output_cap_bytes,
        one_shot_demo=stage.one_shot_demo,
    )


def sandbox_factory(cfg: SandboxConfig, sandboxes=None):
    """Task -> a new sandbox made from the task's repo_dir and env_dir: on the sandbox servers of `sandboxes`
    (a rollout.routing.SandboxPool) when given, else of the configured local backend."""
    from swe_megatron.sandbox import make_sandbox

    def make(task: Task):
        spec = SandboxSpec(repo_dir=task.extra["repo_dir"], env_dir=task.extra.get("env_dir"))
        return sandboxes.sandbox(spec) if sandboxes is not None else make_sandbox(spec, cfg)

    return make


def grading_sandbox_factory(cfg: SandboxConfig, sandboxes=None):
    """Task -> a new, not started sandbox to grade the task in (the spec grade_one asks for: a clean copy of
    the task's repository), on the servers of `sandboxes` (a rollout.routing.SandboxPool) when given."""
    from swe_megatron.grading.grader import task_grading
    from swe_megatron.sandbox import make_sandbox

    def make(task: Task):
        spec = task_grading(task).spec
        return sandboxes.sandbox(spec) if sandboxes is not None else make_sandbox(spec, cfg)

    return make


def swebench_grader(cfg: SandboxConfig, log_root: str | Path | None = None, sandboxes=None) -> Grader:
    """Grades with grading.grader.grade_one in `sandbox` when given one made for the task's grading spec
    (possibly started already), else in a fresh sandbox on the servers of `sandboxes` (a
    rollout.routing.SandboxPool) when given, else of the configured local backend.

    The function carries `.grade_sandbox`, its grading_sandbox_factory, which make_setup hands to the rollout
    manager (RolloutSetup.grade_sandbox). GradeOutcome.seconds is the raw cost: the apply and test phases,
    not the sandbox's start and stop.
    """
    import itertools

    from swe_megatron.grading.grader import grade_one
    from swe_megatron.sandbox import make_sandbox

    counter = itertools.count()

    def fresh(spec: SandboxSpec) -> Sandbox:
        return sandboxes.sandbox(spec) if sandboxes is not None else make_sandbox(spec, cfg)

    def grade(task: Task, patch: str, sandbox: Sandbox | None = None) -> GradeOutcome:
        log_dir = Path(log_root) / task.instance_id / str(next(counter)) if log_root else None

        def factory(spec: SandboxSpec) -> Sandbox:
            if sandbox is not None and getattr(sandbox, "spec", None) == spec:
                return sandbox
            return fresh(spec)

        r = grade_one(task, patch, factory, log_dir=log_dir, test_timeout_s=cfg.grade_timeout_s)
        raw = sum(v for k, v in r.timings.items() if k in ("apply", "tests"))
        flags = [name for name, on in (("suspicious", r.suspicious), ("tampered", r.tampered)) if on]
        return GradeOutcome(r.reward or 0.0, r.resolved, r.error, raw, dict(r.timings), flags)

    grade.grade_sandbox = grading_sandbox_factory(cfg, sandboxes)
    return grade


def make_setup(
    cfg: RunConfig,
    stage: StageConfig,
    engine,
    grade: Grader | None = None,
    make_sandbox=None,
    *,
    grade_sandbox=None,
):
    """A RolloutSetup for cfg and stage around an engine (the caller owns the engine's servers).

    grade defaults to swebench_grader's; grade_sandbox (Task -> a new grading sandbox, which the grader must
    accept as `sandbox=`) defaults to the grader's own `.grade_sandbox` when it has one, so the rollout
    manager can start grading sandboxes while the episodes run.
    """
    from swe_megatron.model.tokenizer import load_tokenizer

    grade = grade or swebench_grader(cfg.sandbox, Path(cfg.run_dir) / "grade")
    return RolloutSetup(
        engine=engine,
        make_sandbox=make_sandbox or sandbox_factory(cfg.sandbox),
        grade=grade,
        chat=ChatFormat(load_tokenizer(cfg.model.tokenizer)),
        prompts=load_prompts(cfg.agent.prompts),
        agent=cfg.agent,
        limits=limits_for(cfg, stage),
        grade_sandbox=grade_sandbox or getattr(grade, "grade_sandbox", None),
    )
