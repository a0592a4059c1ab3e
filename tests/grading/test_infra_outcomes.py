"""What the agent or its patch does is graded, never turned into an excluded infrastructure error.

An RL policy that could turn a failing attempt into an excluded trajectory (dropped instead of scored 0)
would learn to do so whenever it is failing. Each case here once ended as an infrastructure error:
a patch that stops the `timeout` the eval script waits on; non-UTF-8 bytes or a lone surrogate in the
patch text; an agent that removes or locks its repository's .git before submitting.
"""

from __future__ import annotations

import json

import pytest
from attacks import FIX
from tiny_task import INIT, diff

from swe_megatron.agent.tokens import ChatFormat
from swe_megatron.config.schema import RunConfig, SandboxConfig
from swe_megatron.engine.scripted import ScriptedPolicy, gold_patch_script
from swe_megatron.grading.grader import RESOLVED, UNRESOLVED, grade_one, patch_bytes
from swe_megatron.model.tokenizer import load_tokenizer
from swe_megatron.rollout.setup import Rollouts
from swe_megatron.tasks.load import load_tasks
from swe_megatron.trajectory import ExitReason, Trajectory

pytestmark = pytest.mark.sandbox

STOP_TIMEOUT = (
    "import os, signal\n\n"
    "p = os.getpid()\n"
    "while p > 1:\n"
    "    stat = open('/proc/%d/stat' % p).read()\n"
    "    if stat[stat.index('(') + 1 : stat.rindex(')')] == 'timeout':\n"
    "        os.kill(p, signal.SIGSTOP)\n"
    "        break\n"
    "    p = int(stat[stat.rindex(')') + 2 :].split()[1])\n"
)


def test_patch_that_stops_its_timeout_is_unresolved_not_excluded(tiny, sandbox_factory, tmp_path):
    """The fix plus SIGSTOP of `timeout`: the eval script never returns; the harness cannot see the tests
    finish, so it is the patch's outcome (0), not an excluded infrastructure error."""
    task = tiny
    patch = FIX + diff(("calc/__init__.py", INIT, STOP_TIMEOUT + INIT))
    result = grade_one(task, patch, sandbox_factory, log_dir=tmp_path, test_timeout_s=3, step_timeout_s=5)
    assert result.status == UNRESOLVED and result.reward == 0.0, (result.status, result.reason)
    assert "held past its test timeout" in result.reason


def test_patch_with_undecodable_text_is_graded(tiny, sandbox_factory, tmp_path):
    """A byte that is not UTF-8 (surrogate-escaped, as the ACI decodes diffs) and a lone surrogate."""
    task = tiny
    odd = "caf\udce9 and \ud800 in a note\n"
    assert patch_bytes(odd) == b"caf\xe9 and \xed\xa0\x80 in a note\n"
    result = grade_one(
        task,
        task.patch + diff(("notes.txt", None, odd)),
        sandbox_factory,
        log_dir=tmp_path / "fix",
    )
    assert result.status == RESOLVED, (result.status, result.reason)
    alone = grade_one(task, diff(("notes.txt", None, odd)), sandbox_factory, log_dir=tmp_path / "alone")
    assert alone.status == UNRESOLVED, (alone.status, alone.reason)


@pytest.fixture(scope="module")
def chat():
    return ChatFormat(load_tokenizer("qwen2.5"))


def _block(reason, command):
    return f"{reason}\n```\n{command}\n```"


def _rollout(tmp_path, chat, tiny, extra_commands):
    """One scripted episode through the real rollout manager, bwrap sandbox and grader: the gold fix,
    then `extra_commands`, then submit."""
    task = tiny
    folder = tmp_path / "tasks"
    folder.mkdir()
    (folder / "tasks.jsonl").write_text(json.dumps(task.__dict__) + "\n")
    tasks = load_tasks(folder / "tasks.jsonl")
    script = gold_patch_script(tasks[0].patch)
    script[-1:-1] = [_block("Now this.", c) for c in extra_commands]
    cfg = RunConfig(run_dir=str(tmp_path / "run"), sandbox=SandboxConfig(command_timeout_s=60))
    cfg.monitor.progress = False
    rollouts = Rollouts(cfg, ScriptedPolicy(chat, {tasks[0].instance_id: script}), chat=chat)
    (traj,), stats = rollouts.run(tasks, 1, rollouts.limits(cfg.stage1), tmp_path / "out")
    return traj, stats, tmp_path / "out" / "trajectories.jsonl"


@pytest.mark.parametrize(
    "breakage", ["rm -rf .git", "chmod 000 .git/objects", "chmod -R 000 .git", "echo junk > .git/HEAD"]
)
def test_agent_breaking_its_git_is_graded_against_the_pristine_repository(breakage, tmp_path, chat, tiny):
    traj, stats, _ = _rollout(tmp_path, chat, tiny, [breakage])
    assert traj.infra_failure is None and stats.infra_failures == 0, traj.infra_failure
    assert traj.exit_reason == ExitReason.submitted
    assert traj.reward == 1.0 and traj.resolved  # the fix is in the workspace: the tests really pass


def test_agent_writing_non_utf8_bytes_is_graded_and_recorded(tmp_path, chat, tiny):
    traj, stats, out = _rollout(tmp_path, chat, tiny, ["printf 'caf\\351\\n' > notes.txt"])
    assert traj.infra_failure is None and traj.reward == 1.0, (traj.infra_failure, traj.reward)
    assert "+caf\udce9" in traj.patch
    (back,) = [Trajectory.from_json(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert back.patch == traj.patch  # the JSONL keeps the exact bytes (as JSON escapes)


def test_tampering_is_counted_per_iteration(tmp_path, chat, tiny):
    """A run the canaries catch reaches the trajectory and the iteration's grading/* scalars."""
    from swe_megatron.pipeline.metrics import rollout_metrics

    noop = "echo \"import sys; sys.modules['_pytest.python'].Function.runtest = lambda self: None\" >> calc/__init__.py"
    traj, _, _ = _rollout(tmp_path, chat, tiny, [noop])
    assert traj.infra_failure is None and traj.reward == 0.0 and not traj.resolved
    assert traj.grading_flags == ["suspicious", "tampered"]
    metrics = rollout_metrics([traj, Trajectory(task_id="other", sample_index=0)], t_max=8, l_thr=4)
    assert metrics["grading"] == {"suspicious": 1.0, "tampered": 1.0, "harness_fault": 0.0}


FORGE = (
    r"printf 'diff --git a/x.py b/x.py\nnew file mode 100999\n--- /dev/null\n+++ b/x.py\n@@ -0,0 +1 @@\n+a\n'"
)
PATCH_FILE = ".git/swe_megatron_patch.diff"  # where the ACI's in-sandbox `git diff` once wrote its output


@pytest.mark.parametrize(
    "subversion",
    [
        f"git() {{ {FORGE}; }}; export -f git",
        f'shopt -s expand_aliases; alias git="{FORGE} #"',
        f'mkdir -p /tmp/bin && echo "{FORGE}" > /tmp/bin/git && chmod +x /tmp/bin/git && export PATH=/tmp/bin:$PATH',
        f'echo "{FORGE}" > /tmp/d.sh && chmod +x /tmp/d.sh && git config diff.external /tmp/d.sh'
        " && git config core.pager /tmp/d.sh && export GIT_EXTERNAL_DIFF=/tmp/d.sh GIT_CONFIG_GLOBAL=/tmp/d.sh",
        f"eval() {{ {FORGE} > {PATCH_FILE}; }}",
        f'echo "{FORGE} > {PATCH_FILE}" > /tmp/w.sh && '
        "(setsid nohup bash -c 'while :; do bash /tmp/w.sh 2>/dev/null; done' >/dev/null 2>&1 &)",
    ],
    ids=["function", "alias", "path", "git-config", "eval", "background"],
)
def test_the_patch_is_the_workspace_diff_whatever_the_agent_does_to_its_shell(
    subversion, tmp_path, chat, tiny
):
    """Issue 40 family 2: the agent's shell keeps functions, aliases, PATH, git config and processes, so a diff
    it runs prints what the agent chose (here a header `new file mode 100999`, once a harness crash and an
    excluded episode). The harness's patch is the workspace's true diff: the fix, graded 1."""
    traj, stats, _ = _rollout(tmp_path, chat, tiny, [subversion])
    assert traj.infra_failure is None and stats.infra_failures == 0, traj.infra_failure
    assert traj.exit_reason == ExitReason.submitted and "100999" not in traj.patch
    assert "+        return hi" in traj.patch and traj.reward == 1.0 and traj.resolved


@pytest.mark.parametrize("where", ["grade_one", "grader"])
def test_a_harness_crash_on_the_patch_is_scored_and_counted_not_excluded(
    where, tmp_path, chat, tiny, monkeypatch
):
    """A harness bug while grading what the agent produced (injected here: no real input reaches one any more)
    is scored 0, flagged harness_fault and counted in the iteration's grading/harness_fault, never excluded."""
    from swe_megatron.grading import grader
    from swe_megatron.pipeline.metrics import rollout_metrics
    from swe_megatron.rollout import setup

    def crash(*args, **kwargs):
        raise RuntimeError("a harness bug on this patch")

    if where == "grade_one":  # inside grade_one: its own net scores it
        monkeypatch.setattr(grader, "sanitize_patch", crash)
    else:  # the grader raising past grade_one: the rollout scores it
        monkeypatch.setattr(setup, "grade_one", crash)
    traj, stats, _ = _rollout(tmp_path, chat, tiny, [])
    assert traj.infra_failure is None and not traj.exit_reason.is_infra and stats.infra_failures == 0
    assert traj.reward == 0.0 and not traj.resolved and traj.grading_flags == ["harness_fault"]
    metrics = rollout_metrics([traj], t_max=8, l_thr=4)
    assert metrics["grading"]["harness_fault"] == 1.0 and metrics["infra"]["failures"] == 0.0
