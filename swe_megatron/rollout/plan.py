"""The rollout phase of one iteration of each stage, estimated from a run preset (`swe-megatron plan PRESET`).

Every number that is not in the config is an assumption with its own flag (`RolloutAssumptions`, printed beside
the estimate). The model of one episode: a first prompt of `first_prompt_tokens`, then turns of
`gen_tokens_per_turn` generated and `obs_tokens_per_turn` of observation, so the context grows by their sum each
turn, up to the stage's context_length; `turns` turns on average (at most t_max, and no more than fit).

    tokens generated   = episodes x turns x gen
    tokens prefilled   = with the prefix cache (vLLM's, sticky sessions): the new tokens of each turn (first
                         prompt + observations); without it: the whole context of every turn
    engine-bound time  = (generated / decode_tps + prefilled / prefill_tps) / servers
    latency-bound time = waves x turns x (gen / per-episode decode speed + tool_s), with
                         waves = ceil(episodes / agent.concurrency) and per-episode decode speed =
                         decode_tps / episodes on one server
    expected wall      = the larger of the two (the synchronous loop's stragglers come on top: not modelled)

A server's KV cache (its GPUs x gpu_gib x engine.gpu_memory_utilization, less the bf16 weights) holds
`kv_tokens` tokens; divided by an episode's mean context it says how many episodes one server can keep busy,
the check on engine.episodes_per_server.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from swe_megatron.config.capacity import engine_capacity, sandbox_slots
from swe_megatron.config.schema import RL_STAGE_NAMES, STAGE_NAMES
from swe_megatron.train.memory_plan import GIB, total_params


@dataclass
class RolloutAssumptions:
    """What the estimate assumes beyond the config (each a flag of `swe-megatron plan`)."""

    turns_fraction: float = 0.6
    """Mean turns per episode as a share of the stage's t_max."""
    first_prompt_tokens: int = 2500
    """System prompt + problem statement, tokens."""
    gen_tokens_per_turn: int = 300
    """Tokens one assistant turn generates (reasoning + one command)."""
    obs_tokens_per_turn: int = 700
    """Tokens of one observation (command output, capped, + the prompt line)."""
    decode_tps: float = 2500.0
    """Tokens/s one vLLM server generates at its full running batch."""
    prefill_tps: float = 20000.0
    """Tokens/s one vLLM server prefills."""
    tool_s: float = 3.0
    """Seconds one command takes in its sandbox (the observation's wait)."""
    gpu_gib: float = 140.0
    """GPU memory, GiB (H200: 140)."""
    prefix_cache: bool = True
    """Engines reuse the KV of a session's previous turns (vLLM prefix caching, sticky routing)."""


@dataclass
class RolloutPhase:
    """One stage's rollout phase of one iteration."""

    stage: str
    episodes: int
    turns: float
    mean_context: float
    generated: float
    prefilled: float
    prefilled_uncached: float
    engine_s: float
    latency_s: float
    concurrency: int
    servers: int
    kv_tokens: float

    @property
    def wall_s(self) -> float:
        """Expected wall seconds (the larger bound)."""
        return max(self.engine_s, self.latency_s)

    @property
    def episodes_fitting(self) -> float:
        """Episodes at the mean context one server's KV cache holds."""
        return self.kv_tokens / max(1.0, self.mean_context)


def kv_tokens_per_server(cfg, a: RolloutAssumptions) -> float:
    """Tokens one vLLM server's KV cache holds (bf16 K and V of every layer; weights in bf16 first)."""
    m, e = cfg.model, cfg.engine
    head_dim = m.hidden_size // m.num_attention_heads
    per_token = 2 * m.num_layers * m.num_key_value_heads * head_dim * 2
    free = e.tensor_parallel_size * a.gpu_gib * GIB * e.gpu_memory_utilization - 2 * total_params(m)
    return max(0.0, free / per_token)


def rollout_phase(cfg, stage: str, a: RolloutAssumptions) -> RolloutPhase:
    """The estimate for one stage of a loaded RunConfig (see the module docstring)."""
    st = getattr(cfg, stage)
    episodes = st.tasks_per_iteration * st.samples_per_task
    if stage in RL_STAGE_NAMES:
        episodes = math.ceil(episodes * cfg.algo.oversample_factor)
    step = a.gen_tokens_per_turn + a.obs_tokens_per_turn
    fit = max(1, (st.context_length - a.first_prompt_tokens) // step)
    turns = min(float(fit), max(1.0, a.turns_fraction * st.t_max))
    contexts = [a.first_prompt_tokens + t * step for t in range(math.ceil(turns))]
    mean_context = sum(contexts) / len(contexts)
    generated = episodes * turns * a.gen_tokens_per_turn
    uncached = episodes * turns * mean_context
    cached = episodes * (a.first_prompt_tokens + (turns - 1) * a.obs_tokens_per_turn)
    prefilled = cached if a.prefix_cache else uncached
    servers = cfg.engine.num_servers
    concurrency = cfg.agent.concurrency
    engine_s = (generated / a.decode_tps + prefilled / a.prefill_tps) / servers
    per_server = max(1.0, min(concurrency, episodes) / servers)
    turn_s = a.gen_tokens_per_turn / (a.decode_tps / per_server) + a.tool_s
    latency_s = math.ceil(episodes / concurrency) * turns * turn_s
    return RolloutPhase(stage, episodes, turns, mean_context, generated, prefilled, uncached, engine_s,
                        latency_s, concurrency, servers, kv_tokens_per_server(cfg, a))  # fmt: skip


def describe_assumptions(a: RolloutAssumptions) -> str:
    """The assumptions in words, each with the `plan` flag that changes it."""
    return (
        f"mean turns {a.turns_fraction:g} x t_max (--turns-fraction), first prompt {a.first_prompt_tokens} tokens, "
        f"{a.gen_tokens_per_turn} generated + {a.obs_tokens_per_turn} observed per turn, one server decodes "
        f"{a.decode_tps:g} and prefills {a.prefill_tps:g} tokens/s, {a.tool_s:g} s per command, {a.gpu_gib:g} GiB "
        f"GPUs, prefix cache {'on' if a.prefix_cache else 'off'}"
    )


def format_phases(cfg, a: RolloutAssumptions) -> str:
    """The rollout phase of one iteration of each stage in the schedule, with the capacity it runs on."""
    e = cfg.engine
    lines = [
        f"rollout phase of one iteration (estimates; assumptions: {describe_assumptions(a)}):",
        f"  capacity: agent.concurrency {cfg.agent.concurrency} episodes in flight; engines "
        f"{e.num_servers} x {e.episodes_per_server} = {engine_capacity(cfg)} (engine.num_servers x "
        f"episodes_per_server); sandbox slots {sandbox_slots(cfg)} (sandbox.max_concurrent x cluster.nodes); "
        f"prewarm {cfg.agent.prewarm_sandboxes}; weight sync {e.weight_sync}",
    ]
    for stage in (s for s in cfg.schedule if s in STAGE_NAMES):
        p = rollout_phase(cfg, stage, a)
        lines.append(
            f"  {stage}: {p.episodes} episodes x {p.turns:.0f} turns (mean context {p.mean_context / 1e3:.0f}k); "
            f"generated {p.generated / 1e6:.1f}M tokens, prefilled {p.prefilled / 1e6:.1f}M "
            f"({'prefix cache' if a.prefix_cache else 'no prefix cache'}; without it "
            f"{p.prefilled_uncached / 1e9:.2f}G); engine-bound {p.engine_s / 60:.0f} min, latency-bound "
            f"{p.latency_s / 60:.0f} min -> expected {p.wall_s / 60:.0f} min; one server's KV cache holds "
            f"{p.kv_tokens / 1e6:.2f}M tokens = {p.episodes_fitting:.0f} episodes at the mean context"
        )
    return "\n".join(lines)
