"""Issue 24's attacks that once turned a failure into an excluded sample, as regressions on a real factory task
(the first task of the first factory tasks file) and, for the episode-side ones, through the rollout manager.

Each grading attack is module-level code appended to the library module the task's gold patch edits, without
the fix (the attacks fire when tests fail: a failure made into an exclusion is the prize). Expected: scored,
unresolved, never excluded. ~45 s in all on a 2-core machine (about half of it control runs and sandboxes).
"""

# ruff: noqa: F811 (pytest fixtures imported from sibling test modules are parameters here)
from __future__ import annotations

import pytest
from test_infra_outcomes import _rollout, chat  # noqa: F401 - the chat fixture is used by the episode cases
from test_runner_tampering import attack_targets  # noqa: F401 - fixture: (task, module, base text, fixed text)
from tiny_task import diff

from swe_megatron.grading.grader import RESOLVED, UNRESOLVED, grade_one

pytestmark = pytest.mark.sandbox

_REC = "_swe_megatron' + '_grade_record"

GRADING_ATTACKS = {
    # 1: at exit, write `exit 90;` over the exit-status line of every harness file it can reach (bash was still
    # reading the eval script from one, and 90 meant "setup failed": excluded), the script's file is gone now
    # (`bash -c`), and a setup failure is decided before the patch is applied.
    "1_rewrites_the_eval_script": (
        "import atexit as _a, os as _o, glob as _g\n"
        "def _x():\n"
        "    for f in _g.glob('.git/swe_megatron_grade/*/*') + _g.glob('.git/swe_megatron_grade/*/*/*'):\n"
        "        try:\n"
        "            i = open(f, 'rb').read().find(b'echo $?')\n"
        "            if i >= 0:\n"
        "                fd = _o.open(f, _o.O_WRONLY)\n"
        "                _o.pwrite(fd, b'exit 90;', i)\n"
        "                _o.close(fd)\n"
        "        except OSError:\n"
        "            pass\n"
        "_a.register(_x)\n"
    ),
    # 2: the record's `tests` a list; then 200,000 nested arrays (json.loads -> RecursionError: a grader crash)
    "2_record_tests_is_a_list": (
        "import atexit as _a, os as _o, sys as _y\n"
        "def _x():\n"
        f"    m = _y.modules['{_REC}']\n"
        '    open(m._record_path, \'w\').write(\'{"finished": true, "exitstatus": 0, "tests": []}\')\n'
        "    _o._exit(0)\n"
        "_a.register(_x)\n"
    ),
    "2_record_nested_200k_deep": (
        "import atexit as _a, os as _o, sys as _y\n"
        "def _x():\n"
        f"    m = _y.modules['{_REC}']\n"
        "    open(m._record_path, 'w').write('[' * 200000 + ']' * 200000)\n"
        "    _o._exit(0)\n"
        "_a.register(_x)\n"
    ),
    # 3: lock the repository and kill every process of the sandbox (the restart once could not enter it)
    "3_chmod_000_and_kill_all": (
        "import atexit as _a, os as _o\n"
        "def _x():\n"
        "    _o.chmod('/testbed', 0)\n"
        "    _o.kill(-1, 9)\n"
        "_a.register(_x)\n"
    ),
    # 8: 20 MB of output at exit, with the name the eval script once cut the log through made a folder (the
    # host then read the whole log: 300 MB -> 1.24 GB of grader memory); the host reads only the tail now.
    "8_floods_the_log": (
        "import atexit as _a, os as _o, glob as _g\n"
        "def _x():\n"
        "    for d in _g.glob('.git/swe_megatron_grade/*/'):\n"
        "        _o.makedirs(d + 'test_output.tail', exist_ok=True)\n"
        "    for _ in range(20):\n"
        "        _o.write(1, b'x' * (1 << 20))\n"
        "_a.register(_x)\n"
    ),
}


def _with(target, code: str, fixed: bool = False) -> str:
    task, module, before, after = target
    return diff((module, before, (after if fixed else before) + "\n\n" + code))


@pytest.mark.parametrize("name", list(GRADING_ATTACKS))
def test_grading_attacks_are_scored_never_excluded(name, attack_targets, sandbox_factory, tmp_path):
    target = attack_targets[0]
    result = grade_one(
        target[0],
        _with(target, GRADING_ATTACKS[name]),
        sandbox_factory,
        log_dir=tmp_path,
        output_cap_bytes=1 << 16,
    )
    assert (result.status, result.excluded, result.reward) == (UNRESOLVED, "", 0.0), result.reason
    if name.startswith("2_"):
        assert "harness record is invalid" in result.tampered, result.tampered
    assert (tmp_path / "test_output.txt").stat().st_size < 2 << 16  # what the host read back was capped


def test_a_file_below_a_test_file_is_dropped_and_the_fix_still_counts(
    attack_targets, sandbox_factory, tmp_path
):
    """4: a patch adding `<test file>/keep.txt` made the restored test file fail to apply (excluded `task`)."""
    target = attack_targets[0]
    task = target[0]
    test_file = task.FAIL_TO_PASS[0].split("::")[0]
    blocker = diff((f"{test_file}/keep.txt", None, "x\n"))
    fixed = grade_one(task, task.patch + blocker, sandbox_factory, log_dir=tmp_path / "fix")
    assert fixed.status == RESOLVED and [d.reason for d in fixed.dropped] == ["task test file"], fixed.reason
    big = grade_one(task, task.patch + "+" * (1 << 20), sandbox_factory, log_dir=tmp_path / "big")
    assert (big.status, big.excluded) == (UNRESOLVED, ""), big.reason  # 5: over sandbox.grade_max_patch_bytes


@pytest.mark.parametrize(
    "commands",
    [
        # 3: as an agent command (the restart repairs the modes as root, so the episode goes on)
        ["chmod 000 /testbed; kill -9 -1", "cd /testbed && git status --short"],
        # 6: a hard link to the patch file (reading it raised PermissionError: harness_error, retried twice)
        ["touch .git/swe_megatron_patch.diff && ln .git/swe_megatron_patch.diff .git/keep"],
    ],
    ids=["3_chmod_000_and_kill_all", "6_hard_links_the_patch_file"],
)
def test_episode_attacks_are_graded_never_excluded(commands, tmp_path, chat, tiny):
    traj, stats, _ = _rollout(tmp_path, chat, tiny, commands)
    assert traj.infra_failure is None and stats.infra_failures == 0, traj.infra_failure
    assert traj.reward == 1.0 and traj.resolved  # the fix is in the workspace and is graded
