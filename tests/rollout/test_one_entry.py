"""One path from tasks to graded trajectories: every caller goes through rollout.setup.Rollouts, built once per
run, and tasks are read by tasks/load.py alone. The structural checks scan the package's source as text; the
behavioural one runs a training-style rollout and eval on one Rollouts through the real sandbox and grader."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from sandbox_servers import missing

from swe_megatron.config.schema import RunConfig, SandboxConfig
from swe_megatron.engine.scripted import ScriptedPolicy, gold_patch_script
from swe_megatron.pipeline.eval import evaluate
from swe_megatron.rollout import setup as rollout_setup
from swe_megatron.rollout.setup import Rollouts

PKG = Path(__file__).resolve().parents[2] / "swe_megatron"


def _holders(pattern: str) -> list[str]:
    rx = re.compile(pattern, re.MULTILINE)
    files = sorted(PKG.rglob("*.py"))
    return [str(p.relative_to(PKG)) for p in files if rx.search(p.read_text(encoding="utf-8"))]


@pytest.mark.parametrize(
    ("what", "pattern", "home"),
    [
        ("a rollout manager call", r"\brun_rollouts\(", ["rollout/rollouts.py", "rollout/setup.py"]),
        ("a RolloutSetup", r"\bRolloutSetup\(", ["rollout/setup.py"]),
        ("a task loader", r"^def load_tasks\b", ["tasks/load.py"]),
        ("a stand-in stage", r"SimpleNamespace", []),
        ("an import of a private of stages.py", r"from swe_megatron\.pipeline\.stages import \(?\s*_", []),
        ("a Context made outside the driver", r"\bContext\(", ["pipeline/driver.py"]),
    ],
)
def test_one_place(what, pattern, home):
    assert _holders(pattern) == home, f"{what} outside {home}"


@pytest.mark.sandbox
@pytest.mark.skipif(missing() is not None, reason=str(missing()))
def test_training_rollouts_and_eval_share_one_setup(tmp_path, gold_task, monkeypatch):
    """A stage's rollout and eval on the same Rollouts: the tokenizer is loaded once, both are graded in the
    real sandbox, and eval writes its report and predictions without a Context."""
    tasks, _ = gold_task
    loads = []
    real = rollout_setup.load_tokenizer
    monkeypatch.setattr(rollout_setup, "load_tokenizer", lambda name: loads.append(name) or real(name))
    cfg = RunConfig(run_dir=str(tmp_path / "run"), sandbox=SandboxConfig(command_timeout_s=60))
    cfg.monitor.progress = False
    rollouts = Rollouts(cfg, None)
    rollouts.engine = ScriptedPolicy(rollouts.chat, {tasks[0].instance_id: gold_patch_script(tasks[0].patch)})
    trajs, stats = rollouts.run(tasks, 1, rollouts.limits(cfg.stage1), tmp_path / "unit")
    assert stats.resolved == 1 and (tmp_path / "unit" / "grade" / tasks[0].instance_id).is_dir()
    report, text = evaluate(rollouts, tasks, 2, tmp_path / "eval", "gold")
    assert report["pass@1"] == 100.0 and report["runs"] == 2 and "| gold | 100.0" in text
    (row,) = [json.loads(x) for x in (tmp_path / "eval" / "predictions.jsonl").read_text().splitlines()]
    assert row["instance_id"] == tasks[0].instance_id and row["model_patch"] == trajs[0].patch
    assert loads == [cfg.model.tokenizer]
