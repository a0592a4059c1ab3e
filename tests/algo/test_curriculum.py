"""Task pool: refresh rule boundaries, seeded resumable sampling, its state as plain data (saving it: test_run_dir)."""

import json
from collections import Counter

import pytest

from swe_megatron.algo import RefreshRule, TaskPool, TaskStats, outcomes, refresh_pool
from swe_megatron.config.schema import StageConfig
from swe_megatron.errors import UsageError

from .conftest import build_trajectory

TASKS = [f"repo__t-{i:03d}" for i in range(23)]


def _stats(**counts):
    return {tid: TaskStats(a, s) for tid, (a, s) in counts.items()}


# (attempts, successes) -> kept by the paper's rule (drop solve rate >= 2/3, drop never solved)
BOUNDARY = {
    "exactly_2_of_3": ((3, 2), False),
    "exactly_4_of_6": ((6, 4), False),
    "exactly_20_of_30": ((30, 20), False),
    "just_below_66_of_100": ((100, 66), True),
    "just_above_67_of_100": ((100, 67), False),
    "half": ((10, 5), True),
    "six_of_ten": ((10, 6), True),
    "seven_of_ten": ((10, 7), False),
    "always": ((10, 10), False),
    "one_of_ten": ((10, 1), True),
    "never_of_ten": ((10, 0), False),
}


@pytest.mark.parametrize("rule_source", ["dataclass", "stage_config"])
def test_refresh_rule_boundaries(rule_source):
    rule = (
        RefreshRule()
        if rule_source == "dataclass"
        else RefreshRule.from_stage_config(StageConfig(refresh_pool=True))
    )
    stats = _stats(**{k: v[0] for k, v in BOUNDARY.items()})
    kept, rep = refresh_pool([*BOUNDARY, "unattempted"], stats, rule)
    assert kept == [k for k, v in BOUNDARY.items() if v[1]] + ["unattempted"]
    assert (rep.tasks_in, rep.dropped_too_easy, rep.dropped_never_solved, rep.kept_unattempted) == (
        12,
        6,
        1,
        1,
    )
    assert rep.kept == 5


def test_refresh_options():
    stats = _stats(never=(10, 0), easy=(3, 2), mid=(4, 1))
    kept, _ = refresh_pool(["never", "easy", "mid", "new"], stats, RefreshRule(drop_never_solved=False))
    assert kept == ["never", "mid", "new"]
    kept, rep = refresh_pool(["never", "easy", "mid", "new"], stats, RefreshRule(keep_unattempted=False))
    assert kept == ["mid"] and rep.dropped_unattempted == 1
    kept, _ = refresh_pool(["never", "easy", "mid"], stats, RefreshRule(max_solve_rate=0.25))
    assert kept == []  # mid's 1/4 sits exactly on the bound
    assert RefreshRule.from_stage_config(StageConfig(refresh_pool=False)) is None


def test_sampling_is_distinct_seeded_and_covers_the_pool_evenly():
    pool = TaskPool(TASKS, seed=1)
    pool.start_stage("stage1")
    draws = [pool.sample(5, it) for it in range(46)]  # 230 draws = 10 epochs of 23
    assert all(len(d) == len(set(d)) == 5 for d in draws)
    counts = Counter(t for d in draws for t in d)
    assert set(counts) == set(TASKS)
    # each epoch is a permutation; only skips at epoch boundaries can shift a count by one
    assert max(counts.values()) - min(counts.values()) <= 2
    first_epoch = [t for d in draws for t in d][:20]
    assert len(set(first_epoch)) == 20  # nothing repeats before the pool is exhausted
    other = TaskPool(TASKS, seed=2)
    other.start_stage("stage1")
    assert other.sample(5, 0) != draws[0]
    everything = pool.sample(100, 46)
    assert sorted(everything) == sorted(TASKS)  # asking for more than the pool gives the pool once


def test_exact_permutation_when_n_divides_the_pool():
    pool = TaskPool(TASKS[:20], seed=0)
    pool.start_stage("stage1")
    epoch0 = [t for it in range(4) for t in pool.sample(5, it)]
    epoch1 = [t for it in range(4, 8) for t in pool.sample(5, it)]
    assert sorted(epoch0) == sorted(epoch1) == sorted(TASKS[:20])
    assert epoch0 != epoch1  # a fresh shuffle per epoch


def _reopened(pool: TaskPool) -> TaskPool:
    """The pool as a new process reads it back (through JSON, as the run directory stores it)."""
    return TaskPool.from_dict(json.loads(json.dumps(pool.to_dict())))


def test_state_round_trip_and_resume_give_the_same_run():
    def run(pool, iterations):
        out = []
        for it in iterations:
            tasks = pool.sample(4, it)
            pool.record(it, [(t, (it + i) % 3 == 0) for i, t in enumerate(tasks)] * 2)
            out.append(tasks)
        return out

    straight = TaskPool(TASKS, seed=7)
    straight.start_stage("stage1")
    expected = run(straight, range(8))

    first = TaskPool(TASKS, seed=7)
    first.start_stage("stage1")
    got = run(first, range(3))
    resumed = _reopened(first)  # a new process after a restart
    assert resumed.to_dict() == first.to_dict()
    assert resumed.start_stage("stage1") is None  # already in stage1: nothing re-applied
    got += run(resumed, range(3, 8))
    assert got == expected
    assert _reopened(resumed).to_dict() == straight.to_dict()
    assert straight.to_dict()["format"] == 1
    with pytest.raises(ValueError, match="format 2 is not 1"):
        TaskPool.from_dict({**straight.to_dict(), "format": 2})


def test_rerunning_an_iteration_returns_its_tasks_and_replaces_its_record():
    pool = TaskPool(TASKS, seed=3)
    pool.start_stage("stage1")
    tasks = pool.sample(6, 0)
    pool.record(0, [(tasks[0], True), (tasks[0], False)])
    assert pool.sample(6, 0) == tasks  # crash after sampling: the rerun rolls out the same tasks
    pool.record(0, [(tasks[0], True), (tasks[0], True), (tasks[0], False)])
    assert pool.stats()[tasks[0]] == TaskStats(3, 2)  # replaced, not added to
    with pytest.raises(ValueError, match="tasks_per_iteration"):
        pool.sample(5, 0)
    assert set(pool.sample(6, 1)).isdisjoint(tasks)  # the next 6 of the same epoch


def test_stage_two_refresh_uses_all_history_and_is_applied_once():
    pool = TaskPool(["easy", "hard", "good", "unseen"], seed=0)
    pool.start_stage("rft")
    pool.record(0, [("easy", True), ("easy", True), ("hard", False), ("good", False)])
    pool.start_stage("stage1")
    pool.record(0, [("easy", True), ("hard", False), ("good", True), ("good", False)])
    assert pool.stats(stages=["stage1"])["good"] == TaskStats(2, 1)
    assert pool.stats()["easy"] == TaskStats(3, 3)
    rep = pool.start_stage("stage2", RefreshRule())
    assert pool.active == ["good", "unseen"]
    assert (rep.dropped_too_easy, rep.dropped_never_solved, rep.kept) == (1, 1, 2)
    assert set(pool.sample(10, 0)) == {"good", "unseen"}
    pool.record(0, [("good", True)] * 5)  # "good" is now easy, but stage 2 already refreshed
    reopened = _reopened(pool)
    assert reopened.start_stage("stage2", RefreshRule()) == rep
    assert reopened.active == ["good", "unseen"]


def test_refresh_that_empties_the_pool_is_one_line_naming_the_settings_and_changes_nothing():
    """Issue 42 item 3: a UsageError (the CLI's one line, not a traceback) that says how to go on; the pool is left
    as it was, so a rerun with a changed setting starts the stage from the committed pool."""
    pool = TaskPool(["a", "b", "c"], seed=0)
    pool.start_stage("stage1")
    pool.record(0, [("a", True), ("b", False)])
    with pytest.raises(UsageError) as e:
        pool.start_stage("stage2", RefreshRule(keep_unattempted=False))
    assert str(e.value) == (
        "refreshing the task pool for stage2 leaves no task: of 3, 1 were solved in >= 67% of their attempts, 1 "
        "never, 1 never tried; the units before stage2 are committed: rerun with stage2.refresh_pool=false (train "
        "on the whole pool), a higher stage2.refresh_max_solve_rate or stage2.refresh_drop_never_solved=false to go on"
    )
    assert (pool.stage, pool.active) == ("stage1", ["a", "b", "c"])
    assert pool.start_stage("stage2", RefreshRule(drop_never_solved=False, keep_unattempted=False)).kept == 1


def test_misuse_is_a_clear_error():
    with pytest.raises(ValueError, match="duplicate"):
        TaskPool(["a", "b", "a"], seed=0)
    empty = TaskPool([], seed=0)
    empty.start_stage("stage1")
    with pytest.raises(ValueError, match="no active tasks"):
        empty.sample(3, 0)
    pool = TaskPool(["a", "b"], seed=0)
    with pytest.raises(ValueError, match="start_stage"):
        pool.sample(1, 0)
    pool.start_stage("stage1")
    with pytest.raises(ValueError, match="not in the pool"):
        pool.record(0, [("zzz", True)])


def test_outcomes_skip_infrastructure_failures_and_drift():
    trajs = [
        build_trajectory("a", 0, resolved=True),
        build_trajectory("a", 1, infra_failure="sandbox: oom"),
        build_trajectory("b", 0, drifted=True),
        build_trajectory("b", 1),
    ]
    assert outcomes(trajs) == [("a", True), ("b", False)]


def test_iterations_sampled_ahead_return_their_tasks_when_rerun_in_order():
    """Async RL (max_staleness k) samples iterations i+1..i+k before i is recorded; a resume reruns them from
    i+1, and each must get the tasks it had (from a saved pool too)."""
    pool = TaskPool(TASKS, seed=3)
    pool.start_stage("stage1")
    first, ahead, further = pool.sample(3, 0), pool.sample(3, 1), pool.sample(3, 2)
    saved = TaskPool.from_dict(pool.to_dict())
    for p in (pool, saved):
        assert [p.sample(3, 0), p.sample(3, 1), p.sample(3, 2)] == [first, ahead, further]
        assert set(p.sample(3, 3)).isdisjoint(first + ahead + further)  # 23 tasks: still the first epoch


def test_the_pool_remembers_enough_samples_for_the_largest_staleness():
    from swe_megatron.algo.curriculum import KEPT_SAMPLES
    from swe_megatron.config.validate import MAX_STALENESS

    assert MAX_STALENESS + 1 <= KEPT_SAMPLES  # the rerun iteration and the k sampled ahead of it
