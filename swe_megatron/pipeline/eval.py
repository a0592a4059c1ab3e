"""Evaluation as in the paper's Table 1: pass@1 as mean +- SEM over N runs, pass@k, SWE-bench predictions.

Each task is rolled out N times at the eval limits (temperature 1). Tasks with an infrastructure failure
in any run are left out of the table and counted (design.md invariant 4: never scored 0). Predictions are
written in the official harness's format: one JSON object per line with instance_id, model_name_or_path
and model_patch ("" for no patch); predictions.jsonl holds run 0, predictions-runR.jsonl every run R. The
model name is a plain identifier (`model_name`): SWE-bench makes it a folder of its log paths.
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from pathlib import Path

from swe_megatron.algo import mean_pass_at_k, mean_sem, pass_rate_per_run
from swe_megatron.errors import UsageError
from swe_megatron.rollout.setup import Rollouts
from swe_megatron.tasks.schema import Task
from swe_megatron.trajectory import Trajectory

PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")
"""A predictions' model_name_or_path: letters, digits, . _ -, optionally one "/" as in hub ids (org/model)."""


def model_name(*parts: str) -> str:
    """A plain model_name_or_path from parts (model name, config name, unit...): joined with "__", every run of
    other characters (spaces, parentheses, colons, slashes) made one "-"."""
    cleaned = (re.sub(r"[^A-Za-z0-9._-]+", "-", str(p)).strip("-.") for p in parts)
    return "__".join(c for c in cleaned if c) or "model"


def checkpoint_model_name(cfg, model_dir: Path) -> str:
    """The model name of a checkpoint as the run's own eval unit gives it (stages._evaluate: model, config, unit):
    a run's checkpoint folder is named after its unit (checkpoints/stage2-1/hf), so both give
    tiny-qwen2__embedded__stage2-1."""
    named = (model_dir.parent if model_dir.name == "hf" else model_dir).resolve().name
    return model_name(cfg.model.name, cfg.name, named)


def check_model_name(name: str) -> str:
    """`name` if it is a plain model_name_or_path (PLAIN_NAME), else UsageError naming what is allowed."""
    if not PLAIN_NAME.fullmatch(name):
        raise UsageError(
            f"model name {name!r} is invalid; allowed: letters, digits, '.', '_', '-' and one '/' "
            "(it names SWE-bench's log folders), e.g. tiny-qwen2__embedded__stage2-1"
        )
    return name


def eval_report(trajs: list[Trajectory], ks: list[int], model_name: str) -> dict:
    """pass@1 mean +- SEM over runs, pass@k for each k <= runs, counts; from N runs per task."""
    runs: dict[str, list[Trajectory]] = defaultdict(list)
    for t in sorted(trajs, key=lambda t: (t.task_id, t.sample_index)):
        runs[t.task_id].append(t)
    clean = {
        tid: [bool(t.resolved) for t in ts] for tid, ts in runs.items() if not any(t.excluded for t in ts)
    }
    n_runs = max((len(v) for v in runs.values()), default=0)
    report = {"model": model_name, "tasks": len(runs), "tasks_scored": len(clean), "runs": n_runs,
              "tasks_left_out_infra": len(runs) - len(clean)}  # fmt: skip
    if clean:
        per_run = pass_rate_per_run(clean)
        mean, sem = mean_sem(per_run)
        report |= {"pass@1": 100 * mean, "pass@1_sem": 100 * sem if not math.isnan(sem) else None,
                   "pass@1_per_run": [100 * x for x in per_run]}  # fmt: skip
        for k in ks:
            if 1 <= k <= n_runs:
                report[f"pass@{k}"] = 100 * mean_pass_at_k(clean, k)
    return report


def table(report: dict, ks: list[int]) -> str:
    """The report as a Markdown table in the form of the paper's Table 1."""
    cols = [k for k in ks if k != 1 and f"pass@{k}" in report]
    head = "| model | pass@1 |" + "".join(f" pass@{k} |" for k in cols)
    sep = "|---|---|" + "---|" * len(cols)
    if "pass@1" in report:
        sem = report.get("pass@1_sem")
        p1 = f"{report['pass@1']:.1f} +- {sem:.2f}" if sem is not None else f"{report['pass@1']:.1f}"
    else:
        p1 = "n/a"
    row = f"| {report['model']} | {p1} |" + "".join(f" {report[f'pass@{k}']:.1f} |" for k in cols)
    note = (f"\n{report['tasks_scored']} tasks x {report['runs']} runs (mean +- SEM over runs, %); "
            f"{report['tasks_left_out_infra']} task(s) left out for infrastructure failures.")  # fmt: skip
    return "\n".join([head, sep, row]) + note


def write_predictions(trajs: list[Trajectory], model_name: str, out_dir: Path) -> Path:
    """SWE-bench predictions JSONL per run; returns the run-0 file."""
    by_run: dict[int, list[dict]] = defaultdict(list)
    for t in sorted(trajs, key=lambda t: (t.sample_index, t.task_id)):
        by_run[t.sample_index].append(
            {"instance_id": t.task_id, "model_name_or_path": model_name, "model_patch": t.patch or ""}
        )
    for r, rows in by_run.items():
        (out_dir / f"predictions-run{r}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
    first = out_dir / "predictions.jsonl"
    first.write_text((out_dir / "predictions-run0.jsonl").read_text() if 0 in by_run else "")
    return first


def command_ks(runs: int) -> list[int]:
    """The pass@k values `swe-megatron eval --runs N` reports: pass@1 and pass@N (the paper's Table 1: pass@1 and
    pass@10 over 10 runs). k follows the runs the user asked for; eval.k belongs to the config's own eval.runs
    (embedded: 3 runs, k [1, 3]) and would report pass@3, not pass@10, for --runs 10."""
    return sorted({1, runs})


def evaluate(
    rollouts: Rollouts, tasks: list[Task], runs: int, out_dir: Path, model_name: str, ks: list[int] | None = None
) -> tuple[dict, str]:
    """Roll out every task `runs` times at the eval limits; write report.json, table.md and the predictions.
    ks: the pass@k values reported (default eval.k, the run's eval unit's; those above `runs` are left out)."""
    check_model_name(model_name)
    ev = rollouts.cfg.eval
    trajs, stats = rollouts.run(tasks, runs, rollouts.limits(ev), out_dir)
    ks = list(ev.k if ks is None else ks)
    report = eval_report(trajs, ks, model_name) | {"seconds": stats.time_split()}
    write_predictions(trajs, model_name, out_dir)
    text = table(report, ks)
    (out_dir / "report.json").write_text(json.dumps(report, indent=1))
    (out_dir / "table.md").write_text(text + "\n")
    return report, text
