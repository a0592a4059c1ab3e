"""Pre-warming against a real sandbox server with no slot to spare (max_concurrent == agent.concurrency): the
sandboxes started ahead must never hold a slot a running episode waits for. Before the fix, prefetched episode
and grading sandboxes filled the server, the episodes' own placements waited for a slot (up to SLOT_WAIT_S)
and then overcommitted into HTTP 429s. The policy is the scripted gold-patch fake; sandboxes, grading and
routing are real."""

import time

import pytest
from sandbox_servers import TOKEN, missing

from swe_megatron.config.schema import RunConfig, SandboxConfig
from swe_megatron.engine.scripted import ScriptedPolicy, gold_patch_script
from swe_megatron.rollout.routing import SandboxPool
from swe_megatron.rollout.setup import Rollouts

pytestmark = [pytest.mark.sandbox, pytest.mark.skipif(missing() is not None, reason=str(missing()))]

CONCURRENCY = 2
EPISODES = 6


def test_prewarm_never_holds_a_slot_a_running_episode_needs(tmp_path, sandbox_servers, gold_task):
    tasks, chat = gold_task
    engine = ScriptedPolicy(chat, {tasks[0].instance_id: gold_patch_script(tasks[0].patch)})

    def rollout(server, **agent) -> tuple[float, dict, SandboxPool]:
        cfg = RunConfig(run_dir=str(tmp_path / "run"), sandbox=SandboxConfig(command_timeout_s=60))
        cfg.agent.concurrency = CONCURRENCY
        for key, value in agent.items():
            setattr(cfg.agent, key, value)
        pool = SandboxPool.connect([server.url], TOKEN, command_timeout_s=60)
        pool.rotation.slot_wait_s = 20.0  # a stall shows as a wait of this long (SLOT_WAIT_S is 120 s)
        rollouts = Rollouts(cfg, engine, pool, chat)
        try:
            t0 = time.monotonic()
            trajs, stats = rollouts.run(tasks, EPISODES, rollouts.limits(cfg.stage1), tmp_path / "out")
            seconds = time.monotonic() - t0
        finally:
            pool.close()
        assert stats.resolved == EPISODES and stats.infra_failures == 0 and stats.retries == 0, [
            t.infra_failure for t in trajs
        ]
        assert pool.rotation.load == [0]
        return seconds, stats.prewarm, pool

    (tight,) = sandbox_servers(1, CONCURRENCY)  # no slot beyond the running episodes' own
    plain_s, _, plain = rollout(tight, prewarm_sandboxes=0, prewarm_grading=False)
    warm_s, counts, warm = rollout(tight)  # the defaults: 2 episode sandboxes ahead, grading sandboxes ahead
    # Room for what the defaults start ahead: (concurrency + prewarm_sandboxes) x (1 + prewarm_grading).
    ample_s, ample_counts, ample = rollout(sandbox_servers(1, (CONCURRENCY + 2) * 2)[0])
    print(
        f"{EPISODES} episodes at concurrency {CONCURRENCY}: {plain_s:.1f} s plain, {warm_s:.1f} s prewarm "
        f"{counts}, {ample_s:.1f} s prewarm with room {ample_counts}"
    )
    for pool in (plain, warm, ample):
        assert pool.rotation.overcommits == 0 and pool.rotation.ahead == [0]
        # A placement may wait for a finished sandbox's background stop, never for a prefetched one.
        assert pool.rotation.longest_wait_s < 5.0, pool.rotation.longest_wait_s
    assert counts["failed_starts"] == 0  # no prefetch started into a full server (HTTP 429)
    assert counts["hits"] == 0 and counts["skipped"] > 0  # no slot was free beyond the running episodes'
    assert warm_s < 1.5 * plain_s + 5.0
    # Sandboxes still stopping in the background hold slots too: a few prefetches may be skipped even here.
    assert ample_counts["failed_starts"] == 0 and ample_counts["hits"] > ample_counts["skipped"]
    assert ample_counts["hits"] + ample_counts["skipped"] == ample_counts["prefetched"]
