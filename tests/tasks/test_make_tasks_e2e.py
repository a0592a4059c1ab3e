"""End to end: `swe-megatron make-tasks` on one real library from PyPI, checked on the host.

Checks each task's repository (one commit = base_commit, hidden tests absent, test_patch restores them),
runs its test command with its environment (F2P fail before the gold patch, F2P and P2P pass after), that
statements name no hidden test or test file, that a rerun is served from the cache, and that the same seed
gives the same tasks. Grading inside sandboxes is tests/grading's business. Needs PyPI (pip download).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from swe_megatron.cli import main
from swe_megatron.tasks.factory.repo import git
from swe_megatron.tasks.load import load_tasks

pytestmark = pytest.mark.e2e

PACKAGE = "toolz==1.1.0"
N_TASKS = 2


def make(out: Path, seed: int = 0) -> int:
    return main(
        [
            "make-tasks",
            "--out",
            str(out),
            "--package",
            PACKAGE,
            "--max-tasks",
            str(N_TASKS),
            "--seed",
            str(seed),
        ]
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("made") / "tasks"
    start = time.monotonic()
    rc = make(out)
    if rc != 0 and not (out / "report.json").exists():
        pytest.skip("make-tasks could not fetch from PyPI here")
    assert rc == 0
    return out, time.monotonic() - start


def parse_rA(log: str) -> dict[str, str]:
    """Test id -> status from pytest -rA summary lines (as swebench's parse_log_pytest reads them)."""
    status = {}
    for line in log.splitlines():
        m = re.match(r"^(PASSED|FAILED|ERROR|XFAIL|SKIPPED) (\S+)", line)
        if m:
            status[m.group(2)] = m.group(1)
    return status


def run_test_cmd(repo: Path, env_dir: Path, test_cmd: str) -> dict[str, str]:
    env = {"PATH": f"{env_dir}/bin:/usr/bin:/bin", "HOME": str(repo), "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run(
        ["bash", "-c", test_cmd], cwd=repo, env=env, capture_output=True, text=True, timeout=300
    )
    return parse_rA(proc.stdout + proc.stderr)


def test_tasks_are_real_and_self_consistent(built, tmp_path):
    out, _ = built
    tasks = load_tasks(out / "train.jsonl")
    assert len(tasks) == N_TASKS and load_tasks(out / "test.jsonl") == []
    assert len({t.instance_id for t in tasks}) == N_TASKS
    lines = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    rows = [line["extra"] for line in lines]
    for task, row, line in zip(tasks, rows, lines, strict=True):
        extra = task.extra
        # SWE-bench 5.x's grading columns, top-level as SWE-bench publishes them; the host paths under extra
        assert (line["log_parser"], line["eval_type"]) == ("parse_log_pytest", "pass_and_fail")
        assert ">>>>> Start Test Output" in line["eval_script"] and "test_cmd" not in row
        assert set(row) >= {"repo_dir", "env_dir", "library", "mutation"}
        plan = task.plan
        assert plan is not None and plan.env_setup == plan.activate == () and plan.image == ""
        extra = {**extra, "test_cmd": plan.test_cmd, "test_files": list(plan.test_files)}
        # The file holds paths relative to its folder (the task set moves as one); the loader resolves them.
        assert not Path(row["repo_dir"]).is_absolute() and not Path(row["env_dir"]).is_absolute()
        repo, env_dir = Path(extra["repo_dir"]), Path(extra["env_dir"])
        assert (repo, env_dir) == ((out / row["repo_dir"]).resolve(), (out / row["env_dir"]).resolve())
        assert (env_dir / "bin" / "python").resolve() == Path("/usr/bin/python3.11").resolve()
        # One commit, the buggy state, clean; the hidden test files are not in it.
        assert git(repo, "rev-list", "--all").split() == [task.base_commit]
        assert git(repo, "status", "--porcelain", "--untracked-files=all") == ""
        assert task.FAIL_TO_PASS and set(extra["test_files"]) >= {t.split("::")[0] for t in task.FAIL_TO_PASS}
        for f in extra["test_files"]:
            assert not (repo / f).exists()
            assert f not in git(repo, "ls-files")
        # Work on a copy: the task's repo must stay as built.
        work = tmp_path / task.instance_id
        shutil.copytree(repo, work, symlinks=True)
        (work / "test.diff").write_text(task.test_patch)
        (work / "gold.diff").write_text(task.patch)
        subprocess.run(["git", "apply", "test.diff"], cwd=work, check=True)
        assert all((work / f).is_file() for f in extra["test_files"])
        before = run_test_cmd(work, env_dir, extra["test_cmd"])
        assert all(before.get(t) in ("FAILED", "ERROR") for t in task.FAIL_TO_PASS), before
        assert all(before.get(t) == "PASSED" for t in task.PASS_TO_PASS)
        subprocess.run(["git", "apply", "gold.diff"], cwd=work, check=True)
        after = run_test_cmd(work, env_dir, extra["test_cmd"])
        assert all(after.get(t) == "PASSED" for t in [*task.FAIL_TO_PASS, *task.PASS_TO_PASS]), after
        # The statement reads like a bug report and gives nothing of the hidden tests away.
        text = task.problem_statement
        assert extra["api"] in text and len(text) > 80
        for test_id in [*task.FAIL_TO_PASS, *task.PASS_TO_PASS]:
            for part in test_id.split("::"):
                assert part.split("[")[0] not in text, (part, text)
        for f in extra["test_files"]:
            assert os.path.basename(f) not in text
        assert "diff --git" not in text and extra["mutation"]["file"] not in text


@pytest.mark.parametrize(
    "preset", sorted(p.stem for p in (Path(__file__).parents[2] / "configs").glob("*.yaml"))
)
def test_the_built_tasks_gold_scripts_fit_every_stage_of_every_preset(built, preset, capsys):
    from gold_fit import gold_problems

    from swe_megatron.tasks.load import load_tasks_for_command

    out, _ = built
    problems = gold_problems(preset, load_tasks_for_command(str(out / "train.jsonl")))
    assert not problems, "\n".join(f"{k}: {v}" for k, v in problems.items())
    assert capsys.readouterr().err == ""  # the rollout names no task it cannot resolve


def test_rerun_is_cached_and_same_seed_gives_same_tasks(built, tmp_path):
    out, first_s = built
    before = (out / "train.jsonl").read_bytes()
    start = time.monotonic()
    assert make(out) == 0
    assert time.monotonic() - start < 5 and (out / "train.jsonl").read_bytes() == before
    # A second folder with the same seed (downloads and environments copied over to save time).
    again = tmp_path / "again"
    again.mkdir()
    for folder in ("sdists", "envs"):
        shutil.copytree(out / folder, again / folder, symlinks=True)
    assert make(again) == 0
    assert (again / "train.jsonl").read_bytes() == before
