"""One episode: prompt -> (generate -> parse -> execute -> observe)* -> patch, recorded as a Trajectory.

Endings (paper-spec.md "Agent scaffold"): `submit`; T_max turns; the next prompt would not fit in the
context (no room left for one generated token); optionally too many format errors in a row. All of these
are model outcomes: the patch (`git diff` of the working tree) is taken and graded, and the length penalty
applies. A failure of the engine or the sandbox ends the episode as an infrastructure failure (excluded
from training, counted, retried by the rollout manager). So does passing the wall-clock deadline the
manager gives (agent.episode_timeout_s, agent.rollout_timeout_s): exit harness_timeout, "timeout: ..."
(see EpisodeTimeout for why that is not a model outcome). Control flow uses exceptions, as mini-swe-agent
does: FormatError, Submitted, LimitsExceeded, EpisodeTimeout.
"""

from __future__ import annotations

import logging
import threading
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


EPISODE_TIMEOUT = "timeout: past the episode's deadline"
"""`Trajectory.infra_failure` of an episode its deadline ended (the cause follows in brackets, if any)."""


class EpisodeTimeout(Exception):
    """The episode passed its wall-clock deadline: an infrastructure failure (harness_timeout), not a model outcome.

    Wall-clock time depends on engine load, concurrency and the machine, not only on the model's actions;
    what the model controls is bounded by t_max turns and the per-command timeout, which are model outcomes.
    Scoring a timeout 0 would punish the policy for a slow cluster, so it is excluded and counted instead.
    """


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
    *,
    deadline: float | None = None,
) -> Trajectory:
    """Run one episode in a fresh (not yet started) sandbox; grading is left to the caller.

    Infrastructure failures come back as a Trajectory with an infra exit reason and `infra_failure` set.
    deadline: time.monotonic() past which the episode ends as a timeout: checked between steps, and a
    command still running then is ended by stopping the sandbox.
    """
    t_start = time.perf_counter()
    timings = {"generate": 0.0, "tool": 0.0, "sandbox_start": 0.0, "patch": 0.0, "sandbox_stop": 0.0}
    traj = Trajectory(task_id=task.instance_id, sample_index=sample_index)
    system, first_user = first_messages(task, prompts, cfg, workdir, limits.one_shot_demo)
    ledger = TokenLedger.start(chat, system, first_user)
    aci = Aci(sandbox, cfg, prompts, workdir, limits.command_timeout_s, limits.output_cap)
    malformed: list[int] = []
    watchdog = None
    try:
        t = time.perf_counter()
        _check(deadline)
        sandbox.start()
        if deadline is not None:  # ends a command that is still running at the deadline
            watchdog = threading.Timer(max(0.0, deadline - time.monotonic()), sandbox.stop)
            watchdog.daemon = True
            watchdog.start()
        aci.start()
        timings["sandbox_start"] = time.perf_counter() - t
        exit_reason = _loop(engine, ledger, aci, prompts, cfg, limits, session, malformed, timings, deadline)
        t = time.perf_counter()
        traj.patch = aci.patch()
        timings["patch"] = time.perf_counter() - t
        traj.exit_reason = exit_reason
    except EpisodeTimeout:
        traj.exit_reason, traj.infra_failure = ExitReason.harness_timeout, EPISODE_TIMEOUT
    except (EngineError, SandboxError) as e:
        if _expired(deadline):  # the deadline's stop (or a slow engine) ended it
            traj.exit_reason, traj.infra_failure = ExitReason.harness_timeout, f"{EPISODE_TIMEOUT} ({e})"
        elif isinstance(e, EngineError):
            traj.exit_reason, traj.infra_failure = ExitReason.engine_error, f"engine: {e}"
        else:
            traj.exit_reason, traj.infra_failure = ExitReason.sandbox_error, f"sandbox: {e}"
    finally:
        if watchdog is not None:
            watchdog.cancel()
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


def _expired(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() >= deadline


def _check(deadline: float | None) -> None:
    if _expired(deadline):
        raise EpisodeTimeout


def _loop(
    engine, ledger, aci, prompts, cfg, limits, session, malformed, timings, deadline=None
) -> ExitReason:
    """Turns until an ending; returns the model-outcome exit reason (EpisodeTimeout past the deadline)."""
    consecutive_errors = 0
    try:
        while True:
            _check(deadline)
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
            _check(deadline)  # a generation that came back late is not acted on
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
