"""The recipe as a list of stage calls: rft (warm start, RFT iterations) -> stage1 -> stage2 -> eval.

`run(cfg)` resumes whatever the run directory already committed. Units, in order: init (starting weights),
rft:warm_start (only with rft.warm_start: scripted; NOT the paper's), rft:0.., stage1:0.., stage2:0..,
eval. World size 1: rank 0 (this process) drives rollouts, grading and batching and trains.

Graceful stop: after each committed unit, if RUN_DIR/STOP exists, `run` stops and returns EXIT_RESUMABLE (75),
leaving the file for the launcher (which removes it when it starts the next attempt; see launch/steps.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

from swe_megatron.errors import UsageError
from swe_megatron.pipeline.run_dir import RunDir, open_monitor
from swe_megatron.pipeline.stages import Context, dapo_iteration, initial_policy, rft_iteration, warm_start
from swe_megatron.pipeline.topology import Topology

EXIT_RESUMABLE = 75
"""Exit status of a run stopped on request (RUN_DIR/STOP) before the end of its schedule."""
STOP_FILE = "STOP"
"""RUN_DIR/STOP: stop after the unit in flight commits."""


class StopRequested(Exception):
    """RUN_DIR/STOP was found after a committed unit."""


def _check_stop(run_dir: RunDir) -> None:
    """Raise StopRequested if a stop was asked for (called only between units, i.e. at a committed state)."""
    if (run_dir.root / STOP_FILE).exists():
        done = run_dir.state["done"]
        raise StopRequested(done[-1] if done else "nothing")


def planned_units(cfg) -> list[str]:
    """Every unit the schedule will commit, in order."""
    units = ["init"]
    for name in cfg.schedule:
        if name == "eval":
            units.append("eval")
            continue
        stage = getattr(cfg, name)
        if name == "rft" and stage.warm_start == "scripted":
            units.append("rft:warm_start")
        units += [f"{name}:{it}" for it in range(stage.iterations)]
    return units


def spread_over_repos(tasks: list) -> list:
    """Tasks in round-robin order over their repositories (each repository's own order kept), so that the first
    N span as many libraries as possible."""
    by_repo: dict[str, list] = {}
    for t in tasks:
        by_repo.setdefault(t.repo, []).append(t)
    queues = [by_repo[r] for r in sorted(by_repo)]
    return [q[i] for i in range(max(map(len, queues), default=0)) for q in queues if i < len(q)]


def ensure_tasks(cfg) -> tuple[dict, list]:
    """Training tasks (dict by id; at most tasks.max_train_tasks, spread over the repositories) and held-out tasks; built with the factory if missing."""
    from swe_megatron.rollout.setup import load_tasks

    train_file = Path(cfg.tasks.train_file)
    if not train_file.exists():
        if train_file.name != "train.jsonl":
            raise UsageError(f"tasks.train_file={train_file} does not exist; build tasks with make-tasks")
        from swe_megatron.tasks.factory.build import FactoryConfig, make_tasks

        print(
            f"run: {train_file} is missing; building tasks offline into {train_file.parent} (cached)",
            flush=True,
        )
        make_tasks(FactoryConfig(out=str(train_file.parent), max_tasks=cfg.tasks.factory_max_tasks),
                   log=lambda line: print(line, file=sys.stderr, flush=True))  # fmt: skip
    try:
        train = load_tasks(train_file)
        test_file = Path(cfg.eval.tasks or cfg.tasks.test_file)
        test = load_tasks(test_file) if test_file.exists() else []
    except (OSError, ValueError) as e:
        raise UsageError(f"cannot read tasks: {e}") from None
    train = sorted(train, key=lambda t: t.instance_id)
    if cfg.tasks.max_train_tasks:
        train = spread_over_repos(train)[: cfg.tasks.max_train_tasks]
    if not train:
        raise UsageError(f"{train_file} holds no tasks")
    return {t.instance_id: t for t in train}, test


def final_eval(ctx: Context, test_tasks: list) -> None:
    """Unit "eval": the final policy on the held-out tasks (Table 1 form), predictions for the harness."""
    from swe_megatron.pipeline.eval import evaluate

    if ctx.run.is_done("eval") or not test_tasks:
        return
    ev = ctx.cfg.eval
    tasks = test_tasks[: ev.max_tasks] if ev.max_tasks else test_tasks
    name = f"{ctx.cfg.model.name} ({ctx.cfg.name}, after {ctx.run.state['done'][-1]})"
    report, text = evaluate(ctx, tasks, ev.runs, ctx.run.eval_dir, name)
    ctx.monitor.scalars("eval", {k: v for k, v in report.items() if k.startswith("pass@") and k != "pass@1_per_run"},
                        ctx.run.step)  # fmt: skip
    ctx.monitor.text("eval/table", text, ctx.run.step)
    ctx.monitor.flush()
    ctx.run.commit("eval", train_step=False)


def run(cfg) -> int:
    """Run (or resume) the schedule of cfg; returns an exit status."""
    from swe_megatron.model.tokenizer import save_tokenizer

    run_dir = RunDir(cfg.run_dir)
    run_dir.bind_config(cfg)
    train, test = ensure_tasks(cfg)
    if all(run_dir.is_done(u) for u in planned_units(cfg)):
        print(f"run: {run_dir.root} is complete; nothing to do")
        return _summary(run_dir)
    run_dir.restore_pool()
    monitor = open_monitor(run_dir, cfg)
    tok = save_tokenizer(cfg.model.tokenizer, run_dir.root / "tokenizer")
    with Topology(cfg, run_dir.root / "topology", run_dir.config_path) as topo:
        topo.start_trainer_world()
        ctx = Context(cfg, run_dir, topo, monitor, train, sorted(p for p in tok.iterdir() if p.is_file()))
        try:
            initial_policy(ctx)
            _check_stop(run_dir)
            topo.start_sandbox_server()
            contexts = [getattr(cfg, s).context_length for s in cfg.schedule if s != "eval"] + [
                cfg.eval.context_length
            ]
            topo.start_engines(ctx.hf_dir, max(contexts))
            for name in cfg.schedule:
                if name == "rft":
                    warm_start(ctx)
                    _check_stop(run_dir)
                    for it in range(cfg.rft.iterations):
                        rft_iteration(ctx, it)
                        _check_stop(run_dir)
                elif name in ("stage1", "stage2"):
                    for it in range(getattr(cfg, name).iterations):
                        dapo_iteration(ctx, name, it)
                        _check_stop(run_dir)
                else:
                    final_eval(ctx, test)
        except StopRequested as stop:
            if all(run_dir.is_done(u) for u in planned_units(cfg)):
                pass  # the last unit committed: the run is complete, nothing to resume
            else:
                monitor.close()
                print(
                    f"run: {run_dir.root / STOP_FILE} exists: stopped after {stop}; rerun to resume "
                    f"(remove the file first when not launched by swe-megatron launch / slurm)",
                    flush=True,
                )
                return EXIT_RESUMABLE
    monitor.close()
    return _summary(run_dir)


def _summary(run_dir: RunDir) -> int:
    print(f"\nrun: done -> {run_dir.root}")
    print(f"  TensorBoard logs: {run_dir.tensorboard}   (tensorboard --logdir {run_dir.tensorboard})")
    table = run_dir.eval_dir / "table.md"
    if table.exists():
        print(f"  eval table: {table}\n\n{table.read_text()}")
        print(f"  SWE-bench predictions: {run_dir.eval_dir / 'predictions.jsonl'}")
    return 0
