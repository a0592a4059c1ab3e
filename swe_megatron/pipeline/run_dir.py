"""The run directory: config, committed state, checkpoints, task-pool history, trajectories, TensorBoard logs.

    RUN/config.yaml              the resolved config of the run (written once, checked on every resume)
    RUN/state.json               committed progress: the units done (one atomic write per unit, LAST)
    RUN/pool.json                the task pool as the running iteration leaves it (live, may be ahead)
    RUN/units/UNIT/              everything one unit (an iteration, a warm start, an eval) writes:
        trajectories.jsonl, metrics.json, pool.json (the pool after the unit), ...
    RUN/checkpoints/UNIT/        trainer checkpoint (dist/) and HF export (hf/) after the unit (the last
                                 checkpoint.keep_last units' are kept)
    RUN/tensorboard/NAME/        event files (NAME: the config's name, the run TensorBoard lists)
    RUN/eval/                    the eval table and SWE-bench predictions

A unit is committed by one atomic rewrite of state.json after its checkpoint, trajectories and pool
snapshot are complete. On resume, units after the last committed one are redone from scratch: their
folders are wiped, the live pool is restored from the last committed snapshot, so nothing is lost or
counted twice, also after SIGKILL mid-unit.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import OmegaConf

from swe_megatron.atomic_write import write_atomic, write_json_atomic
from swe_megatron.config.load import resolve_paths
from swe_megatron.errors import UsageError
from swe_megatron.monitor import Monitor, NullMonitor, fenced, key_layout

if TYPE_CHECKING:  # algo imports torch: `swe-megatron status` reads a run folder without it
    from swe_megatron.algo import TaskPool

STATE_FORMAT = 1
RUN_MARKERS = ("config.yaml", "state.json", "driver.lock")
"""Entries only a run folder has (driver.lock: a first start that stopped before writing its config)."""
EARLY_ENTRIES = ("logs", "jobs", "slurm", "STOP")
"""What a folder may hold before its run's first start (the launcher's job and log folders, a stop request)."""
RESUME_KEYS = ("model", "seed", "schedule", "tasks.train_file")
"""Config keys that must not change when a run resumes (weights, sampling streams and unit order depend on them)."""
STAGE_RESUME_KEYS = ("tasks_per_iteration", "samples_per_task", "warm_start")
"""Per-stage keys that must not change for a stage that has committed units."""


def _get(cfg_dict: dict, dotted: str) -> Any:
    node: Any = cfg_dict
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _differences(key: str, a: Any, b: Any) -> list[str]:
    """`key.leaf: a -> b` for each leaf that differs (mappings compared key by key, not printed whole)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [
            d for k in sorted(a.keys() | b.keys()) for d in _differences(f"{key}.{k}", a.get(k), b.get(k))
        ]
    return [] if a == b else [f"{key}: {json.dumps(a)} -> {json.dumps(b)}"]


def resume_conflicts(old: dict, new: dict, started_stages: list[str]) -> list[str]:
    """Human-readable differences between two resolved configs that break a resume (empty: compatible). A stage
    that a later stage of the schedule has followed keeps its iterations (more would train it after its successor)."""
    keys = [*RESUME_KEYS, *(f"{stage}.{key}" for stage in started_stages for key in STAGE_RESUME_KEYS)]
    schedule = old.get("schedule") or []
    keys += [
        f"{s}.iterations" for i, s in enumerate(schedule) if set(schedule[i + 1 :]) & set(started_stages)
    ]
    return [d for key in keys for d in _differences(key, _get(old, key), _get(new, key))]


def state_problem(state: Any) -> str | None:
    """What is wrong with the shape of a state.json's content (None: a state this code wrote)."""
    if not isinstance(state, dict):
        return f"holds {type(state).__name__}, not an object"
    ckpt = state.get("checkpoint")
    checks = {
        "format": state.get("format") == STATE_FORMAT,
        "done": isinstance(state.get("done"), list) and all(isinstance(u, str) for u in state["done"]),
        "checkpoint": ckpt is None or (isinstance(ckpt, dict) and isinstance(ckpt.get("path"), str)),
        "step": isinstance(state.get("step"), int)
        and not isinstance(state["step"], bool)
        and state["step"] >= 0,
    }
    bad = [key for key, ok in checks.items() if not ok]
    return f"has a malformed {', '.join(bad)} (format {STATE_FORMAT} expected)" if bad else None


def committed_note(root: str | Path) -> str:
    """What an interrupted run keeps, in one phrase: its committed units and how to go on."""
    try:
        done = RunDir(root).state["done"]
    except UsageError:
        done = []
    if not done:
        return f"committed: nothing yet in {root}; rerun the same command to start"
    return f"committed: {len(done)} unit(s), the last {done[-1]} ({root}); rerun the same command to resume"


class RunDir:
    """Paths and committed state of one run directory (UsageError, writing nothing, when it is damaged)."""

    def __init__(self, root: str | Path, keep_last: int = 1):
        self.root = Path(root)
        self.keep_last = keep_last
        self.state_path = self.root / "state.json"
        self.config_path = self.root / "config.yaml"
        self.pool_path = self.root / "pool.json"
        self.tensorboard = self.root / "tensorboard"
        self.eval_dir = self.root / "eval"
        self.state: dict[str, Any] = {"format": STATE_FORMAT, "done": [], "checkpoint": None, "step": 0}
        if self.root.exists() and not self.root.is_dir():
            raise UsageError(
                f"run_dir={self.root} is not a folder; give a new or an existing run's run_dir=..."
            )
        if self.state_path.exists():
            try:
                self.state = json.loads(self.state_path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
                raise UsageError(
                    f"{self.state_path} cannot be read ({e}); the run directory is damaged"
                ) from None
            problem = state_problem(self.state)
            if problem:
                raise UsageError(
                    f"{self.state_path} {problem}; the run directory is damaged: restore it or use a new run_dir=..."
                )

    def check_is_run(self) -> None:
        """UsageError, writing nothing, when root is a folder holding files of something other than a run (a run
        writes into its folder and wipes parts of it: it must never take over someone else's)."""
        if not self.root.is_dir():
            return
        names = {p.name for p in self.root.iterdir()}
        if names & set(RUN_MARKERS) or names <= set(EARLY_ENTRIES):
            return
        shown = ", ".join(sorted(names - set(EARLY_ENTRIES))[:3])
        raise UsageError(
            f"run_dir={self.root} already holds files that are not a run's ({shown}{', ...' if len(names) > 3 else ''}"
            "); give a new or empty folder, or an existing run's run_dir=..."
        )

    # config ---------------------------------------------------------------------------------------
    def bind_config(self, cfg) -> None:
        """Store cfg on a new run; on a resumed run, refuse a config that breaks the resume."""
        new = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
        self.root.mkdir(parents=True, exist_ok=True)
        if self.config_path.exists():
            old = OmegaConf.to_container(OmegaConf.load(self.config_path), resolve=True)
            resolve_paths(old)  # a run stored before paths were made absolute at load
            started = sorted({u.split(":")[0] for u in self.state["done"]})
            bad = resume_conflicts(old, new, started)
            if bad:
                raise UsageError(
                    f"{self.root} holds a run whose config differs in ways that break resuming: "
                    + "; ".join(bad)
                    + f". Rerun with the stored config ({self.config_path}) or use a new run_dir=..."
                )
        write_atomic(self.config_path, OmegaConf.to_yaml(OmegaConf.create(new)))

    # units ----------------------------------------------------------------------------------------
    def is_done(self, unit: str) -> bool:
        """Whether `unit` ("stage:iteration", "rft:warm_start", "eval") is committed."""
        return unit in self.state["done"]

    @property
    def step(self) -> int:
        """Global iteration counter (TensorBoard's x axis): committed training units so far."""
        return int(self.state["step"])

    def unit_dir(self, unit: str, fresh: bool = False) -> Path:
        """The folder of a unit's outputs; fresh=True wipes leftovers of an uncommitted earlier attempt."""
        d = self.root / "units" / unit.replace(":", "-")
        if fresh:
            shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True, exist_ok=True)
        return d

    def unit_metrics(self, unit: str) -> dict:
        """A unit's metrics.json ({} when it wrote none, e.g. init)."""
        path = self.root / "units" / unit.replace(":", "-") / "metrics.json"
        return json.loads(path.read_text()) if path.is_file() else {}

    def checkpoint_dir(self, unit: str) -> Path:
        """Where a unit's checkpoint goes (wiped first: an uncommitted attempt may have left one)."""
        d = self.root / "checkpoints" / unit.replace(":", "-")
        shutil.rmtree(d, ignore_errors=True)
        d.parent.mkdir(parents=True, exist_ok=True)
        return d

    @property
    def checkpoint(self) -> dict | None:
        """{"unit", "path" (relative to the run dir), "stage"} of the last committed checkpoint, or None."""
        return self.state.get("checkpoint")

    def open_pool(self, task_ids: list[str], seed: int) -> TaskPool:
        """The live task pool: pool.json's (it must hold these tasks and seed) if there, else a new one, saved."""
        from swe_megatron.algo import TaskPool

        if not self.pool_path.exists():
            pool = TaskPool(task_ids, seed)
            self.save_pool(pool)
            return pool
        try:
            pool = TaskPool.from_dict(json.loads(self.pool_path.read_text(encoding="utf-8")))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise UsageError(
                f"task pool {self.pool_path} cannot be read ({e}); delete it to start the history afresh"
            ) from None
        if pool.seed != int(seed) or set(pool.task_ids) != set(task_ids):
            raise UsageError(
                f"task pool {self.pool_path} was created with seed {pool.seed} and {len(pool.task_ids)} tasks, but "
                f"this run has seed {seed} and {len(task_ids)} tasks; use a fresh run directory or the original tasks"
            )
        return pool

    def save_pool(self, pool: TaskPool) -> None:
        """Write the live task pool (atomically); call after every change, the next commit snapshots it."""
        write_json_atomic(self.pool_path, pool.to_dict(), separators=(",", ":"))

    def restore_pool(self) -> None:
        """Make the live pool file the one of the last committed unit (or none), dropping uncommitted changes."""
        last = self.state.get("pool_snapshot")
        if last and (self.root / last).exists():
            shutil.copyfile(self.root / last, self.pool_path)
        else:
            self.pool_path.unlink(missing_ok=True)

    def commit(self, unit: str, checkpoint: dict | None = None, train_step: bool = True, **extra) -> None:
        """Record `unit` as done: snapshot the pool, then ONE atomic state write; then the checkpoints before the
        last `keep_last` are deleted (state["checkpoints"] lists the kept ones, oldest first)."""
        d = self.unit_dir(unit)
        if self.pool_path.exists():
            shutil.copyfile(self.pool_path, d / "pool.json")
            self.state["pool_snapshot"] = str((d / "pool.json").relative_to(self.root))
        previous = self.state.get("checkpoint")
        state = dict(self.state)
        state["done"] = [*state["done"], unit]
        dropped: list[str] = []
        if checkpoint is not None:
            state["checkpoint"] = checkpoint
            kept = list(state.get("checkpoints") or ([previous["path"]] if previous else []))
            kept = [p for p in kept if p != checkpoint["path"]] + [checkpoint["path"]]
            dropped, state["checkpoints"] = kept[: -self.keep_last], kept[-self.keep_last :]
        if train_step:
            state["step"] = int(state["step"]) + 1
        state.update(extra)
        write_atomic(self.state_path, json.dumps(state, indent=1))
        self.state = state
        for path in dropped:  # after the commit: a crash in between leaves an extra checkpoint, never too few
            shutil.rmtree(self.root / path, ignore_errors=True)


def open_monitor(run: RunDir, cfg):
    """The run's monitor: TensorBoard (see _tensorboard), and with monitor.wandb.enabled a W&B sink beside it."""
    tensorboard = cfg.monitor.tensorboard
    monitor = _tensorboard(run, cfg) if tensorboard else NullMonitor(progress=cfg.monitor.progress)
    if not cfg.monitor.wandb.enabled:
        return monitor
    from swe_megatron.monitor.wandb_sink import WandbSink  # imports wandb: only runs that log to it

    plain = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)  # W&B's config panel shows it
    return WandbSink(monitor, cfg.monitor.wandb, name=cfg.name, run_dir=run.root, config=plain)


def _tensorboard(run: RunDir, cfg) -> Monitor:
    """TensorBoard, writing into RUN/tensorboard/<cfg.name> (the run TensorBoard lists) with the key curves pinned
    (monitor.key_layout) and, on a fresh run, its config as text (`config`, step 0); events at or after the first
    uncommitted step are purged on resume."""
    log_dir = run.tensorboard / cfg.name
    monitor = Monitor(log_dir, progress=cfg.monitor.progress)
    if run.step:
        # TensorBoard drops events with step >= purge_step written by earlier (killed) writers.
        from torch.utils.tensorboard import SummaryWriter

        monitor._writer.close()
        monitor._writer = SummaryWriter(str(log_dir), purge_step=run.step)
    stages = ["warm_start"] * (cfg.rft.warm_start == "scripted" and "rft" in cfg.schedule) + [
        s for s in cfg.schedule if s != "eval"
    ]
    monitor.layout(key_layout(stages, cfg.algo.max_staleness >= 1))
    if not run.step:  # a resume keeps the fresh run's (its config is checked to be the same)
        monitor.text("config", fenced(OmegaConf.to_yaml(cfg, resolve=True), "yaml"), 0)
    return monitor
