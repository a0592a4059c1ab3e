"""The one rule deciding whether a failure drops a sample (excluded: reward None) or is scored.

An excluded sample is never penalised, so any exclusion the policy can trigger is a reward hack: a trigger
that fires on failure, next to a real fix, beats honest play. Hence, for grading and for episodes alike:

    A failure is excluded only when the harness can show it was not the model's:
      1. it happened before any model-controlled content ran or was applied (Phase.HARNESS), or
      2. a control run -- the same grading with an empty patch, in a fresh sandbox -- fails the same way, or
      3. it happened outside every sandbox: the sandbox server stopped answering (SandboxServerLost: a failed
         request, then a failed health probe of the server process, which runs no model content).
    Everything else is scored (0 unless the tests really pass).

Where model content begins:
- grading: when the patch is applied (applying it is already under its control: its size, its paths, the
  time the fuzzy `patch` fallback takes). A failure from then on (a harness step that fails or times out,
  the sandbox dying, the grader crashing on what came back) is excluded only if `control_matches`.
- episodes: with the agent's first command. An episode cannot be replayed without the model, so after
  that command every sandbox failure, unreadable file and dead shell is scored; a deadline is scored when
  the agent's own commands took most of the time (`deadline_excluded`). Engine errors stay excluded: the
  engine runs outside the sandbox and sees only token ids the harness builds within the context limit.

Adding a failure mode: name its phase. If it can happen after model content, it goes through a control run
(grading) or is scored (episodes); nothing else may return an exclusion.
"""

from __future__ import annotations

from enum import Enum


class Phase(str, Enum):
    """How far a grading or an episode got when it failed."""

    HARNESS = "harness"
    """Nothing the model wrote has been applied or run (sandbox start, staging the harness files)."""
    MODEL = "model"
    """The patch was applied, or an agent command ran: the model's content may have caused what followed."""


def excludable(phase: Phase, kind: str, control_kind: str | None = None, outside: bool = False) -> bool:
    """Whether a failure of `kind` in `phase` may be excluded: always before model content or when it was
    `outside` every sandbox (rule 3); after model content only when the control run (empty patch, fresh
    sandbox) failed with the same kind (`control_kind`, None: it did not fail or was not run)."""
    return phase is Phase.HARNESS or outside or (control_kind is not None and control_kind == kind)


def needs_control(phase: Phase) -> bool:
    """A failure in this phase can only be excluded after a control run."""
    return phase is Phase.MODEL


def deadline_excluded(agent_command_s: float, elapsed_s: float) -> bool:
    """An episode's wall-clock deadline is excluded only when the agent's own commands (`agent_command_s`, all
    sandbox time of the episode) took less than half of the `elapsed_s` seconds: then the engine or the harness
    was slow. Otherwise the agent spent the time itself, and the ending is scored."""
    return agent_command_s * 2 < elapsed_s
