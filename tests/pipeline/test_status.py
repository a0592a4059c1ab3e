"""`swe-megatron status RUN_DIR` (issue 42 item 5) on a run folder written by the run's own RunDir: the units done and
left, the last unit's key figures, and whether a live driver holds the folder (a real process holding its lock)."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
from pathlib import Path

from swe_megatron.atomic_write import write_json_atomic
from swe_megatron.cli import main
from swe_megatron.config.load import load_config
from swe_megatron.pipeline.run_dir import RunDir

ROOT = Path(__file__).resolve().parents[2]
OVERRIDES = ["schedule=[rft,stage1,eval]", "rft.iterations=1", "stage1.iterations=2"]


def _run_folder(root: Path) -> None:
    """init, rft:warm_start, rft:0, stage1:0 committed with the metrics the stages write; stage1:1 and eval left."""
    run = RunDir(root)
    run.bind_config(load_config("embedded", [f"run_dir={root}", *OVERRIDES]))
    metrics = {
        "rft:warm_start": {
            "warm_start": {"resolved_rate": 1.0, "final_loss": 0.13},
            "train": {"sft_loss": 0.93},
        },
        "rft:0": {"reward": {"resolved_rate": 0.5}, "train": {"sft_loss": 0.2}},
        "stage1:0": {"reward": {"resolved_rate": 0.25}, "train": {"dapo_loss": -0.0123}},
    }
    for unit in ["init", *metrics]:
        if unit in metrics:
            write_json_atomic(run.unit_dir(unit) / "metrics.json", metrics[unit])
        run.commit(unit, train_step=unit != "init")


def test_status_of_a_run_no_driver_holds(tmp_path, capsys):
    _run_folder(tmp_path)
    assert main(["status", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"run_dir: {tmp_path} (config embedded, model tiny-qwen2)",
        "units: 4 of 6 done; left: stage1:1, eval",
        "last: stage1:0  resolved 0.250  loss -0.0123 (dapo)",
        f"driver: none holds the folder; rerun its `swe-megatron run ... run_dir={tmp_path}` to resume",
    ]


def test_status_names_the_live_driver_holding_the_folder(tmp_path, capsys):
    _run_folder(tmp_path)
    script = textwrap.dedent("""
        import sys, time
        from swe_megatron.pipeline.run_lock import RunLock
        RunLock.take(sys.argv[1])
        print("locked", flush=True)
        time.sleep(600)
    """)
    driver = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert driver.stdout.readline() == "locked\n"
        assert main(["status", str(tmp_path)]) == 0
        last = capsys.readouterr().out.splitlines()[-1]
        assert last.startswith(f"driver: live, pid {driver.pid} on host {socket.gethostname()} since ")
        assert last.endswith(f"(stop: Ctrl-C in its terminal or kill -INT {driver.pid})")
    finally:
        driver.kill()
        driver.wait()


def test_a_warm_start_shows_its_last_steps_loss_and_a_folder_that_is_no_run_is_one_line(tmp_path, capsys):
    from swe_megatron.pipeline.status import key_figures

    assert key_figures(
        {"warm_start": {"resolved_rate": 1.0, "final_loss": 0.13}, "train": {"sft_loss": 0.93}}
    ) == ("resolved 1.000  loss 0.13 (last warm-start step)")
    assert key_figures({}) == ""
    (tmp_path / "notes.txt").write_text("x")
    assert main(["status", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"swe-megatron status: error: {tmp_path} is not a run folder (no state.json or config.yaml); give a run's "
        "run_dir\n"
    )
    assert main(["status", str(tmp_path / "missing")]) == 2
    assert "is not a folder" in capsys.readouterr().err
