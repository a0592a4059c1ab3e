"""What a run prints (issue 27 item 2): one line per committed unit; library warnings in a file, not the console."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

from swe_megatron.algo.dynamic_sampling import dynamic_sampling
from swe_megatron.monitor import console
from swe_megatron.monitor.console import UnitClock
from swe_megatron.pipeline.metrics import train_metrics

ROOT = Path(__file__).resolve().parents[2]


def test_one_line_per_committed_unit(monkeypatch):
    # The metrics as the units write them (metrics.json): an RL unit's loss is train/dapo_loss, RFT's train/sft_loss,
    # the warm start's the last epoch's mean (issue 38: the line looked for train/loss and never printed one).
    now = [100.0]
    monkeypatch.setattr(console.time, "monotonic", lambda: now[0])
    clock = UnitClock(["init", "rft:warm_start", "rft:0", "stage1:0", "stage1:1", "eval"], done=["init"])
    now[0] += 30
    warm = {"warm_start": {"resolved_rate": 0.5, "final_epoch_loss": 0.0312}, "train": {"sft_loss": 0.93}}
    assert clock.line("rft:warm_start", warm) == (
        "run: rft:warm_start committed in 30 s: resolved 0.50, loss 0.0312; 4 unit(s) left, ETA unknown until "
        "rft:0 commits"
    )
    rft = {"reward": {"resolved_rate": 0.5}, "episode": {"give_up_rate": 0.25},
           "train": {"sft_loss": 0.01234, "optimizer_steps": 2.0}}  # fmt: skip
    now[0] += 40
    assert clock.line("rft:0", rft) == (
        "run: rft:0 committed in 40 s: resolved 0.50, gave up 0.25, loss 0.01234; 3 unit(s) left, ETA 2m00s"
    )
    now[0] += 90
    dapo = {"reward": {"resolved_rate": 1.0}, "episode": {"give_up_rate": 0.0}, "train": {"dapo_loss": -0.5}}
    assert clock.line(
        "stage1:0", dapo
    ) == (  # stage1:1 as stage1:0 (90 s), eval as the iterations' mean (65 s)
        "run: stage1:0 committed in 90 s: resolved 1.00, gave up 0.00, loss -0.5; 2 unit(s) left, ETA 2m35s"
    )
    now[0] += 3600
    clock.line("stage1:1")
    assert clock.line("eval", {}).endswith("; schedule done")


def test_eta_per_kind_of_unit(monkeypatch):
    """Issue 42: after init (4 s) the ETA said 4 s and after a 9-minute warm start 34 minutes when 4 remained, from
    the mean of all units; each kind is now estimated from its own (an unmeasured iteration from the others)."""
    now = [0.0]
    monkeypatch.setattr(console.time, "monotonic", lambda: now[0])
    clock = UnitClock(["init", "rft:warm_start", "rft:0", "stage1:0", "stage1:1", "stage2:0", "eval"])

    def commit(unit: str, seconds: float) -> str:
        now[0] += seconds
        return clock.line(unit).split("; ")[-1]

    assert commit("init", 4) == "6 unit(s) left, ETA unknown until rft:warm_start commits"
    assert commit("rft:warm_start", 540) == "5 unit(s) left, ETA unknown until rft:0 commits"
    assert commit("rft:0", 60) == "4 unit(s) left, ETA 4m00s"  # stage1, stage2 and eval as the rft iteration
    # stage1:1 as stage1:0 (30 s); stage2:0 and eval as the mean iteration, (60 + 30) / 2
    assert commit("stage1:0", 30) == "3 unit(s) left, ETA 2m00s"
    assert commit("stage1:1", 50) == "2 unit(s) left, ETA 1m33s"  # (60 + 30 + 50) / 3 twice
    assert commit("stage2:0", 20) == "1 unit(s) left, ETA 0m40s"  # eval: (60 + 30 + 50 + 20) / 4
    assert clock.estimate("stage2:1") == 20 and clock.estimate("rft:warm_start") == 540
    assert commit("eval", 25) == "schedule done"
    # Iterations say nothing about the warm start (its epochs run to a loss target) or init: no stand-in for them.
    assert clock.estimate("rft:warm_start") == 540
    clock.durations.pop("warm_start")
    assert clock.estimate("rft:warm_start") is None and clock.estimate("init") == 4
    clock.durations.pop("init")
    assert clock.estimate("init") is None


def _zero_advantage_metrics(groups: int, advantages: list[float]) -> dict:
    """An RL unit's metrics as dapo_iteration writes them, from the real dynamic sampling and train_metrics."""
    _, _, report = dynamic_sampling(
        list(advantages), [i // 2 for i in range(len(advantages))], torch.tensor(advantages)
    )
    assert report.groups_in == groups
    return {
        "reward": {"resolved_rate": 0.0},
        "episode": {"give_up_rate": 0.5},
        "dynamic_sampling": report.as_metrics(),
        "train": train_metrics([], "dapo"),  # the update ran no optimiser step: an empty batch
    }


def test_an_iteration_that_trained_nothing_says_why(monkeypatch):
    monkeypatch.setattr(console.time, "monotonic", lambda: 0.0)
    clock = UnitClock(["stage1:0", "stage1:1", "stage1:2"])
    assert clock.line("stage1:0", _zero_advantage_metrics(3, [0.0] * 6)) == (
        "run: stage1:0 committed in 0 s: resolved 0.00, gave up 0.50; trained nothing: every group had zero "
        "advantage (3 group(s), all rewards equal); 2 unit(s) left, ETA 0m00s"
    )
    mixed = _zero_advantage_metrics(2, [0.0, 0.0, 0.0, 0.0])
    mixed["dynamic_sampling"]["dropped_all_equal_groups"] = 1.0  # one group dropped, the other's kept none
    assert "; trained nothing: dynamic sampling kept no trajectory with a nonzero advantage; " in clock.line(
        "stage1:1", mixed
    )
    trained = {"train": {"dapo_loss": 0.1, "optimizer_steps": 2.0}, "dynamic_sampling": {"groups_in": 3.0}}
    assert "trained nothing" not in clock.line("stage1:2", trained)
    assert console.nothing_trained({"rft": {"kept": 0.0}, "train": {"optimizer_steps": 0.0}}) == (
        "trained nothing: no resolved trajectory to fine-tune on"
    )
    assert console.nothing_trained({"eval": {"pass@1": 0.0}}) is None  # trains nothing by design


WARN = textwrap.dedent(
    """
    import logging, sys, warnings
    from pathlib import Path
    from swe_megatron.monitor.console import library_warnings_to

    library_warnings_to(Path(sys.argv[1]))
    for _ in range(3):  # as megatron.core's layer specs do at import
        warnings.warn("Apex is not installed. Falling back to Torch Norm")
    logging.getLogger("megatron.core.models.gpt").warning("GPTModel is deprecated")
    logging.getLogger("megatron.core").error("a real error")
    logging.getLogger("swe_megatron.x").warning("ours stay on the console")
    """
)


def test_library_warnings_go_to_the_log_file(tmp_path):
    log = tmp_path / "logs" / "library-warnings.log"
    res = subprocess.run(
        [sys.executable, "-c", WARN, str(log)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert res.stderr.splitlines() == ["a real error", "ours stay on the console"]
    text = log.read_text()
    assert text.count("Apex is not installed") == 1 and "GPTModel is deprecated" in text  # once per place
