"""The rollout manager: concurrency, retries of infrastructure failures, JSONL, show-trajectory; and the scripted
gold-patch policy reaching reward 1 through the real bwrap sandbox and the real grader."""

import json
import os
import shutil
import threading
import time

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
    assert s["episodes"] == 4 and s["seconds"]["generate"] > 0
    # every episode was graded once, and the summary is the sum of the episodes' grading times
    assert all(t.timings["grade"] > 0 for t in trajs)
    assert s["seconds"]["grade"] == pytest.approx(sum(t.timings["grade"] for t in trajs), abs=2e-3)
    # The failed attempt's time is the retried sample's "retried" (what the fault cost), no one else's.
    assert [bool(t.timings.get("retried")) for t in trajs].count(True) == 1 and s["seconds"]["retried"] > 0
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
    from swe_megatron.rollout.setup import Rollouts
    from swe_megatron.tasks.load import load_tasks

    folder = tmp_path / "tasks"
    folder.mkdir()
    task = tiny_task.build_task(folder, tiny_task.build_env())
    tasks_file = folder / "tasks.jsonl"
    tasks_file.write_text(json.dumps(task.__dict__) + "\n")
    tasks = load_tasks(tasks_file)
    cfg = RunConfig(run_dir=str(tmp_path / "run"), sandbox=SandboxConfig(command_timeout_s=60))
    cfg.agent.concurrency = 2
    cfg.agent.provenance_workers = 1  # the provenance checks in a process of their own (agent/tokens.py)
    cfg.monitor.progress = False
    engine = ScriptedPolicy(chat, {tasks[0].instance_id: gold_patch_script(tasks[0].patch)})
    rollouts = Rollouts(cfg, engine, chat=chat)
    pool, checked = rollouts.provenance, []
    rollouts.provenance = lambda *a: checked.append(pool(*a)) or checked[-1]
    trajs, stats = rollouts.run(tasks, 2, rollouts.limits(cfg.stage1), tmp_path / "out")
    pool.close()
    assert len(checked) == 2 and not any(r.drifted for r in checked)  # each episode's, in the pool
    for t in trajs:
        assert t.infra_failure is None, t.infra_failure
        assert t.exit_reason == ExitReason.submitted and t.reward == 1.0 and t.resolved and not t.drifted
        assert t.messages[3]["content"].startswith("[File: /testbed/calc/ops.py")
    assert stats.resolved == 2
    assert stats.prewarm["hits"] == 2 and stats.prewarm["failed_starts"] == 0  # graded in prewarmed sandboxes


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
    said = capsys.readouterr().out  # one line naming the files, not the summary's JSON
    assert said.startswith("rollout: 2 episode(s) (1 task(s) x 2) in ") and said.count("\n") == 1, said
    assert "resolved 2" in said and f"trajectories: {out / 'trajectories.jsonl'}" in said, said
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] == 2 and summary["resolved"] == 2 and summary["infra_failures"] == 0
    assert main(["show-trajectory", str(out / "trajectories.jsonl"), "--index", "-1"]) == 0
    assert "exit=submitted  reward=1" in capsys.readouterr().out


# --- time limits and the sandbox lifecycle ----------------------------------------------------------------


def _block(reason, command):
    return f"{reason}\n```\n{command}\n```"


class SleepyEngine:
    """Labelled fake at the engine boundary: the scripted policy, answering each turn after `delay_s`; for the
    tasks in `stuck`, generate blocks until `release` is set (a server that stopped answering)."""

    def __init__(self, inner, delay_s=0.0, stuck=()):
        self.inner, self.delay_s, self.stuck = inner, delay_s, set(stuck)
        self.release = threading.Event()

    def generate(self, prompt_ids, max_tokens, session=""):
        if session.split("/")[0] in self.stuck:
            self.release.wait(60)
        time.sleep(self.delay_s)
        return self.inner.generate(prompt_ids, max_tokens, session)

    def end_session(self, session):
        self.inner.end_session(session)


def _setup(chat, engine, make_sandbox, grade=patch_grader, **agent):
    return RolloutSetup(
        engine, make_sandbox, grade, chat, load_prompts(AgentConfig().prompts), AgentConfig(**agent), LIMITS
    )


def test_episode_past_its_timeout_is_an_infra_timeout_not_retried_nor_graded(tmp_path, chat):
    task = make_task(tmp_path, "t0")
    slow_turns = [_block("looking", "ls")] * 6  # six turns of 0.3 s: past a 1 s limit
    engine = SleepyEngine(ScriptedPolicy(chat, {"t0": slow_turns}), delay_s=0.3)
    graded = []

    def grade(task, patch):
        graded.append(patch)
        return patch_grader(task, patch)

    setup = _setup(
        chat, engine, lambda t: DirSandbox(t.extra["repo_dir"]), grade, episode_timeout_s=1.0, infra_retries=2
    )
    t0 = time.monotonic()
    (traj,), stats = run_rollouts([task], 1, setup, progress=False)
    assert time.monotonic() - t0 < 5
    assert traj.exit_reason == ExitReason.harness_timeout and traj.excluded
    assert traj.infra_failure.startswith("timeout: past agent.episode_timeout_s=1 s")
    assert 1 <= traj.num_steps < 6 and not traj.resolved and graded == []
    assert stats.timeouts == 1 and stats.cancelled == 0 and stats.retries == 0 and stats.infra_failures == 1
    assert stats.summary()["exit_reasons"] == {"harness_timeout": 1}


def test_rollout_deadline_cancels_stragglers_and_skips_the_rest(tmp_path, chat):
    tasks = [make_task(tmp_path, name) for name in ("fast", "stuck", "late")]
    gold = gold_patch_script(tasks[0].patch)
    engine = SleepyEngine(ScriptedPolicy(chat, {"fast": gold}), stuck={"stuck"})
    made = []

    def make_sandbox(task):
        made.append(DirSandbox(task.extra["repo_dir"]))
        return made[-1]

    setup = _setup(chat, engine, make_sandbox, concurrency=2, prewarm_sandboxes=1, rollout_timeout_s=1.5)
    try:
        t0 = time.monotonic()
        trajs, stats = run_rollouts(tasks, 2, setup, tmp_path / "t.jsonl", progress=False, cancel_grace_s=0.3)
        took = time.monotonic() - t0
    finally:
        engine.release.set()
    assert took < 4, took  # bounded by the deadline + grace, not by the stuck engine's 60 s
    by = {(t.task_id, t.sample_index): t for t in trajs}
    assert len(trajs) == 6 and len((tmp_path / "t.jsonl").read_text().splitlines()) == 6
    assert by[("fast", 0)].reward == 1.0 and by[("fast", 1)].reward == 1.0
    for key in [("stuck", 0), ("stuck", 1), ("late", 0), ("late", 1)]:
        t = by[key]
        assert t.exit_reason == ExitReason.harness_timeout and t.excluded, key
        assert t.infra_failure.startswith("timeout: rollout deadline: "), t.infra_failure
    assert stats.cancelled == 4 and stats.timeouts == 4 and stats.resolved == 2
    assert "not started" in by[("late", 1)].infra_failure
    assert all(sb.root is None for sb in made)  # every sandbox made, prefetched ones included, is stopped


def test_prewarmed_sandboxes_are_fresh_per_episode_and_all_stopped(tmp_path, chat):
    tasks = [make_task(tmp_path, f"t{i}") for i in range(3)]
    # each episode writes a marker and checks that no other episode's marker is in its sandbox
    script = [_block("mark", "test ! -e MARK && echo fresh > MARK && echo ok")]
    engine = ScriptedPolicy(chat, {t.instance_id: script for t in tasks})
    made = []

    def make_sandbox(task):
        made.append(DirSandbox(task.extra["repo_dir"]))
        return made[-1]

    setup = _setup(chat, engine, make_sandbox, concurrency=2, prewarm_sandboxes=2)
    trajs, stats = run_rollouts(tasks, 3, setup, progress=False)
    assert len(trajs) == 9 and stats.infra_failures == 0
    for t in trajs:
        assert "ok" in t.messages[3]["content"] and "+fresh" in t.patch
    assert len(made) == 9  # one sandbox per episode: none reused, none wasted
    # How many were made ahead depends on timing (an episode that starts before its prefetch is ready makes its
    # own): >= 5 failed on a loaded machine. At least one was, and every one made ahead was used.
    assert stats.prewarm["prefetched"] >= 1 and stats.prewarm["hits"] == stats.prewarm["prefetched"]
    assert all(sb.root is None for sb in made)


class Boom(BaseException):
    """An error that escapes rollout_one (as KeyboardInterrupt would)."""


def test_nothing_is_left_running_after_an_error(tmp_path, chat):
    tasks = [make_task(tmp_path, f"t{i}") for i in range(3)]
    engine = ScriptedPolicy(chat, {t.instance_id: gold_patch_script(t.patch) for t in tasks})
    made = []

    def make_sandbox(task):
        made.append(DirSandbox(task.extra["repo_dir"]))
        return made[-1]

    def grade(task, patch):
        raise Boom

    setup = _setup(chat, engine, make_sandbox, grade, concurrency=2, prewarm_sandboxes=3)
    with pytest.raises(Boom):
        run_rollouts(tasks, 2, setup, progress=False)
    assert len(made) >= 3 and all(sb.root is None for sb in made)


@pytest.mark.sandbox
@pytest.mark.skipif(_bwrap_ready() is not None, reason=str(_bwrap_ready()))
def test_episode_timeout_ends_a_running_command_in_a_real_sandbox(tmp_path, chat):
    from swe_megatron.rollout.setup import sandbox_factory

    task = make_task(tmp_path, "t0")
    engine = ScriptedPolicy(chat, {"t0": [_block("wait", "sleep 60")]})
    made = []
    factory = sandbox_factory(SandboxConfig(command_timeout_s=120))

    def make_sandbox(t):
        made.append(factory(t))
        return made[-1]

    setup = _setup(chat, engine, make_sandbox, episode_timeout_s=4)
    setup.limits = EpisodeLimits(t_max=8, context_length=8192, max_tokens_per_turn=256, command_timeout_s=120,
                                 output_cap=4000)  # fmt: skip
    t0 = time.monotonic()
    (traj,), stats = run_rollouts([task], 1, setup, progress=False)
    assert time.monotonic() - t0 < 12  # not the command's 60 s
    # the agent's own command took most of the time: scored (time_limit), not excluded (grading/exclusion.py;
    # a slow engine's deadline is the excluded case, tests/agent/test_episode.py)
    assert traj.exit_reason == ExitReason.time_limit and traj.infra_failure is None and not traj.excluded
    assert stats.timeouts == 0 and len(made) == 1 and made[0].workspace is None and made[0]._shell is None


@pytest.mark.parametrize(
    "override, needle",
    [
        ("agent.episode_timeout_s=-1", "agent.episode_timeout_s=-1"),
        ("agent.rollout_timeout_s=-5", "agent.rollout_timeout_s=-5"),
        ("agent.prewarm_sandboxes=-2", "prewarm_sandboxes"),  # -1: derived (config/capacity.py)
        ("agent.concurrency=5", "at most sandbox.max_concurrent x cluster.nodes"),
        ("agent.provenance_workers=-1", "agent.provenance_workers=-1 is invalid; allowed: an integer >= 0"),
    ],
)
def test_rollout_limits_are_validated(override, needle):
    from swe_megatron.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=needle):
        load_config("embedded", [override])
    cfg = load_config("embedded", ["agent.episode_timeout_s=0", "agent.rollout_timeout_s=600"])
    assert cfg.agent.episode_timeout_s == 0 and cfg.agent.prewarm_sandboxes == 2


ARENAS = """
import ctypes, os, sys, tempfile, threading
from swe_megatron.rollout.rollouts import few_malloc_arenas
if sys.argv[1] == "capped":
    assert few_malloc_arenas()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.fopen.restype = ctypes.c_void_p
go, held = threading.Barrier(9), []

def episode():  # a 64 KiB buffer (below the mmap threshold): from this thread's arena
    held.append(libc.malloc(65536))
    go.wait()

threads = [threading.Thread(target=episode) for _ in range(8)]
for t in threads:
    t.start()
go.wait()
path = tempfile.mktemp()
fp = libc.fopen(path.encode(), b"w")
libc.malloc_info(0, ctypes.c_void_p(fp))
libc.fclose(ctypes.c_void_p(fp))
print(open(path).read().count("<heap nr="))
os.unlink(path)
"""


def test_a_rollout_process_caps_its_malloc_arenas():
    """glibc gives each new thread an arena of its own, which keeps the peak of that thread's transient buffers;
    with hundreds of episode threads that was most of the controller's RSS at long contexts (docs/benchmarks.md,
    "Scale"). run_rollouts caps them (few_malloc_arenas) before its threads start."""
    import subprocess
    import sys

    from swe_megatron.rollout.rollouts import MALLOC_ARENAS

    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}

    def heaps(mode: str) -> int:
        res = subprocess.run([sys.executable, "-c", ARENAS, mode], capture_output=True, text=True, env=env,
                             timeout=120)  # fmt: skip
        assert res.returncode == 0, res.stderr[-2000:]
        return int(res.stdout.split()[-1])

    assert heaps("default") > MALLOC_ARENAS  # glibc's default: an arena per thread (up to 8 a core)
    assert heaps("capped") <= MALLOC_ARENAS
