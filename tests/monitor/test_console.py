"""What a run prints (issue 27 item 2): one line per committed unit; library warnings in a file, not the console."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from swe_megatron.monitor import console
from swe_megatron.monitor.console import UnitClock

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
        "run: rft:warm_start committed in 30 s: resolved 0.50, loss 0.0312; 4 unit(s) left, ETA 2m00s"
    )
    rft = {"reward": {"resolved_rate": 0.5}, "episode": {"give_up_rate": 0.25},
           "train": {"sft_loss": 0.01234, "optimizer_steps": 2.0}}  # fmt: skip
    assert clock.line("rft:0", rft) == (
        "run: rft:0 committed in 0 s: resolved 0.50, gave up 0.25, loss 0.01234; 3 unit(s) left, ETA 0m45s"
    )
    now[0] += 90
    dapo = {"reward": {"resolved_rate": 1.0}, "episode": {"give_up_rate": 0.0}, "train": {"dapo_loss": -0.5}}
    assert clock.line("stage1:0", dapo) == (
        "run: stage1:0 committed in 90 s: resolved 1.00, gave up 0.00, loss -0.5; 2 unit(s) left, ETA 1m20s"
    )
    now[0] += 3600
    clock.line("stage1:1")
    assert clock.line("eval", {}).endswith("; schedule done")


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
