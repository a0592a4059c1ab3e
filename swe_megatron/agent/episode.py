"""One episode: prompt -> (generate -> parse -> execute -> observe)* -> patch, recorded as a Trajectory.

Endings (paper-spec.md "Agent scaffold"): `submit`; T_max turns; the next prompt would not fit in the
context (no room left for one generated token); optionally too many format errors in a row. All of these
are model outcomes: the patch (the working tree's diff, taken on the host) is taken and graded, and the length penalty
applies. What is excluded follows grading/exclusion.py's rule: an engine failure, and a sandbox failure
before the agent's first command, end the episode as an infrastructure failure (excluded from training,
counted, retried by the rollout manager); a sandbox failure after it is the agent's outcome (sandbox_lost,
graded). Passing the wall-clock deadline the manager gives (agent.episode_timeout_s,
agent.rollout_timeout_s) is excluded (harness_timeout, "timeout: ...") unless the agent's own commands took
most of the time (time_limit, graded). Control flow uses exceptions, as mini-swe-agent does: FormatError,
Submitted, LimitsExceeded, EpisodeTimeout.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

from swe_megatron.agent.commands import Aci, Submitted
from swe_megatron.agent.parse import FormatError, parse_action
from swe_megatron.agent.prompts import Prompts
from swe_megatron.agent.tokens import ChatFormat, ProvenanceReport, TokenLedger, check_provenance
from swe_megatron.config.schema import AgentConfig
from swe_megatron.engine.base import Engine, EngineError
from swe_megatron.grading.exclusion import Phase, deadline_excluded, excludable
from swe_megatron.sandbox.base import Sandbox, SandboxError, SandboxServerLost
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
    """The episode passed its wall-clock deadline.

    Wall-clock time depends on engine load, concurrency and the machine, not only on the model's actions, so
    scoring every timeout 0 would punish the policy for a slow cluster: it is excluded (harness_timeout)
    unless the agent's own commands took most of the time (exclusion.deadline_excluded), then it is scored
    (time_limit). The config also refuses a deadline the agent's commands alone could reach.
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


@dataclass(frozen=True)
class Scaffold:
    """What every episode of a rollout shares: the engine, the chat format, prompts, agent settings, limits."""

    engine: Engine
    """Generation (sticky per session)."""
    chat: ChatFormat
    """Tokenizer + chat template."""
    prompts: Prompts
    """Prompt templates."""
    agent: AgentConfig
    """Scaffold settings."""
    limits: EpisodeLimits
    """Per-stage limits."""
    provenance: Callable[..., ProvenanceReport] | None = None
    """check_provenance's stand-in with the chat bound (a ProvenancePool); None: check_provenance on the
    episode's thread."""

    def check_provenance(self, ledger: TokenLedger) -> ProvenanceReport:
        args = (ledger.messages, ledger.token_ids, ledger.turn_spans)
        return self.provenance(*args) if self.provenance else check_provenance(self.chat, *args)


class Episode:
    """One episode in a fresh (not yet started) sandbox, its state on self, as mini-swe-agent's DefaultAgent:
    run() -> step()* where a step is query() (one generation) then observe() (parse, execute, observe).

    Grading is left to the caller. Infrastructure failures come back as a Trajectory with an infra exit
    reason and `infra_failure` set. deadline: time.monotonic() past which the episode ends as a timeout:
    checked between steps, and a command still running then is ended by stopping the sandbox.
    """

    def __init__(self, scaffold: Scaffold, task: Task, sample_index: int, sandbox: Sandbox, workdir: str,
                 session: str, deadline: float | None = None):  # fmt: skip
        self.s, self.task, self.sandbox, self.session, self.deadline = (
            scaffold,
            task,
            sandbox,
            session,
            deadline,
        )
        self.traj = Trajectory(task_id=task.instance_id, sample_index=sample_index)
        self.timings = {"generate": 0.0, "tool": 0.0, "sandbox_start": 0.0, "patch": 0.0, "sandbox_stop": 0.0}
        system, first_user = first_messages(task, scaffold.prompts, scaffold.agent, workdir,
                                            scaffold.limits.one_shot_demo)  # fmt: skip
        self.ledger = TokenLedger.start(scaffold.chat, system, first_user)
        self.aci = Aci(sandbox, scaffold.agent, scaffold.prompts, workdir, scaffold.limits.command_timeout_s,
                       scaffold.limits.output_cap)  # fmt: skip
        self.malformed: list[int] = []
        self.versions: list[int] = []  # the weight version of each turn (engine/gate.py), if the engine says
        self.format_errors = 0  # in a row
        self.phase = Phase.HARNESS
        """exclusion.Phase: MODEL once an agent command was sent to the sandbox."""

    def run(self) -> Trajectory:
        """Start the sandbox, step until an ending, take the patch; always stop the sandbox and end the session."""
        t_start = time.perf_counter()
        watchdog = None
        try:
            with self._timed("sandbox_start"):
                self._check_deadline()
                self.sandbox.start()
                if self.deadline is not None:  # ends a command that is still running at the deadline
                    watchdog = threading.Timer(max(0.0, self.deadline - time.monotonic()), self.sandbox.stop)
                    watchdog.daemon = True
                    watchdog.start()
                self.aci.start()
            self.traj.exit_reason = self._steps()
            with self._timed("patch"):
                self.traj.patch = self.aci.patch()
        except EpisodeTimeout:
            self._ended(None, t_start)
        except (EngineError, SandboxError) as e:
            self._ended(e, t_start)
        except Exception:
            if self.phase is Phase.HARNESS:  # the rollout manager records it as harness_error (excluded)
                raise
            log.exception("episode %s: the harness failed after the agent's commands (scored)", self.session)
            self.traj.exit_reason = ExitReason.harness_broken
            self._take_patch()
        finally:
            if watchdog is not None:
                watchdog.cancel()
            self._stop()
        return self._finish(t_start)

    def _steps(self) -> ExitReason:
        """step() until an ending; the model-outcome exit reason (EpisodeTimeout past the deadline)."""
        try:
            while True:
                self.step()
        except Submitted:
            return ExitReason.submitted
        except LimitsExceeded as e:
            return e.reason

    def step(self) -> None:
        """One turn: query the model, act on its answer and append the observation (LimitsExceeded,
        Submitted or EpisodeTimeout end the episode)."""
        self._check_deadline()
        self.observe(self.query())

    def query(self) -> str:
        """Generate one assistant turn within the turn and context limits; its text."""
        limits, ledger = self.s.limits, self.ledger
        if len(ledger.turn_spans) >= limits.t_max:
            raise LimitsExceeded(ExitReason.turn_limit)
        room = limits.context_length - len(ledger.token_ids)
        if room < 1:
            raise LimitsExceeded(ExitReason.context_limit)
        budget = min(limits.max_tokens_per_turn, room)
        with self._timed("generate"):
            gen = self.s.engine.generate(ledger.token_ids, budget, self.session)
        if not gen.token_ids or len(gen.token_ids) > budget:
            raise EngineError(f"engine returned {len(gen.token_ids)} tokens for a budget of {room}")
        content = ledger.add_assistant(gen.token_ids, gen.logprobs)
        if gen.policy_version is not None:
            self.versions.append(gen.policy_version)
        self._check_deadline()  # a generation that came back late is not acted on
        return content

    def observe(self, content: str) -> None:
        """Parse and run the action of `content` (a format error is answered instead) and append what it
        printed as the next observation, unless that ends the episode."""
        with self._timed("tool"):
            output = self._act(content)
        if len(self.ledger.turn_spans) >= self.s.limits.t_max:
            raise LimitsExceeded(ExitReason.turn_limit)
        obs = self.aci.observation(output)
        obs_ids = self.ledger.observation_ids(obs)
        if len(self.ledger.token_ids) + len(obs_ids) >= self.s.limits.context_length:
            raise LimitsExceeded(ExitReason.context_limit)
        self.ledger.add_observation(obs, obs_ids)

    def _act(self, content: str) -> str:
        """The output of the turn's action, or the format-error message (too many in a row end the episode)."""
        try:
            action = parse_action(content)
            self.phase = Phase.MODEL  # the agent's command goes to the sandbox now
            output = self.aci.run(action)
        except FormatError as e:
            self.malformed.append(len(self.ledger.turn_spans) - 1)
            self.format_errors += 1
            limit = self.s.agent.max_consecutive_format_errors
            if limit and self.format_errors >= limit:
                raise LimitsExceeded(ExitReason.format_limit) from None
            return self.s.prompts.format_error.format(count=e.count)
        self.format_errors = 0
        return output

    def _infra(self, reason: ExitReason, failure: str) -> None:
        self.traj.exit_reason, self.traj.infra_failure = reason, failure

    def _ended(self, error: EngineError | SandboxError | None, t_start: float) -> None:
        """An ending by the deadline (error None, or the deadline's stop) or a failure: excluded only under
        exclusion.py's rule; a scored ending is graded with whatever patch can still be taken."""
        if error is None or _expired(self.deadline):
            detail = f" ({error})" if error is not None else ""
            elapsed = time.perf_counter() - t_start
            if self.phase is Phase.HARNESS or deadline_excluded(self.timings["tool"], elapsed):
                return self._infra(ExitReason.harness_timeout, EPISODE_TIMEOUT + detail)
            self.traj.exit_reason = ExitReason.time_limit
        elif isinstance(error, EngineError):  # outside the sandbox: only token ids the harness built
            return self._infra(ExitReason.engine_error, f"engine: {error}")
        elif excludable(self.phase, "sandbox", outside=isinstance(error, SandboxServerLost)):
            return self._infra(ExitReason.sandbox_error, f"sandbox: {error}")
        else:
            log.warning("episode %s: the sandbox failed after the agent's commands: %s", self.session, error)
            self.traj.exit_reason = ExitReason.sandbox_lost
        self._take_patch()

    def _take_patch(self) -> None:
        """After a scored ending that was not `submit`: the patch, if one can still be taken (else empty, 0)."""
        with self._timed("patch"):
            try:
                self.traj.patch = self.aci.patch()
            except Exception as e:  # noqa: BLE001 - nothing left to take it from: the empty patch, graded 0
                log.warning("episode %s: no patch after %s: %s", self.session, self.traj.exit_reason.value, e)

    def _stop(self) -> None:
        """End the engine session and stop the sandbox; a failing stop is the outcome only if none is set."""
        self.s.engine.end_session(self.session)
        with self._timed("sandbox_stop"):
            try:
                self.sandbox.stop()
            except Exception as e:  # noqa: BLE001 - a failing stop must not hide the episode's own outcome
                if self.traj.infra_failure is None and not self.traj.exit_reason.is_infra:
                    if excludable(self.phase, "sandbox"):
                        self._infra(ExitReason.sandbox_error, f"sandbox stop: {e}")
                    else:  # after the agent's commands: what they left behind may be why
                        log.warning("episode %s: sandbox stop failed: %s", self.session, e)

    def _finish(self, t_start: float) -> Trajectory:
        """The ledger and counts into the trajectory; its tokens checked against a re-tokenisation."""
        traj, ledger = self.traj, self.ledger
        traj.messages, traj.token_ids, traj.action_mask = (
            ledger.messages,
            ledger.token_ids,
            ledger.action_mask,
        )
        traj.logprobs, traj.prompt_len, traj.turn_spans = (
            ledger.logprobs,
            ledger.prompt_len,
            ledger.turn_spans,
        )
        traj.num_steps, traj.malformed_turns = len(ledger.turn_spans), self.malformed
        traj.policy_versions = self.versions
        with self._timed("provenance"):
            report = self.s.check_provenance(ledger)
        traj.drifted, traj.retokenized_turns = report.drifted, report.retokenized_turns
        if report.drifted:
            log.warning(
                "trajectory %s#%d drifted (masked): %s", traj.task_id, traj.sample_index, report.detail
            )
        self.timings["exec_raw"] = self.aci.exec_seconds
        self.timings["episode"] = time.perf_counter() - t_start
        traj.timings = self.timings
        return traj

    def _check_deadline(self) -> None:
        if _expired(self.deadline):
            raise EpisodeTimeout

    @contextmanager
    def _timed(self, phase: str):
        """Add the block's seconds to timings[phase] (also when it raises)."""
        t = time.perf_counter()
        try:
            yield
        finally:
            self.timings[phase] = self.timings.get(phase, 0.0) + time.perf_counter() - t


def _expired(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() >= deadline
