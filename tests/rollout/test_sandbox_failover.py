"""Rollouts over two real sandbox servers, one SIGKILLed mid-iteration: its in-flight episodes fail as
infrastructure failures, their retries run on the other server, the dead one leaves the rotation, and the
iteration completes; with both gone, the next iteration ends in one ServersDown. The policy is the scripted
gold-patch fake; sandboxes, grading and routing are real."""

import threading
import time

import pytest
from sandbox_servers import TOKEN, missing

from swe_megatron.config.schema import RunConfig, SandboxConfig
from swe_megatron.engine.scripted import ScriptedPolicy, gold_patch_script
from swe_megatron.rollout.routing import SandboxPool, ServersDown, check_servers
from swe_megatron.rollout.setup import Rollouts
from swe_megatron.trajectory import ExitReason, Trajectory

pytestmark = [pytest.mark.sandbox, pytest.mark.skipif(missing() is not None, reason=str(missing()))]


def test_killed_sandbox_server_mid_iteration(tmp_path, sandbox_servers, gold_task):
    a, b = sandbox_servers(2)
    tasks, chat = gold_task
    # A slow first command keeps episodes in flight on a when it is killed.
    script = ["Let me look first.\n```\nsleep 3\n```", *gold_patch_script(tasks[0].patch)]
    engine = ScriptedPolicy(chat, {tasks[0].instance_id: script})
    cfg = RunConfig(run_dir=str(tmp_path / "run"), sandbox=SandboxConfig(command_timeout_s=60))
    cfg.agent.concurrency, cfg.agent.infra_retries = 4, 2
    pool = SandboxPool.connect([a.url, b.url], TOKEN, command_timeout_s=60)
    assert pool.rotation.capacity == [2, 2]
    rollouts = Rollouts(cfg, engine, pool, chat)
    limits = rollouts.limits(cfg.stage1)
    killed = threading.Event()

    def kill_a_when_busy():
        deadline = time.monotonic() + 60
        while pool.rotation.load[0] < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)  # inside the first command
        a.kill()
        killed.set()

    killer = threading.Thread(target=kill_a_when_busy, daemon=True)
    killer.start()
    try:
        t0 = time.monotonic()
        trajs, stats = rollouts.run(tasks, 6, limits, tmp_path / "it0")
        seconds = time.monotonic() - t0
        killer.join(5)
        assert killed.is_set()
        assert len(trajs) == 6
        for t in trajs:  # each one either done on b or an excluded infrastructure failure, never a 0
            assert (t.resolved and not t.excluded) or (t.excluded and t.infra_failure), (
                t.exit_reason,
                t.infra_failure,
            )
        assert stats.retries >= 2  # the two episodes running on a were retried
        assert stats.resolved == 6 - stats.infra_failures and stats.resolved >= 4
        assert list(pool.rotation.dead) == [0] and pool.rotation.live == [1]
        assert pool.rotation.load == [0, 0]
        check_servers(pool)  # b is left: the iteration stands
        print(f"6 episodes, a killed mid-iteration: {seconds:.1f} s, {stats.retries} retries")

        b.kill()
        with pytest.raises(ServersDown, match="no sandbox server is left in rotation") as err:
            rollouts.run(tasks, 2, limits, tmp_path / "it1")
        assert a.url in str(err.value) and b.url in str(err.value)
        lines = (tmp_path / "it1" / "trajectories.jsonl").read_text().splitlines()
        trajs = [Trajectory.from_json(line) for line in lines]
        assert len(trajs) == 2 and all(
            t.excluded and t.exit_reason == ExitReason.sandbox_error for t in trajs
        )
    finally:
        pool.close()
