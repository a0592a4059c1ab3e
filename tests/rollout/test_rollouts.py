"""The rollout manager: concurrency, retries of infrastructure failures, JSONL, show-trajectory; and the scripted
gold-patch policy reaching reward 1 through the real bwrap sandbox and the real grader."""

import json
import shutil

import pytest
from fake_sandbox import DirSandbox
from tiny_repo import make_task

from swe_megatron.agent.episode import EpisodeLimits
from swe_megatron.agent.prompts import load_prompts
from swe_megatron.agent.tokens import ChatFormat
from swe_megatron.cli import main
from swe_megatron.config.schema import AgentConfig, SandboxConfig
from swe_megatron.engine.scripted import ScriptedPolicy, gold_patch_script
from swe_megatron.model.tokenizer import load_tokenizer
from swe_megatron.rollout.command import render_trajectory
from swe_megatron.rollout.rollouts import GradeOutcome, RolloutSetup, run_rollouts
from swe_megatron.trajectory import ExitReason, Trajectory

LIMITS = EpisodeLimits(
    t_max=8, context_length=8192, max_tokens_per_turn=256, command_timeout_s=10, output_cap=4000
)


@pytest.fixture(scope="module")
def chat():
    return ChatFormat(load_tokenizer("qwen2.5"))


def patch_grader(task, patch):
    """Labelled fake grader for the manager's unit test: resolved iff the patch makes the gold change."""
    return GradeOutcome(float("+    return 2" in patch), "+    return 2" in patch, None, 0.0)


def test_concurrent_rollouts_retry_infra_failures_and_write_jsonl(tmp_path, chat):
    tasks = [make_task(tmp_path, f"t{i}") for i in range(2)]
    made = []

    def make_sandbox(task):
        sb = DirSandbox(task.extra["repo_dir"])
        if len(made) == 1:  # the second sandbox ever made crashes on its first command
            sb.fail_next = True
        made.append(sb)
        return sb

    scripts = {
        tasks[0].instance_id: gold_patch_script(tasks[0].patch),
        tasks[1].instance_id: ["no block", "```\nsubmit\n```"],
    }
    setup = RolloutSetup(
        ScriptedPolicy(chat, scripts),
        make_sandbox,
        patch_grader,
        chat,
        load_prompts(AgentConfig().prompts),
        AgentConfig(concurrency=2, infra_retries=1),
        LIMITS,
    )
    out = tmp_path / "traj.jsonl"
    trajs, stats = run_rollouts(tasks, 2, setup, out, progress=False)
    assert [(t.task_id, t.sample_index) for t in trajs] == [("t0", 0), ("t0", 1), ("t1", 0), ("t1", 1)]
    assert [t.reward for t in trajs] == [1.0, 1.0, 0.0, 0.0]
    assert all(t.exit_reason == ExitReason.submitted and not t.excluded for t in trajs)
    assert (
        stats.retries == 1
        and stats.infra_failures == 0
        and stats.resolved == 2
        and stats.malformed_turns == 2
    )
    assert len(made) == 5
    s = stats.summary()
    assert s["episodes"] == 4 and s["seconds"]["grade"] >= 0 and s["seconds"]["generate"] > 0
    rows = [Trajectory.from_json(line) for line in out.read_text().splitlines()]
    assert sorted((r.task_id, r.sample_index) for r in rows) == [("t0", 0), ("t0", 1), ("t1", 0), ("t1", 1)]
    text = render_trajectory(trajs[2])
    assert "[turn 0, MALFORMED]" in text and "exit=submitted" in text
    assert main(["show-trajectory", str(out), "--index", "0"]) == 0


def test_persistent_infra_failure_is_excluded_not_scored(tmp_path, chat):
    task = make_task(tmp_path, "t0")

    def broken(task):
        sb = DirSandbox(task.extra["repo_dir"])
        sb.fail_next = True
        return sb

    setup = RolloutSetup(
        ScriptedPolicy(chat, {}),
        broken,
        patch_grader,
        chat,
        load_prompts(AgentConfig().prompts),
        AgentConfig(concurrency=1, infra_retries=2),
        LIMITS,
    )
    (traj,), stats = run_rollouts([task], 1, setup, progress=False)
    assert (
        traj.exit_reason == ExitReason.sandbox_error
        and traj.excluded
        and "fake sandbox crashed" in traj.infra_failure
    )
    assert stats.infra_failures == 1 and stats.retries == 2


def _bwrap_ready():
    if not shutil.which("bwrap"):
        return "bwrap is not installed"
    try:
        from swe_megatron.grading.grader import grade_one  # noqa: F401
        from swe_megatron.sandbox.bwrap import BwrapSandbox  # noqa: F401
    except ImportError as e:
        return f"sandbox/grading backend not importable: {e}"
    return None


@pytest.mark.sandbox
@pytest.mark.skipif(_bwrap_ready() is not None, reason=str(_bwrap_ready()))
def test_gold_policy_reaches_reward_one_through_real_sandbox_and_grader(tmp_path, chat):
    import tiny_task

    from swe_megatron.config.schema import RunConfig
    from swe_megatron.rollout.setup import load_tasks, make_setup

    folder = tmp_path / "tasks"
    folder.mkdir()
    task = tiny_task.build_task(folder, tiny_task.build_env())
    tasks_file = folder / "tasks.jsonl"
    tasks_file.write_text(json.dumps(task.__dict__) + "\n")
    tasks = load_tasks(tasks_file)
    cfg = RunConfig(run_dir=str(tmp_path / "run"), sandbox=SandboxConfig(command_timeout_s=60))
    cfg.agent.concurrency = 2
    engine = ScriptedPolicy(chat, {tasks[0].instance_id: gold_patch_script(tasks[0].patch)})
    setup = make_setup(cfg, cfg.stage1, engine)
    trajs, stats = run_rollouts(tasks, 2, setup, tmp_path / "t.jsonl", progress=False)
    for t in trajs:
        assert t.infra_failure is None, t.infra_failure
        assert t.exit_reason == ExitReason.submitted and t.reward == 1.0 and t.resolved and not t.drifted
        assert t.messages[3]["content"].startswith("[File: /testbed/calc/ops.py")
    assert stats.resolved == 2


@pytest.mark.sandbox
@pytest.mark.skipif(_bwrap_ready() is not None, reason=str(_bwrap_ready()))
def test_rollout_command_with_gold_policy(tmp_path, capsys):
    import tiny_task

    folder = tmp_path / "tasks"
    folder.mkdir()
    task = tiny_task.build_task(folder, tiny_task.build_env())
    (folder / "tasks.jsonl").write_text(json.dumps(task.__dict__) + "\n")
    out = tmp_path / "out"
    rc = main(
        [
            "rollout",
            "embedded",
            f"run_dir={tmp_path / 'run'}",
            "--tasks",
            str(folder / "tasks.jsonl"),
            "--out",
            str(out),
            "--samples",
            "2",
            "--policy",
            "gold",
        ]
    )
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] == 2 and summary["resolved"] == 2 and summary["infra_failures"] == 0
    assert main(["show-trajectory", str(out / "trajectories.jsonl"), "--index", "-1"]) == 0
    assert "exit=submitted  reward=1" in capsys.readouterr().out
