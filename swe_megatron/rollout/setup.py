"""Build a RolloutSetup from a RunConfig: engine (vLLM servers, transformers, or the scripted fake), sandboxes, grader."""

from __future__ import annotations

import json
from pathlib import Path

from swe_megatron.agent.episode import EpisodeLimits
from swe_megatron.agent.prompts import load_prompts
from swe_megatron.agent.tokens import ChatFormat
from swe_megatron.config.schema import RunConfig, SandboxConfig, StageConfig
from swe_megatron.rollout.rollouts import GradeOutcome, Grader, RolloutSetup
from swe_megatron.sandbox.base import SandboxSpec
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


def sandbox_factory(cfg: SandboxConfig):
    """Task -> a new sandbox of the configured backend, made from the task's repo_dir and env_dir."""
    from swe_megatron.sandbox import make_sandbox

    def make(task: Task):
        return make_sandbox(
            SandboxSpec(repo_dir=task.extra["repo_dir"], env_dir=task.extra.get("env_dir")), cfg
        )

    return make


def swebench_grader(cfg: SandboxConfig, log_root: str | Path | None = None) -> Grader:
    """Grades with grading.grader.grade_one in a fresh sandbox of the configured backend."""
    import itertools

    from swe_megatron.grading.grader import grade_one
    from swe_megatron.sandbox import make_sandbox

    counter = itertools.count()

    def grade(task: Task, patch: str) -> GradeOutcome:
        log_dir = Path(log_root) / task.instance_id / str(next(counter)) if log_root else None
        r = grade_one(
            task,
            patch,
            lambda spec: make_sandbox(spec, cfg),
            log_dir=log_dir,
            test_timeout_s=cfg.grade_timeout_s,
        )
        return GradeOutcome(r.reward or 0.0, r.resolved, r.error, r.duration_s)

    return grade


def make_setup(cfg: RunConfig, stage: StageConfig, engine, grade: Grader | None = None, make_sandbox=None):
    """A RolloutSetup for cfg and stage around an engine (the caller owns the engine's servers)."""
    from swe_megatron.model.tokenizer import load_tokenizer

    return RolloutSetup(
        engine=engine,
        make_sandbox=make_sandbox or sandbox_factory(cfg.sandbox),
        grade=grade or swebench_grader(cfg.sandbox, Path(cfg.run_dir) / "grade"),
        chat=ChatFormat(load_tokenizer(cfg.model.tokenizer)),
        prompts=load_prompts(cfg.agent.prompts),
        agent=cfg.agent,
        limits=limits_for(cfg, stage),
    )
