"""rft_select: resolved only, at most k per task by lowest sample index, exclusions, malformed masking."""

import pytest

from swe_megatron.algo import rft_select
from swe_megatron.trajectory import ExitReason

from .conftest import build_trajectory as traj


def test_keeps_resolved_lowest_sample_indices_up_to_the_cap_in_input_order():
    trajs = [
        traj("a", 5, resolved=True),
        traj("a", 1, resolved=True),
        traj("b", 0, resolved=False),
        traj("a", 3, resolved=True),
        traj("b", 4, resolved=True),
        traj("a", 0, resolved=False),
    ]
    kept, masks, rep = rft_select(trajs, max_per_task=2)
    assert [(t.task_id, t.sample_index) for t in kept] == [("a", 1), ("a", 3), ("b", 4)]
    assert masks == [list(t.action_mask) for t in kept]  # no malformed turns here
    assert (rep.trajectories_in, rep.unresolved, rep.over_cap, rep.kept) == (6, 2, 1, 3)
    assert (rep.tasks_in, rep.tasks_kept) == (2, 2)
    assert rep.loss_tokens == 3 * 4


def test_malformed_turns_are_masked_and_all_malformed_trajectories_dropped():
    ok = traj("a", 0, turns=3, malformed=(0, 2), resolved=True)
    useless = traj("b", 0, turns=2, malformed=(0, 1), resolved=True)
    kept, masks, rep = rft_select([ok, useless], max_per_task=10)
    assert kept == [ok]
    assert masks == [[0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0]]  # only the middle turn trains
    assert rep.nothing_to_train == 1 and rep.masked_turns == 2 and rep.loss_tokens == 2


def test_infrastructure_failures_and_drift_are_excluded_even_if_marked_resolved():
    trajs = [
        traj("a", 0, resolved=True, infra_failure="grading: sandbox died"),
        traj("a", 1, resolved=True, exit_reason=ExitReason.sandbox_error),
        traj("a", 2, resolved=True, drifted=True),
        traj("a", 3, resolved=True, exit_reason=ExitReason.turn_limit),  # graded resolved: a model outcome
    ]
    kept, _, rep = rft_select(trajs, max_per_task=10)
    assert [t.sample_index for t in kept] == [3]
    assert rep.excluded == 3
    assert rep.as_metrics("rft/")["rft/excluded"] == 3.0


def test_cap_must_be_positive():
    with pytest.raises(ValueError):
        rft_select([], max_per_task=0)
