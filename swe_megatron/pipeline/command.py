"""`swe-megatron run CONFIG [key=value ...]` and `swe-megatron eval CONFIG --checkpoint DIR --tasks FILE --runs N`.

run: the whole schedule (rft -> stage1 -> stage2 -> eval), resumable: rerunning the same command continues
after the last committed iteration in run_dir. eval: pass@1 (mean +- SEM over N runs) and pass@k of an HF
checkpoint on a task file, plus SWE-bench predictions JSONL.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from swe_megatron.config.load import load_config
from swe_megatron.errors import UsageError, output_folder
from swe_megatron.monitor.console import library_warnings_to
from swe_megatron.tasks.load import load_tasks_for_command


def _run(args: argparse.Namespace) -> int:
    # lazy: torch, transformers (pipeline.driver, run_dir); the CLI imports every command module at start
    from swe_megatron.pipeline.run_dir import RunDir, committed_note

    cfg = load_config(args.config, args.overrides)
    # A damaged run_dir, or a folder that is not a run, is refused here, before any process starts or anything is
    # written (the lock, a live driver's: pipeline/run_lock.py, is the driver's first act).
    RunDir(cfg.run_dir).check_is_run()
    args.kept = lambda: committed_note(cfg.run_dir)
    library_warnings_to(Path(cfg.run_dir) / "logs" / "library-warnings.log")  # before Megatron is imported
    from swe_megatron.pipeline.driver import run

    return run(cfg)


def _eval(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.overrides)
    ckpt = Path(args.checkpoint)
    model_dir = ckpt / "hf" if (ckpt / "hf" / "config.json").exists() else ckpt
    if not (model_dir / "config.json").exists():
        raise UsageError(f"--checkpoint {ckpt}: no HF checkpoint (config.json) there or in {ckpt}/hf")
    tasks = load_tasks_for_command(args.tasks, args.max_tasks)
    if args.runs < 1:
        raise UsageError(f"--runs {args.runs} is invalid; allowed: an integer >= 1")
    # lazy: torch, transformers (pipeline.eval, topology, rollout.setup)
    from swe_megatron.pipeline.eval import check_model_name, checkpoint_model_name, command_ks, evaluate

    name = check_model_name(args.model_name) if args.model_name else checkpoint_model_name(cfg, model_dir)
    if args.out:
        out = output_folder(args.out)
    else:  # the default folder: the refusal names what the user can do, not an option they never gave
        out = output_folder(str(ckpt / "eval"), flag="the default output folder (no --out given)",
                            remedy="give --out NEW_DIR, or remove it")  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    library_warnings_to(out / "library-warnings.log")
    from omegaconf import OmegaConf

    from swe_megatron.pipeline.topology import Topology
    from swe_megatron.rollout.setup import Rollouts

    (out / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    with Topology(cfg, out / "topology", out / "config.yaml") as topo:
        sandboxes = topo.start_sandbox_server()
        engine = topo.start_engines(str(model_dir), cfg.eval.context_length)
        _, text = evaluate(
            Rollouts(cfg, engine, sandboxes, topo.chat),
            tasks,
            args.runs,
            out,
            name,
            ks=command_ks(args.runs),
        )
    print(f"\n{text}\n\ntable: {out / 'table.md'}\nSWE-bench predictions: {out / 'predictions.jsonl'}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the run and eval subcommands."""
    p = sub.add_parser("run", help="run (or resume) a config's schedule: rft -> stage1 -> stage2 -> eval")
    p.add_argument("config", metavar="CONFIG", help="a preset under configs/ or a YAML path")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides")
    p.set_defaults(func=_run)
    e = sub.add_parser(
        "eval", help="pass@1 +- SEM over N runs, pass@k and SWE-bench predictions of a checkpoint"
    )
    e.add_argument("config", metavar="CONFIG", help="a preset under configs/ or a YAML path")
    e.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides")
    e.add_argument(
        "--checkpoint",
        required=True,
        metavar="DIR",
        help="HF checkpoint folder (or a run's checkpoint with hf/)",
    )
    e.add_argument("--tasks", required=True, metavar="FILE", help="JSONL task file")
    e.add_argument(
        "--runs", type=int, default=10, metavar="N", help="runs per task (default 10, the paper's); pass@1 and pass@N are reported"
    )
    e.add_argument("--max-tasks", type=int, metavar="N", help="only the first N tasks (default: all)")
    e.add_argument("--out", metavar="DIR", help="output folder, new or empty (default: DIR/eval)")
    e.add_argument(
        "--model-name",
        help="model_name_or_path in the predictions, a plain identifier (default: MODEL__CHECKPOINT)",
    )
    e.set_defaults(func=_eval)
