"""How many episodes a cluster can run at once, and the rollout settings derived from it.

    sandbox slots   = sandbox.max_concurrent x cluster.nodes        (one sandbox server per node)
    engine capacity = engine.num_servers x engine.episodes_per_server (0 per server: not stated)
    agent.concurrency 0       -> min(engine capacity, sandbox slots) (sandbox slots when capacity is not stated)
    agent.prewarm_sandboxes -1 -> the slots the running episodes leave: (slots - concurrency x per episode) /
                                  per episode, at most concurrency (per episode: 2 with prewarm_grading, else 1)

`derive` fills these in when a config is loaded (show-config prints the numbers); validate.py refuses more
episodes in flight than sandbox slots, and `idle_warnings` names settings that leave most engines idle.
"""

from __future__ import annotations

from typing import Any

AUTO_CONCURRENCY = 0
"""agent.concurrency: derive it from the cluster."""
AUTO_PREWARM = -1
"""agent.prewarm_sandboxes: derive it from the spare sandbox slots."""
IDLE_FRACTION = 0.5
"""Below this share of the engine capacity in flight, most of the engines idle: warned."""


def sandbox_slots(cfg: Any) -> int:
    """Sandboxes the run's sandbox servers hold at once (one server per node)."""
    return cfg.sandbox.max_concurrent * max(1, cfg.cluster.nodes)


def engine_capacity(cfg: Any) -> int:
    """Episodes the engines keep busy at once (0: engine.episodes_per_server not stated)."""
    return cfg.engine.num_servers * cfg.engine.episodes_per_server


def slots_per_episode(cfg: Any) -> int:
    """Sandbox slots one running episode holds when its grading sandbox starts while it runs."""
    return 2 if cfg.agent.prewarm_grading else 1


def derive(cfg: Any) -> None:
    """Fill in agent.concurrency 0 and agent.prewarm_sandboxes -1 from the cluster (see the module docstring);
    explicit values are left alone."""
    a, slots = cfg.agent, sandbox_slots(cfg)
    if a.concurrency == AUTO_CONCURRENCY:
        engines = engine_capacity(cfg)
        a.concurrency = max(1, min(engines, slots) if engines else slots)
    if a.prewarm_sandboxes == AUTO_PREWARM:
        per = slots_per_episode(cfg)
        a.prewarm_sandboxes = max(0, min(a.concurrency, (slots - a.concurrency * per) // per))


def idle_warnings(cfg: Any) -> list[str]:
    """Settings that run but leave most of the cluster's engines idle, as one-line messages."""
    engines = engine_capacity(cfg)
    c = cfg.agent.concurrency
    if engines and c < IDLE_FRACTION * engines:
        return [
            f"agent.concurrency={c} keeps {c} episodes in flight on engines that can run {engines} "
            f"(engine.num_servers x episodes_per_server = {cfg.engine.num_servers} x "
            f"{cfg.engine.episodes_per_server}): {100 * (1 - c / engines):.0f}% of them idle; set "
            "agent.concurrency=0 to derive it from the cluster, or a larger number"
        ]
    return []
