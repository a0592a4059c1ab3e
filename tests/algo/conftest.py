"""Shared builders for the algorithm tests."""

from __future__ import annotations

import pytest

from swe_megatron.trajectory import ExitReason, Trajectory


def build_trajectory(
    task_id: str = "t",
    sample_index: int = 0,
    turns: int = 2,
    malformed: tuple[int, ...] = (),
    resolved: bool = False,
    **fields,
) -> Trajectory:
    """A consistent trajectory: a 3-token prompt, then per turn 2 assistant tokens and 2 observation tokens."""
    token_ids, mask, logprobs, spans = [1, 2, 3], [0, 0, 0], [0.0, 0.0, 0.0], []
    for j in range(turns):
        start = len(token_ids)
        token_ids += [10 + j, 20 + j, 30, 31]
        mask += [1, 1, 0, 0]
        logprobs += [-0.5, -0.25, 0.0, 0.0]
        spans.append([start, start + 2])
    values = dict(
        task_id=task_id,
        sample_index=sample_index,
        messages=[{"role": "user", "content": "fix it"}],
        token_ids=token_ids,
        action_mask=mask,
        logprobs=logprobs,
        prompt_len=3,
        turn_spans=spans,
        malformed_turns=list(malformed),
        num_steps=turns,
        exit_reason=ExitReason.submitted,
        reward=1.0 if resolved else 0.0,
        resolved=resolved,
    )
    values.update(fields)
    return Trajectory(**values)


@pytest.fixture
def make_traj():
    """The trajectory builder above, as a fixture."""
    return build_trajectory
