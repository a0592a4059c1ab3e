"""One rollout of the agent on one task: the record the agent writes, grading fills in and training reads.

Token provenance (design.md invariant 1): `token_ids` is the whole conversation as the trainer will see
it; assistant tokens are exactly the engine's samples (`action_mask` 1, `logprobs` from the engine), and
everything else (prompt, observations, template glue) has mask 0 and logprob 0. `turn_spans` locate each
assistant turn so that malformed turns can be masked for RFT. A trajectory round-trips through JSON
(`to_dict` / `from_dict`, `to_json` / `from_json`) so it can be stored one per line in JSONL.

Memory (a thousand episodes in flight, contexts to 131k tokens; docs/benchmarks.md, "Scale"): the three
length-L fields are typed arrays (`token_array`, `mask_array`, `logprob_array`): 4 + 1 + 4 bytes a token, where
Python lists of ints and floats took ~36 + 8 + 8..32. JSON holds them as lists; `Trajectory(...)` and
`from_dict` take lists or arrays. Compare them as `list(traj.token_ids)`: an array never equals a list.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any

TOKEN, MASK, LOGPROB = "i", "b", "f"
"""array typecodes: token ids (C int, 4 bytes: vocabularies are far below 2**31), action mask (1 byte), logprobs
(C float, 4 bytes: vLLM computes logprobs in float32, `Sampler.compute_logprobs`, so a vLLM logprob is kept
exactly; the trainer reads them as float32, pipeline/stages.py)."""


def token_array(values: Iterable[int] = ()) -> array:
    """Token ids as a compact array (this one, if it already is one)."""
    return _typed(TOKEN, values)


def mask_array(values: Iterable[int] = ()) -> array:
    """A 0/1 action mask as a compact array."""
    return _typed(MASK, values)


def logprob_array(values: Iterable[float] = ()) -> array:
    """Logprobs as a compact array."""
    return _typed(LOGPROB, values)


def _typed(code: str, values) -> array:
    return values if isinstance(values, array) and values.typecode == code else array(code, values)


class ExitReason(str, Enum):
    """Why the episode ended. The first seven are model outcomes; the rest are infrastructure failures (which
    is which: grading/exclusion.py)."""

    submitted = "submitted"
    """The agent ran `submit`."""
    turn_limit = "turn_limit"
    """T_max assistant turns were used (a model outcome: kept, with its length penalty)."""
    context_limit = "context_limit"
    """The next prompt would exceed the context length (a model outcome, kept)."""
    format_limit = "format_limit"
    """The episode was stopped after too many malformed turns in a row (a model outcome, kept)."""
    sandbox_lost = "sandbox_lost"
    """The sandbox failed after the agent's commands ran (a model outcome: graded with the patch, if any, that
    could still be taken; the agent can kill its shell, lock its files, exhaust its limits)."""
    harness_broken = "harness_broken"
    """The harness raised on something after the agent's commands ran (a model outcome: what they left, e.g. an
    unreadable file, may be why; logged with its traceback, graded with the patch that can still be taken)."""
    time_limit = "time_limit"
    """The episode's deadline passed while the agent's own commands had taken most of its time (a model
    outcome; graded with the patch, if any, that could still be taken)."""
    sandbox_error = "sandbox_error"
    """The sandbox itself failed (infrastructure: the trajectory is excluded, never rewarded 0)."""
    engine_error = "engine_error"
    """The inference engine failed or returned something unusable (infrastructure)."""
    harness_timeout = "harness_timeout"
    """A harness-level timeout that is not the model's doing (infrastructure)."""
    harness_error = "harness_error"
    """The harness itself crashed while running the episode (infrastructure)."""

    @property
    def is_infra(self) -> bool:
        """True for endings caused by infrastructure, which are excluded from training and from pass rates."""
        return self in (
            ExitReason.sandbox_error,
            ExitReason.engine_error,
            ExitReason.harness_timeout,
            ExitReason.harness_error,
        )


@dataclass
class Trajectory:
    """One episode with the tokens, masks and engine logprobs training needs, and its grading outcome.

    Lengths: `token_ids`, `action_mask` and `logprobs` all have length L (the full conversation).
    `turn_spans[j] = [start, end)` is the token range of assistant turn j (the tokens the engine sampled
    in that turn, end-of-turn token included), so `num_steps == len(turn_spans)`.
    """

    task_id: str
    """The task's instance_id; trajectories of one task in one iteration form a group."""
    sample_index: int
    """Index of this rollout among the task's samples in its iteration (0..G-1)."""
    messages: list[dict[str, str]] = field(default_factory=list)
    """The chat as text: [{"role": "system"|"user"|"assistant", "content": ...}, ...]."""
    token_ids: array = field(default_factory=token_array)
    """Token ids of the whole conversation, length L."""
    action_mask: array = field(default_factory=mask_array)
    """Length L; 1 on assistant tokens sampled by the engine, 0 on prompt, observations and template glue."""
    logprobs: array = field(default_factory=logprob_array)
    """Length L; the engine's logprob of each sampled token, 0.0 where action_mask is 0."""
    prompt_len: int = 0
    """Tokens of the initial prompt (system message + problem statement) before the first assistant turn."""
    turn_spans: list[list[int]] = field(default_factory=list)
    """[start, end) token range of each assistant turn, in order."""
    malformed_turns: list[int] = field(default_factory=list)
    """Indices into turn_spans of assistant turns that were format errors (zero or several commands)."""
    policy_versions: list[int] = field(default_factory=list)
    """The weight version that sampled each assistant turn (len == num_steps; more than one value when weights
    changed mid-episode, engine/gate.py); [] when not tracked (e.g. a scripted policy)."""
    num_steps: int = 0
    """Assistant turns taken (|tau| in the length penalty); equals len(turn_spans)."""
    exit_reason: ExitReason = ExitReason.submitted
    """Why the episode ended."""
    patch: str = ""
    """The submitted patch (`git diff` at submit); "" for none."""
    reward: float = 0.0
    """Test reward: 1.0 if the patch makes the task's tests pass, else 0.0 (before any length penalty)."""
    resolved: bool = False
    """Grading said the task is resolved."""
    infra_failure: str | None = None
    """What failed in the infrastructure (episode or grading), e.g. "grading: timeout"; None when nothing did."""
    grading_flags: list[str] = field(default_factory=list)
    """What grading flagged: "suspicious" (added lines mention the test runner), "tampered" (a canary test
    came out wrong; the reward is already 0). Counted per iteration (TensorBoard grading/*)."""
    drifted: bool = False
    """Re-rendering the chat did not reproduce token_ids (invariant 1): the trajectory is not trained on."""
    retokenized_turns: int = 0
    """Assistant turns whose sampled ids differ from a fresh encoding of their text (kept as sampled; not drift)."""
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds spent per phase, e.g. {"generate": ..., "sandbox": ..., "grade": ...}; "retried": the wall
    seconds of this sample's earlier attempts that failed on infrastructure and were retried (what faults cost
    it)."""

    def __post_init__(self) -> None:
        self.exit_reason = ExitReason(self.exit_reason)
        self.token_ids = token_array(self.token_ids)
        self.action_mask = mask_array(self.action_mask)
        self.logprobs = logprob_array(self.logprobs)
        self.turn_spans = [list(span) for span in self.turn_spans]

    @property
    def excluded(self) -> bool:
        """Infrastructure failure or token drift: not a model outcome, so excluded from training and scores."""
        return self.infra_failure is not None or self.exit_reason.is_infra or self.drifted

    def loss_mask(self, mask_malformed: bool) -> list[int]:
        """Length-L 0/1 mask of the tokens to train on: action tokens, minus malformed turns if asked.

        RFT masks malformed turns (they stay in the context but are not imitated); DAPO trains them with
        the trajectory's advantage like any other action. A drifted trajectory trains nothing.
        """
        if self.drifted:
            return [0] * len(self.token_ids)
        mask = list(self.action_mask)
        if mask_malformed:
            for j in self.malformed_turns:
                start, end = self.turn_spans[j]
                mask[start:end] = [0] * (end - start)
        return mask

    def check(self) -> None:
        """Raise ValueError naming the first inconsistency between the token-level fields."""
        n = len(self.token_ids)
        where = f"trajectory {self.task_id}#{self.sample_index}"
        if len(self.action_mask) != n or len(self.logprobs) != n:
            raise ValueError(
                f"{where}: token_ids ({n}), action_mask ({len(self.action_mask)}) and logprobs "
                f"({len(self.logprobs)}) must have the same length"
            )
        if not 0 <= self.prompt_len <= n:
            raise ValueError(f"{where}: prompt_len={self.prompt_len} is outside 0..{n}")
        if self.num_steps != len(self.turn_spans):
            raise ValueError(f"{where}: num_steps={self.num_steps} but {len(self.turn_spans)} turn_spans")
        prev_end = self.prompt_len
        inside = [0] * n
        for j, (start, end) in enumerate(self.turn_spans):
            if not prev_end <= start <= end <= n:
                raise ValueError(
                    f"{where}: turn_spans[{j}]={[start, end]} overlaps, is out of order or out of range"
                )
            inside[start:end] = [1] * (end - start)
            prev_end = end
        if any(m and not i for m, i in zip(self.action_mask, inside)):
            raise ValueError(f"{where}: action_mask is 1 outside every assistant turn span")
        if any(lp != 0.0 for m, lp in zip(self.action_mask, self.logprobs) if not m):
            raise ValueError(f"{where}: logprobs must be 0.0 where action_mask is 0")
        if self.policy_versions and len(self.policy_versions) != len(self.turn_spans):
            raise ValueError(
                f"{where}: {len(self.policy_versions)} policy_versions but {len(self.turn_spans)} assistant turns"
            )
        if any(not 0 <= j < len(self.turn_spans) for j in self.malformed_turns):
            raise ValueError(f"{where}: malformed_turns={self.malformed_turns} index a missing turn")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the enum as its string value, the arrays as lists). Shallow otherwise: its lists are
        the trajectory's own (what dataclasses.asdict would deep-copy, ~4 ms per turn of a long episode in the
        rollout's collector)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["exit_reason"] = self.exit_reason.value
        for name in ("token_ids", "action_mask", "logprobs"):
            out[name] = out[name].tolist()
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trajectory:
        """Inverse of to_dict; unknown keys are an error so that a misspelt field is not silently lost."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown Trajectory field(s) {unknown}; known: {sorted(known)}")
        missing = [k for k in ("task_id", "sample_index") if k not in data]
        if missing:
            raise ValueError(f"Trajectory record lacks required field(s) {missing}")
        return cls(**data)

    def to_json(self) -> str:
        """One JSONL line (no trailing newline)."""
        return json.dumps(self.to_dict(), ensure_ascii=False)

    @classmethod
    def from_json(cls, line: str) -> Trajectory:
        """Parse one JSONL line written by to_json."""
        return cls.from_dict(json.loads(line))
