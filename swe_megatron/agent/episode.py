"""One episode: prompt -> (generate -> parse -> execute -> observe)* -> patch, recorded as a Trajectory.

Endings (paper-spec.md "Agent scaffold"): `submit`; T_max turns; the next prompt would not fit in the
context (no room left for one generated token); optionally too many format errors in a row. All of these
are model outcomes: the patch (`git diff` of the working tree) is taken and graded, and the length penalty
applies. A failure of the engine or the sandbox ends the episode as an infrastructure failure (excluded
from training, counted, retried by the rollout manager). Control flow uses exceptions, as mini-swe-agent
does: FormatError, Submitted, LimitsExceeded.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from swe_megatron.agent.commands import Aci, Submitted
from swe_megatron.agent.parse import FormatError, parse_action
from swe_megatron.agent.prompts import Prompts
from swe_megatron.agent.tokens import ChatFormat, TokenLedger, check_provenance
from swe_megatron.config.schema import AgentConfig
from swe_megatron.engine.base import Engine, EngineError
from swe_megatron.sandbox.base import Sandbox, SandboxError
from swe_megatron.tasks.schema import Task
from swe_megatron.trajectory import ExitReason, Trajectory

log = logging.getLogger(__name__)


class LimitsExceeded(Exception):
    """A turn, context or format-error limit ended the episode (a model outcome)."""

    def __init__(self, reason: ExitReason):
        super().__init__(reason.value)
        self.reason = reason


@dataclass
class EpisodeLimits:
    """Per-stage limits of one episode."""

    t_max: int
    """Assistant turns at most."""
    context_length: int
    """Tokens the conversation may reach (prompt + generation)."""
    max_tokens_per_turn: int
    """Tokens one assistant turn may generate."""
    command_timeout_s: float
    """Wall-clock limit of one command."""
    output_cap: int
    """Characters of one observation's output kept."""
    one_shot_demo: bool = False
    """Put the demonstration before the problem statement."""


def first_messages(
    task: Task, prompts: Prompts, cfg: AgentConfig, workdir: str, demo: bool
) -> tuple[str, str]:
    """The system message and the initial observation (the problem statement) of a task."""
    system = prompts.system.format(interactive=", ".join(cfg.interactive_programs), window=cfg.window)
    instance = prompts.instance.format(
        problem_statement=task.problem_statement, workdir=workdir, cwd=workdir, file="n/a"
    )
    return system, (prompts.demo + "\n\n" + instance) if demo else instance


def run_episode(
    task: Task,
    sample_index: int,
    sandbox: Sandbox,
    engine: Engine,
    chat: ChatFormat,
    prompts: Prompts,
    cfg: AgentConfig,
    limits: EpisodeLimits,
    workdir: str,
    session: str,
) -> Trajectory:
    """Run one episode in a fresh (not yet started) sandbox; grading is left to the caller.

    Infrastructure failures come back as a Trajectory with an infra exit reason and `infra_failure` set.
    """
    t_start = time.perf_counter()
    timings = {"generate": 0.0, "tool": 0.0, "sandbox_start": 0.0, "patch": 0.0, "sandbox_stop": 0.0}
    traj = Trajectory(task_id=task.instance_id, sample_index=sample_index)
    system, first_user = first_messages(task, prompts, cfg, workdir, limits.one_shot_demo)
    ledger = TokenLedger.start(chat, system, first_user)
    aci = Aci(sandbox, cfg, prompts, workdir, limits.command_timeout_s, limits.output_cap)
    malformed: list[int] = []
    try:
        t = time.perf_counter()
        sandbox.start()
        aci.start()
        timings["sandbox_start"] = time.perf_counter() - t
        exit_reason = _loop(engine, ledger, aci, prompts, cfg, limits, session, malformed, timings)
        t = time.perf_counter()
        traj.patch = aci.patch()
        timings["patch"] = time.perf_counter() - t
        traj.exit_reason = exit_reason
    except EngineError as e:
        traj.exit_reason, traj.infra_failure = ExitReason.engine_error, f"engine: {e}"
    except SandboxError as e:
        traj.exit_reason, traj.infra_failure = ExitReason.sandbox_error, f"sandbox: {e}"
    finally:
        engine.end_session(session)
        t = time.perf_counter()
        try:
            sandbox.stop()
        except Exception as e:  # noqa: BLE001 - a failing stop must not hide the episode's own outcome
            if traj.infra_failure is None and not traj.exit_reason.is_infra:
                traj.exit_reason, traj.infra_failure = ExitReason.sandbox_error, f"sandbox stop: {e}"
        timings["sandbox_stop"] = time.perf_counter() - t
    traj.messages = ledger.messages
    traj.token_ids = ledger.token_ids
    traj.action_mask = ledger.action_mask
    traj.logprobs = ledger.logprobs
    traj.prompt_len = ledger.prompt_len
    traj.turn_spans = ledger.turn_spans
    traj.num_steps = len(ledger.turn_spans)
    traj.malformed_turns = malformed
    t = time.perf_counter()
    report = check_provenance(chat, ledger.messages, ledger.token_ids, ledger.turn_spans)
    timings["provenance"] = time.perf_counter() - t
    traj.drifted = report.drifted
    traj.retokenized_turns = report.retokenized_turns
    if report.drifted:
        log.warning("trajectory %s#%d drifted (masked): %s", task.instance_id, sample_index, report.detail)
    timings["exec_raw"] = aci.exec_seconds
    timings["episode"] = time.perf_counter() - t_start
    traj.timings = timings
    return traj


def _loop(engine, ledger, aci, prompts, cfg, limits, session, malformed, timings) -> ExitReason:
    """Turns until an ending; returns the model-outcome exit reason."""
    consecutive_errors = 0
    try:
        while True:
            if len(ledger.turn_spans) >= limits.t_max:
                raise LimitsExceeded(ExitReason.turn_limit)
            room = limits.context_length - len(ledger.token_ids)
            if room < 1:
                raise LimitsExceeded(ExitReason.context_limit)
            t = time.perf_counter()
            gen = engine.generate(ledger.token_ids, min(limits.max_tokens_per_turn, room), session)
            timings["generate"] += time.perf_counter() - t
            if not gen.token_ids or len(gen.token_ids) > min(limits.max_tokens_per_turn, room):
                raise EngineError(f"engine returned {len(gen.token_ids)} tokens for a budget of {room}")
            content = ledger.add_assistant(gen.token_ids, gen.logprobs)
            t = time.perf_counter()
            try:
                output = aci.run(parse_action(content))
                consecutive_errors = 0
            except FormatError as e:
                malformed.append(len(ledger.turn_spans) - 1)
                output = prompts.format_error.format(count=e.count)
                consecutive_errors += 1
                if (
                    cfg.max_consecutive_format_errors
                    and consecutive_errors >= cfg.max_consecutive_format_errors
                ):
                    raise LimitsExceeded(ExitReason.format_limit) from None
            finally:
                timings["tool"] += time.perf_counter() - t
            if len(ledger.turn_spans) >= limits.t_max:
                raise LimitsExceeded(ExitReason.turn_limit)
            obs = aci.observation(output)
            obs_ids = ledger.observation_ids(obs)
            if len(ledger.token_ids) + len(obs_ids) >= limits.context_length:
                raise LimitsExceeded(ExitReason.context_limit)
            ledger.add_observation(obs, obs_ids)
    except Submitted:
        return ExitReason.submitted
    except LimitsExceeded as e:
        return e.reason
