"""`swe-megatron status RUN_DIR`: where a run stands, read from its folder (fast: no torch, no servers).

    run_dir: runs/embedded (config embedded, model tiny-qwen2)
    units: 5 of 7 done; left: stage2:0, eval
    last: stage1:1  resolved 0.250  loss 0.0123 (dapo)
    driver: live, pid 4242 on host n1 since 2026-01-01 10:00:00 (stop: Ctrl-C in its terminal or kill -INT 4242)

It writes nothing and takes no lock: it only looks whether a driver holds the folder's (pipeline/run_lock.py).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from omegaconf import OmegaConf

from swe_megatron.errors import UsageError
from swe_megatron.pipeline import run_lock
from swe_megatron.pipeline.run_dir import RunDir


def planned_units(cfg) -> list[str]:
    """Every unit the schedule of cfg (a RunConfig, or the run's stored config.yaml) will commit, in order."""
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


def key_figures(metrics: dict) -> str:
    """A unit's resolved rate and loss from its metrics.json ("" when it has neither). A warm start's loss is its
    last step's: the unit's mean over all its steps hides where it ended."""
    ws, train, reward = metrics.get("warm_start", {}), metrics.get("train", {}), metrics.get("reward", {})
    parts = []
    resolved = reward.get("resolved_rate", ws.get("resolved_rate"))
    if resolved is not None:
        parts.append(f"resolved {resolved:.3f}")
    for key, name in (("final_loss", "last warm-start step"), ("dapo_loss", "dapo"), ("sft_loss", "sft")):
        value = (ws if key == "final_loss" else train).get(key)
        if value is not None:
            parts.append(f"loss {value:.4g} ({name})")
            break
    return "  ".join(parts)


def _eval_line(run: RunDir) -> str | None:
    try:
        report = json.loads((run.eval_dir / "report.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return (f"eval: pass@1 {report.get('pass@1', float('nan')):.3f} +- {report.get('pass@1_sem', float('nan')):.3f} "
            f"over {report.get('runs')} run(s) of {report.get('tasks')} task(s) ({run.eval_dir / 'table.md'})")  # fmt: skip


def _driver_line(root: Path) -> str:
    owner = run_lock.holder(root)
    if owner is None:
        return f"driver: none holds the folder; rerun its `swe-megatron run ... run_dir={root}` to resume"
    pid = owner.get("pid", "PID")
    return f"driver: live, {run_lock.describe(owner)} (stop: Ctrl-C in its terminal or kill -INT {pid})"


def status_lines(root: str | Path) -> list[str]:
    """What `swe-megatron status` prints for run folder root (UsageError when root is not a run's folder)."""
    run = RunDir(root)  # a damaged state.json is refused there
    if not run.state_path.exists() and not run.config_path.exists():
        raise UsageError(f"{root} is not a run folder (no state.json or config.yaml); give a run's run_dir")
    done = run.state["done"]
    lines = []
    if run.config_path.exists():
        cfg = OmegaConf.load(run.config_path)
        planned = planned_units(cfg)
        left = [u for u in planned if u not in done]
        lines.append(f"run_dir: {run.root} (config {cfg.get('name')}, model {cfg.model.name})")
        lines.append(
            f"units: {len(done)} of {len(planned)} done; left: {', '.join(left) or 'none (complete)'}"
        )
    else:
        lines += [f"run_dir: {run.root}", f"units: {len(done)} done (no config.yaml: the plan is not known)"]
    with_figures = [(u, key_figures(run.unit_metrics(u))) for u in reversed(done)]
    last = next(((u, f) for u, f in with_figures if f), None)
    if last is not None:
        lines.append(f"last: {last[0]}  {last[1]}")
    elif done:
        lines.append(f"last: {done[-1]}")
    if run.is_done("eval"):
        lines += [line for line in [_eval_line(run)] if line]
    lines.append(_driver_line(run.root))
    return lines


def _status(args: argparse.Namespace) -> int:
    if not Path(args.run_dir).is_dir():
        raise UsageError(f"{args.run_dir} is not a folder; give a run's run_dir (e.g. runs/embedded)")
    print("\n".join(status_lines(args.run_dir)))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the status subcommand."""
    p = sub.add_parser(
        "status", help="a run's units done and left, the last unit's figures, whether it is live"
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="the run's folder (its run_dir)")
    p.set_defaults(func=_status)
