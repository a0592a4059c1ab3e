"""Interrupts and bad input end in one line, before any work starts and writing nothing (issue 27 item 3)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from rows import MINIMAL_ROW

from swe_megatron.cli import main
from swe_megatron.pipeline.run_dir import committed_note

ROOT = Path(__file__).resolve().parents[1]
ROW = MINIMAL_ROW


def _error(capsys, argv: list[str]) -> str:
    """The one stderr line of a command that must refuse (exit 2)."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"swe-megatron {argv[0]}: error: "), err
    return err


@pytest.fixture
def tasks_file(tmp_path) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(ROW) + "\n")
    return path


def test_rollout_refuses_bad_numbers_and_outputs(tmp_path, tasks_file, capsys):
    # a row that grades (a test command): rows that cannot are refused at load, before --out is looked at
    tasks_file.write_text(json.dumps({**ROW, "repo_dir": str(tmp_path), "test_cmd": "pytest"}) + "\n")
    base = ["rollout", "embedded", "--tasks", str(tasks_file), "--policy", "gold"]
    out = tmp_path / "out"
    assert "--samples -1 is invalid" in _error(capsys, [*base, "--out", str(out), "--samples", "-1"])
    assert "--max-tasks 0 is invalid" in _error(capsys, [*base, "--out", str(out), "--max-tasks", "0"])
    assert not out.exists()
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert f"--out {afile} is a file" in _error(capsys, [*base, "--out", str(afile)])
    out.mkdir()
    (out / "trajectories.jsonl").write_text("{}\n")  # an earlier (interrupted) rollout's
    assert "already holds files" in _error(capsys, [*base, "--out", str(out)])
    assert (out / "trajectories.jsonl").read_text() == "{}\n"  # not overwritten


def test_tasks_files_are_checked_at_load(tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    base = ["rollout", "embedded", "--out", str(tmp_path / "o"), "--policy", "gold", "--tasks"]
    assert f"tasks file {empty} holds no task" in _error(capsys, [*base, str(empty)])
    moved = tmp_path / "moved.jsonl"
    moved.write_text(json.dumps({**ROW, "repo_dir": "repos/lib__x-1", "env_dir": "envs/x"}) + "\n")
    err = _error(capsys, [*base, str(moved)])
    assert "2 local folder(s) are missing, e.g. lib__x-1's repo_dir" in err
    assert f"is a folder; give a tasks file in it (e.g. {tmp_path / 'train.jsonl'})" in _error(
        capsys, [*base, str(tmp_path)]
    )
    assert not (tmp_path / "o").exists()


def test_show_trajectory_on_a_predictions_file(tmp_path, capsys):
    preds = tmp_path / "predictions.jsonl"
    preds.write_text(json.dumps({"instance_id": "x", "model_name_or_path": "m", "model_patch": ""}) + "\n")
    err = _error(capsys, ["show-trajectory", str(preds)])
    assert f"{preds} line 1 is not a trajectory" in err and "not a predictions or tasks file" in err


def test_plan_refuses_bad_numbers(capsys):
    err = _error(capsys, ["plan", "--model", "embedded", "--context", "-1", "--gpus", "0"])
    assert "--context -1 (allowed: > 0); --gpus 0 (allowed: > 0)" in err


def test_make_tasks_out_is_a_file(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("")
    assert "is a file" in _error(capsys, ["make-tasks", "--out", str(afile), "--package", "toolz==1.0.0"])


def test_make_tasks_refuses_to_rebuild_another_task_set_silently(tmp_path, capsys, monkeypatch):
    """Issue 42: `make-tasks --out data/tasks` with other settings rebuilt the pipeline's cache without a word."""
    from swe_megatron.tasks import command

    out = tmp_path / "tasks"
    out.mkdir()
    report = {"cache_key": "other", "max_tasks": 24, "seed": 0, "tasks": {"train": 18, "test": 6}}
    (out / "report.json").write_text(json.dumps(report))
    built = []
    monkeypatch.setattr(command, "make_tasks", lambda cfg, log: built.append(cfg) or {"libraries": [], "tasks": {"train": 1, "test": 0}})
    err = _error(capsys, ["make-tasks", "--out", str(out), "--package", "toolz==1.0.0"])
    assert "holds 24 tasks built with other settings (max_tasks 24, seed 0" in err and "--replace" in err
    assert not built
    assert main(["make-tasks", "--out", str(out), "--package", "toolz==1.0.0", "--replace"]) == 0 and built
    # the same settings (the cache) are not refused: make_tasks returns the cached set
    report["cache_key"] = built[0].cache_key()
    (out / "report.json").write_text(json.dumps(report))
    assert main(["make-tasks", "--out", str(out), "--package", "toolz==1.0.0"]) == 0 and len(built) == 2


def test_grade_checks_the_sandbox_tools_and_out_first(tmp_path, tasks_file, capsys, monkeypatch):
    repo = tmp_path / "repo"
    repo.mkdir()
    tasks_file.write_text(json.dumps({**ROW, "repo_dir": str(repo), "test_cmd": "pytest"}) + "\n")
    preds = tmp_path / "p.jsonl"
    preds.write_text(
        json.dumps({"instance_id": ROW["instance_id"], "model_name_or_path": "m", "model_patch": ""}) + "\n"
    )
    base = ["grade", "--tasks", str(tasks_file), "--predictions", str(preds)]
    assert "give a report file path" in _error(capsys, [*base, "--out", str(tmp_path)])
    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))
    err = _error(capsys, [*base, "--sandbox", "apptainer"])
    assert "sandbox backend apptainer: apptainer is not installed" in err
    assert not (tmp_path / "p.report.json").exists() and not (tmp_path / "p.report.logs").exists()


def test_launch_without_slurm_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))
    run_dir = tmp_path / "run"
    err = _error(capsys, ["launch", "embedded", "--cluster", "slurm", f"run_dir={run_dir}"])
    assert "no Slurm here (sbatch is not on PATH)" in err and not run_dir.exists()


def test_an_engine_failure_that_ends_a_run_is_one_line_and_exit_1(monkeypatch, capsys):
    """A failed weight sync (every rank raises it; the unit is not committed) ends the command with its message,
    not a traceback; exit 1, as an uncaught exception's."""
    import argparse

    from swe_megatron import cli
    from swe_megatron.engine.base import EngineError

    def fails(args):
        raise EngineError("weight sync by broadcast failed (...; rerun to resume): http://h:8100: gone")

    monkeypatch.setattr(cli, "parse_args", lambda argv: argparse.Namespace(command="run", func=fails))
    assert main(["run"]) == 1
    err = capsys.readouterr().err
    assert (
        err
        == "swe-megatron run: error: weight sync by broadcast failed (...; rerun to resume): http://h:8100: gone\n"
    )


def test_the_committed_note(tmp_path):
    assert "committed: nothing yet" in committed_note(tmp_path / "new")
    (tmp_path / "state.json").write_text(
        json.dumps({"format": 1, "done": ["init", "rft:warm_start"], "checkpoint": None, "step": 0})
    )
    assert committed_note(tmp_path) == (
        f"committed: 2 unit(s), the last rft:warm_start ({tmp_path}); rerun the same command to resume"
    )


NAP = textwrap.dedent(
    """
    import logging, sys, threading, time
    from swe_megatron import cli

    def register(sub):
        sub.add_parser("nap").set_defaults(func=nap)

    def nap(args):
        args.kept = lambda: "committed: 2 unit(s); rerun the same command to resume"
        print("ready", flush=True)
        try:
            time.sleep(60)
        finally:  # work cut short warns while it stops (as 26 prefetched sandboxes did)
            def noisy():
                for _ in range(30):
                    logging.getLogger("swe_megatron.sandbox.prewarm").warning("a prefetched sandbox did not start")
            threads = [threading.Thread(target=noisy) for _ in range(3)]
            [t.start() for t in threads]
            [t.join() for t in threads]

    cli.COMMANDS.append("__main__")
    sys.exit(cli.main(["nap"]))
    """
)


@pytest.mark.parametrize(("sig", "rc"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupt_is_one_line(tmp_path, sig, rc):
    script = tmp_path / "nap.py"
    script.write_text(NAP)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout.readline() == "ready\n"
    time.sleep(0.2)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == rc
    assert err == "swe-megatron nap: interrupted; committed: 2 unit(s); rerun the same command to resume\n"


def test_show_trajectory_into_a_closed_pipe_exits_quietly(tmp_path):
    """`show-trajectory FILE | head -3` (issue 42 item 3): the reader is gone before the output is written; no
    BrokenPipeError traceback, no "Exception ignored" at exit; exit 141 as a process killed by SIGPIPE."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("algo_conftest", ROOT / "tests" / "algo" / "conftest.py")
    algo_conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(algo_conftest)  # its build_trajectory: a consistent trajectory
    traj = tmp_path / "trajectories.jsonl"
    traj.write_text(algo_conftest.build_trajectory(turns=3).to_json() + "\n")
    proc = subprocess.Popen([sys.executable, "-m", "swe_megatron.cli", "show-trajectory", str(traj)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    proc.stdout.close()  # as `head` does once it has its lines: the command writes after this
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 128 + signal.SIGPIPE and err == "", err


@pytest.mark.e2e  # starts torch.distributed and Megatron-Core's groups (~20 s on 2 cores)
def test_recompute_on_cpu_is_one_line(tmp_path):
    """parallel.recompute=full on a machine without CUDA (issue 42 item 3): the message cpu_compat gives, as the
    CLI's one line, not a traceback."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-m", "swe_megatron.cli", "run", "embedded", "parallel.recompute=full",
                          f"run_dir={tmp_path / 'run'}"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("swe-megatron run: error: parallel.recompute=full needs CUDA"), out.stderr
    assert out.stderr.count("\n") == 1, out.stderr


def test_python_m_outside_the_venv_is_one_line_naming_the_venv(tmp_path):
    """A fresh shell's `python -m swe_megatron` (issue 42 item 5) died with a ModuleNotFoundError traceback."""
    base = getattr(sys, "_base_executable", sys.executable)
    probe = subprocess.run([base, "-s", "-E", "-c", "import omegaconf"], capture_output=True, cwd=tmp_path)
    if probe.returncode == 0:
        pytest.skip(f"{base} has the project's packages installed outside the venv")
    out = subprocess.run([base, "-s", "-E", "-m", "swe_megatron", "--version"], capture_output=True, text=True,
                         cwd=ROOT)  # fmt: skip
    assert out.returncode == 1 and out.stderr.count("\n") == 1, out.stderr
    assert "lacks omegaconf" in out.stderr and ".venv/bin/python -m swe_megatron" in out.stderr, out.stderr
