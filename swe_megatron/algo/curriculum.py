"""The task pool and the two-stage curriculum: which tasks each iteration trains on.

The pool keeps, per stage and iteration, how often each task was attempted and solved; its whole state
is plain data (`to_dict` / `from_dict`), which the run directory saves after every change so a run
resumes where it stopped (pipeline/run_dir.py). Sampling walks seeded permutations of the active tasks (one per epoch),
so every task is seen about equally often and iteration i draws the same tasks after a restart.
Entering a stage can refresh the pool; the paper's stage 2 drops tasks solved in >= 2/3 of their
attempts over training so far (too easy) and tasks never solved (too hard). A refresh that would leave no
task stops the run with one line (UsageError) instead of keeping the pool: every task it would train on was
judged too easy or too hard, so stage 2 would spend its iterations on groups of equal rewards, which train
nothing; whether that is acceptable is the user's call (the line names the settings), and the run resumes at
the stage once one is changed (the stage had not started, so its refresh settings may change).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from swe_megatron.errors import UsageError
from swe_megatron.trajectory import Trajectory

POOL_FORMAT = 1
KEPT_SAMPLES = 16
"""Latest samples a pool remembers for reruns (more than any algo.max_staleness in use needs)."""


@dataclass
class TaskStats:
    """Attempts and successes of one task."""

    attempts: int = 0
    """Graded rollouts (infrastructure failures are not attempts)."""
    successes: int = 0
    """Resolved rollouts."""

    @property
    def solve_rate(self) -> float | None:
        """successes / attempts, None without attempts."""
        return self.successes / self.attempts if self.attempts else None


@dataclass
class RefreshRule:
    """Which tasks a pool refresh drops."""

    max_solve_rate: float = 2 / 3
    """Drop tasks with solve rate >= this."""
    drop_never_solved: bool = True
    """Drop tasks attempted but never solved."""
    keep_unattempted: bool = True
    """Keep tasks without attempts (no evidence either way)."""

    @classmethod
    def from_stage_config(cls, stage: Any) -> RefreshRule | None:
        """The rule of a StageConfig, or None when the stage does not refresh its pool."""
        if not stage.refresh_pool:
            return None
        return cls(
            max_solve_rate=float(stage.refresh_max_solve_rate),
            drop_never_solved=bool(stage.refresh_drop_never_solved),
            keep_unattempted=bool(stage.refresh_keep_unattempted),
        )


@dataclass
class RefreshReport:
    """What a refresh did."""

    tasks_in: int = 0
    """Active tasks before the refresh."""
    dropped_too_easy: int = 0
    """Tasks with solve rate >= max_solve_rate."""
    dropped_never_solved: int = 0
    """Tasks attempted and never solved."""
    dropped_unattempted: int = 0
    """Tasks without attempts (only when keep_unattempted is false)."""
    kept: int = 0
    """Active tasks after the refresh."""
    kept_unattempted: int = 0
    """Kept tasks that had no attempts."""


def refresh_pool(
    task_ids: Sequence[str], stats: Mapping[str, TaskStats], rule: RefreshRule
) -> tuple[list[str], RefreshReport]:
    """Apply a refresh rule. task_ids: [P] active tasks; stats: history (missing = no attempts).

    Returns (kept task ids in input order, report). The bound is inclusive: exactly max_solve_rate drops.
    """
    report = RefreshReport(tasks_in=len(task_ids))
    kept = []
    for tid in task_ids:
        st = stats.get(tid, TaskStats())
        if st.attempts == 0:
            if not rule.keep_unattempted:
                report.dropped_unattempted += 1
                continue
            report.kept_unattempted += 1
        elif st.successes / st.attempts >= rule.max_solve_rate:
            report.dropped_too_easy += 1
            continue
        elif st.successes == 0 and rule.drop_never_solved:
            report.dropped_never_solved += 1
            continue
        kept.append(tid)
    report.kept = len(kept)
    return kept, report


def outcomes(trajectories: Iterable[Trajectory]) -> list[tuple[str, bool]]:
    """(task id, resolved) of each trajectory that is a model outcome (infra failures and drift skipped)."""
    return [(t.task_id, bool(t.resolved)) for t in trajectories if not t.excluded]


class TaskPool:
    """Active tasks, per-iteration attempt/success history, and seeded resumable sampling.

    Use: `pool = TaskPool(task_ids, seed)` (or `TaskPool.from_dict(saved)`), then per stage
    `pool.start_stage(name, rule)`, per iteration `tasks = pool.sample(n, it)` ...
    `pool.record(it, outcomes(trajs))`; whoever keeps it saves `pool.to_dict()` after each change.
    """

    def __init__(self, task_ids: Sequence[str], seed: int):
        ids = [str(t) for t in task_ids]
        dup = sorted(t for t, c in Counter(ids).items() if c > 1)
        if dup:
            raise ValueError(f"TaskPool: duplicate task ids {dup[:5]}")
        self.seed = int(seed)
        self.task_ids = ids
        """Every task the pool was created with, in the given order."""
        self.active = list(ids)
        """Tasks the current stage samples from."""
        self.stage: str | None = None
        """The stage in progress (set by start_stage)."""
        self.cursor: dict[str, int] = {}
        """Per stage: positions consumed in that stage's stream of epoch permutations."""
        self.samples: list[dict[str, Any]] = []
        """{"stage", "iteration", "tasks"} of the latest samples (at most KEPT_SAMPLES, oldest first), returned
        again if their iteration reruns (async RL samples iterations ahead of the one a resume reruns first)."""
        self.log: dict[str, dict[str, list[int]]] = {}
        """"stage:iteration" -> {task id: [attempts, successes]}."""
        self.refresh_reports: dict[str, dict[str, int]] = {}
        """Per stage: the refresh report of its start, if it refreshed."""

    # persistence ---------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The whole state as JSON-ready data."""
        return {
            "format": POOL_FORMAT,
            "seed": self.seed,
            "task_ids": self.task_ids,
            "active": self.active,
            "stage": self.stage,
            "cursor": self.cursor,
            "samples": self.samples,
            "log": self.log,
            "refresh_reports": self.refresh_reports,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TaskPool:
        """Inverse of to_dict; ValueError for data of another format."""
        if data.get("format") != POOL_FORMAT:
            raise ValueError(f"task pool format {data.get('format')!r} is not {POOL_FORMAT}")
        pool = cls(data["task_ids"], data["seed"])
        pool.active = list(data["active"])
        pool.stage = data["stage"]
        pool.cursor = {k: int(v) for k, v in data["cursor"].items()}
        pool.samples = list(data["samples"]) if "samples" in data else [s for s in [data["last_sample"]] if s]
        pool.log = {k: {t: [int(a), int(s)] for t, (a, s) in v.items()} for k, v in data["log"].items()}
        pool.refresh_reports = dict(data["refresh_reports"])
        return pool

    # history ---------------------------------------------------------------------------------------

    def record(self, iteration: int, results: Iterable[tuple[str, bool]]) -> None:
        """Store the (task id, resolved) outcomes of an iteration of the current stage.

        Recording the same iteration again REPLACES its entry, so rerunning an iteration after a crash
        does not count it twice. Pass only model outcomes (see `outcomes`).
        """
        stage = self._require_stage()
        entry: dict[str, list[int]] = {}
        known = set(self.task_ids)
        for tid, ok in results:
            if tid not in known:
                raise ValueError(f"TaskPool.record: task {tid!r} is not in the pool")
            a_s = entry.setdefault(tid, [0, 0])
            a_s[0] += 1
            a_s[1] += int(bool(ok))
        self.log[f"{stage}:{iteration}"] = entry

    def stats(self, stages: Iterable[str] | None = None) -> dict[str, TaskStats]:
        """Attempts and successes per task summed over the history (optionally only some stages)."""
        wanted = None if stages is None else set(stages)
        out: dict[str, TaskStats] = {}
        for key, entry in self.log.items():
            if wanted is not None and key.rsplit(":", 1)[0] not in wanted:
                continue
            for tid, (a, s) in entry.items():
                st = out.setdefault(tid, TaskStats())
                st.attempts += a
                st.successes += s
        return out

    # curriculum ------------------------------------------------------------------------------------

    def start_stage(self, stage: str, refresh: RefreshRule | None = None) -> RefreshReport | None:
        """Enter a stage, refreshing the active tasks by `refresh` over all history so far.

        Idempotent on resume: if the pool is already in `stage`, nothing is applied again and the stored
        report is returned.
        """
        if self.stage == stage:
            rep = self.refresh_reports.get(stage)
            return RefreshReport(**rep) if rep is not None else None
        report = None
        if refresh is not None:
            before = self.active
            self.active, report = refresh_pool(self.active, self.stats(), refresh)
            if not self.active:
                self.active = before  # nothing changes: the pool stays as committed
                raise UsageError(
                    f"refreshing the task pool for {stage} leaves no task: of {report.tasks_in}, "
                    f"{report.dropped_too_easy} were solved in >= {refresh.max_solve_rate:.0%} of their attempts, "
                    f"{report.dropped_never_solved} never, {report.dropped_unattempted} never tried; the units "
                    f"before {stage} are committed: rerun with {stage}.refresh_pool=false (train on the whole pool), "
                    f"a higher {stage}.refresh_max_solve_rate or {stage}.refresh_drop_never_solved=false to go on"
                )
            self.refresh_reports[stage] = asdict(report)
        self.stage = stage
        return report

    def sample(self, n: int, iteration: int) -> list[str]:
        """The next min(n, active) distinct tasks of the current stage's seeded stream, for `iteration`.

        The stream is a sequence of permutations of the active tasks, epoch e shuffled by a RNG seeded
        with (seed, stage, e); a task already drawn in this call is skipped at an epoch boundary. Asking
        again for an iteration among the latest KEPT_SAMPLES sampled (a rerun after a crash, also of iterations
        async RL sampled ahead) returns the same tasks.
        """
        stage = self._require_stage()
        if n < 1:
            raise ValueError(f"TaskPool.sample: n={n} is invalid; allowed: >= 1")
        if not self.active:
            raise ValueError(
                f"TaskPool.sample: stage {stage} has no active tasks (check the task file and filters)"
            )
        want = min(n, len(self.active))
        for last in self.samples:
            if last["stage"] == stage and last["iteration"] == iteration:
                if len(last["tasks"]) != want:
                    raise ValueError(
                        f"TaskPool.sample: iteration {iteration} of {stage} was sampled with {len(last['tasks'])} "
                        f"tasks, now {want} are asked for; keep tasks_per_iteration fixed when resuming"
                    )
                return list(last["tasks"])
        size = len(self.active)
        cursor = self.cursor.get(stage, 0)
        chosen: list[str] = []
        seen: set[str] = set()
        order: list[str] = []
        order_epoch = -1
        while len(chosen) < want:
            epoch, offset = divmod(cursor, size)
            if epoch != order_epoch:
                order, order_epoch = self._epoch_order(stage, epoch), epoch
            tid = order[offset]
            cursor += 1
            if tid not in seen:
                seen.add(tid)
                chosen.append(tid)
        self.cursor[stage] = cursor
        self.samples = [*self.samples, {"stage": stage, "iteration": iteration, "tasks": chosen}][
            -KEPT_SAMPLES:
        ]
        return list(chosen)

    def _epoch_order(self, stage: str, epoch: int) -> list[str]:
        order = sorted(self.active)
        # A string seed is hashed with SHA-512 by random.Random, so it is the same in every process.
        random.Random(f"{self.seed}:{stage}:{epoch}").shuffle(order)
        return order

    def _require_stage(self) -> str:
        if self.stage is None:
            raise ValueError("TaskPool: call start_stage(name) before sampling or recording")
        return self.stage
