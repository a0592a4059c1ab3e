"""The recipe as a list of stage calls: rft (warm start, RFT iterations) -> stage1 -> stage2 -> eval.

`run(cfg)` resumes whatever the run directory already committed. Units, in order: init (starting weights),
rft:warm_start (only with rft.warm_start: scripted; NOT the paper's), rft:0.., stage1:0.., stage2:0..,
eval. Every trainer rank runs it (pipeline/spmd.py): alone (world size 1) this process drives rollouts,
grading and batching and trains; started by torchrun/srun with parallel.world_size ranks, rank 0 drives and
owns the servers and the run directory, and every rank trains on the batch rank 0 broadcasts.

Graceful stop: after each committed unit, if RUN_DIR/STOP exists, `run` stops and returns EXIT_RESUMABLE (75),
leaving the file for the launcher (which removes it when it starts the next attempt; see launch/steps.py).
"""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path

from swe_megatron.engine.gate import VersionGate
from swe_megatron.model.hf_config import check_matches_hf
from swe_megatron.model.tokenizer import save_tokenizer
from swe_megatron.monitor import NullMonitor
from swe_megatron.monitor.console import UnitClock
from swe_megatron.pipeline import run_lock, spmd
from swe_megatron.pipeline.ahead import Ahead
from swe_megatron.pipeline.run_dir import RunDir, open_monitor
from swe_megatron.pipeline.stages import (
    Context,
    dapo_iteration,
    final_eval,
    initial_policy,
    rft_iteration,
    warm_start,
)
from swe_megatron.pipeline.status import planned_units
from swe_megatron.pipeline.tasks import ensure_tasks, log_task_filter
from swe_megatron.pipeline.topology import NullTopology, Topology
from swe_megatron.rollout.setup import Rollouts
from swe_megatron.tasks.filters import FilterReport
from swe_megatron.train.weight_sync import pipeline_method

EXIT_RESUMABLE = 75
"""Exit status of a run stopped on request (RUN_DIR/STOP) before the end of its schedule."""
STOP_FILE = "STOP"
"""RUN_DIR/STOP: stop after the unit in flight commits."""


class StopRequested(Exception):
    """RUN_DIR/STOP was found after a committed unit."""


def _check_stop(ctx: Context) -> None:
    """Raise StopRequested on every rank if rank 0 sees a stop request (only between units: a committed state)."""
    if ctx.world.lead((ctx.run.root / STOP_FILE).exists):
        done = ctx.run.state["done"]
        raise StopRequested(done[-1] if done else "nothing")


def run(cfg) -> int:
    """Run (or resume) the schedule of cfg on this trainer rank (every rank calls it); returns an exit status."""
    with spmd.start(cfg.parallel, cfg.seed) as world:
        try:
            status = _run(cfg, world)
        finally:  # after _run: its servers are stopped by then
            run_lock.release(cfg.run_dir)
        # Every rank leaves with rank 0's status, and only once rank 0 has stopped its servers: a launcher that
        # kills the remaining ranks when one exits (srun --kill-on-bad-exit, torchrun) does not cut rank 0 short.
        return world.lead(lambda: status)


def _open(cfg, run_dir: RunDir) -> tuple[dict, list, FilterReport, dict]:
    """Rank 0: lock the run directory (UsageError while another driver holds it), bind the config to it; training
    and held-out tasks, the task filters' report; the committed state."""
    run_lock.RunLock.take(run_dir.root)  # first: a second start must not write or reap anything of a live run
    if cfg.model.hf_path:
        check_matches_hf(cfg.model, cfg.model.hf_path)  # before anything is written or started
    run_dir.bind_config(cfg)
    return (*ensure_tasks(cfg), run_dir.state)


def resume_line(root: Path, done: list[str]) -> str | None:
    """The line a run prints when it picks up a folder with committed units (None for a fresh one)."""
    return f"run: resuming {root} after {done[-1]} ({len(done)} unit(s) committed)" if done else None


def _resume(cfg, run_dir: RunDir) -> list[Path]:
    """Rank 0: the live pool as last committed; the tokenizer files that go into every HF export."""
    if line := resume_line(run_dir.root, run_dir.state["done"]):
        print(line, flush=True)
    run_dir.restore_pool()
    tok = save_tokenizer(cfg.model.tokenizer, run_dir.root / "tokenizer")
    return sorted(p for p in tok.iterdir() if p.is_file())


def _start_servers(cfg, topo: Topology, model_dir: str, gate: VersionGate, version: int) -> Rollouts:
    """Rank 0: the sandbox server(s) and the engines, serving model_dir (weight version `version`) at the
    schedule's longest context behind `gate`, and the run's Rollouts around them."""
    sandboxes = topo.start_sandbox_server()
    contexts = [getattr(cfg, s).context_length for s in cfg.schedule if s != "eval"] + [
        cfg.eval.context_length
    ]
    engine = topo.start_engines(model_dir, max(contexts))
    return Rollouts(cfg, gate.serve(engine, version), sandboxes, topo.chat)


def _run(cfg, world: spmd.World) -> int:
    weight_sync = pipeline_method(cfg.engine.weight_sync)  # every rank refuses an unsupported method alike
    run_dir = RunDir(cfg.run_dir, cfg.checkpoint.keep_last)
    train, test, task_filter, run_dir.state = world.lead(
        _open, cfg, run_dir, share=lambda r: ({}, [], None, r[3])
    )
    if all(run_dir.is_done(u) for u in planned_units(cfg)):
        return world.lead(_summary, run_dir, True)
    tokenizer_files = world.lead(_resume, cfg, run_dir)
    monitor = world.on_driver(open_monitor, run_dir, cfg, default=NullMonitor())
    world.on_driver(log_task_filter, monitor, task_filter, default=None)
    # reap=True: this rank holds the run's lock (_open), so servers recorded there are a dead driver's.
    make_topology = functools.partial(Topology, reap=True)
    topology = world.on_driver(
        make_topology, cfg, run_dir.root / "topology", run_dir.config_path, default=NullTopology()
    )
    sync = weight_sync.for_run(cfg.engine, tokenizer_files)
    gate = VersionGate(per_episode=not cfg.agent.partial_rollouts)
    ahead = Ahead(gate)
    # Closed in reverse: rollouts still running ahead stop before the servers they use.
    with topology as topo, contextlib.closing(sync), contextlib.closing(ahead):
        ctx = Context(cfg, run_dir, topo, monitor, train, tokenizer_files, world=world, weight_sync=sync,
                      gate=gate, ahead=ahead, clock=UnitClock(planned_units(cfg), run_dir.state["done"]))  # fmt: skip
        try:
            initial_policy(ctx)
            _check_stop(ctx)
            ctx.rollouts = world.lead(
                _start_servers, cfg, topo, ctx.hf_dir, gate, run_dir.step, share=lambda _: None
            )
            for name in cfg.schedule:
                if name == "rft":
                    warm_start(ctx)
                    _check_stop(ctx)
                    for it in range(cfg.rft.iterations):
                        rft_iteration(ctx, it)
                        _check_stop(ctx)
                elif name in ("stage1", "stage2"):
                    for it in range(getattr(cfg, name).iterations):
                        dapo_iteration(ctx, name, it)
                        _check_stop(ctx)
                else:
                    final_eval(ctx, test)
        except StopRequested as stop:
            if not all(run_dir.is_done(u) for u in planned_units(cfg)):  # else the last unit ended the run
                monitor.close()
                world.on_driver(print, f"run: {run_dir.root / STOP_FILE} exists: stopped after {stop}; rerun to "
                                "resume (remove the file first when not launched by swe-megatron launch / slurm)",
                                default=None)  # fmt: skip
                return EXIT_RESUMABLE
    monitor.close()
    return world.lead(_summary, run_dir)


def _summary(run_dir: RunDir, nothing_to_do: bool = False) -> int:
    if nothing_to_do:
        print(f"run: {run_dir.root} is complete; nothing to do")
    print(f"\nrun: done -> {run_dir.root}")
    print(f"  TensorBoard logs: {run_dir.tensorboard}   (tensorboard --logdir {run_dir.tensorboard})")
    table = run_dir.eval_dir / "table.md"
    if table.exists():
        print(f"  eval table: {table}\n\n{table.read_text()}")
        print(f"  SWE-bench predictions: {run_dir.eval_dir / 'predictions.jsonl'}")
    return 0
