"""Routing over many vLLM servers: sticky sessions, least-loaded placement, a dead server dropped from routing
and its episodes retried on the others; weight reload drops a server that cannot reload; no server left is
one ServersDown. The servers are HTTP stand-ins (vllm_stub.py); routing, engine client and rollouts are real."""

import logging
import time

import pytest
from fake_sandbox import DirSandbox
from tiny_repo import make_task
from vllm_stub import VllmStub

from swe_megatron.agent.episode import EpisodeLimits
from swe_megatron.agent.prompts import load_prompts
from swe_megatron.agent.tokens import ChatFormat
from swe_megatron.config.schema import AgentConfig, SamplingConfig
from swe_megatron.engine.base import EngineError
from swe_megatron.model.tokenizer import load_tokenizer
from swe_megatron.rollout.rollouts import GradeOutcome, RolloutSetup, run_rollouts
from swe_megatron.rollout.routing import NoRoom, Rotation, RoutedEngine, ServersDown, check_servers
from swe_megatron.trajectory import ExitReason

LIMITS = EpisodeLimits(
    t_max=4, context_length=8192, max_tokens_per_turn=64, command_timeout_s=10, output_cap=4000
)


@pytest.fixture(scope="module")
def chat():
    return ChatFormat(load_tokenizer("qwen2.5"))


@pytest.fixture
def stubs(request):
    made = []

    def make(n, **kw):
        made.extend(VllmStub([7, 151645], **kw) for _ in range(n))
        return made[-n:]

    yield make
    for s in made:
        s.close()


def routed(urls, timeout_s=5.0):
    return RoutedEngine.vllm(urls, "policy", SamplingConfig(), [151645], timeout_s, probe_timeout_s=2.0)


def test_sticky_least_loaded_and_ties_in_turn(stubs):
    a, b, c = stubs(3)
    eng = routed([a.url, b.url, c.url])
    for s in ("e1", "e2", "e3", "e1", "e1"):
        eng.generate([1, 2], 8, session=s)
    assert (a.completions, b.completions, c.completions) == (3, 1, 1)  # e1 sticks to a; e2, e3 spread
    eng.end_session("e2")
    eng.generate([1], 8, session="e4")  # b is the least loaded again
    assert b.completions == 2
    eng.end_session("e1")
    eng.end_session("e3")
    eng.end_session("e4")
    assert eng.rotation.load == [0, 0, 0]


def test_dead_server_leaves_rotation_once_and_reload_drops_a_stale_server(stubs, caplog):
    a, b, c = stubs(2) + stubs(1, fail_reload=True)
    eng = routed([a.url, b.url, c.url])
    eng.generate([1], 8, session="on-a")
    eng.generate([1], 8, session="on-b")
    a.die()
    with caplog.at_level(logging.WARNING, logger="swe_megatron.rollout.routing"):
        with pytest.raises(EngineError):
            eng.generate([1], 8, session="on-a")
        with pytest.raises(EngineError, match="out of rotation"):  # pinned to a: fails at once, no new probe
            eng.generate([1], 8, session="on-a")
    assert list(eng.rotation.dead) == [0]
    assert sum("out of rotation" in r.message for r in caplog.records) == 1
    eng.end_session("on-a")
    for k in range(4):  # new sessions never go to a
        eng.generate([1], 8, session=f"new{k}")
    assert a.completions == 2 and b.completions + c.completions == 5
    eng.reload_weights("/ckpt/1")  # c answers HTTP 500: it would serve stale weights, so it is dropped
    assert eng.urls == [b.url] and "/collective_rpc" in b.paths
    b.die()
    with pytest.raises(ServersDown, match="no vLLM server is left"):
        eng.reload_weights("/ckpt/2")
    with pytest.raises(EngineError, match="no vLLM server is left"):
        eng.generate([1], 8, session="late")


def test_probe_keeps_a_server_that_answers():
    rot = Rotation("vLLM server", ["x", "y"], probe=lambda i: None)
    assert rot.failed(0, "HTTP 400: prompt too long") is False and rot.live == [0, 1]
    probes = []
    rot = Rotation("vLLM server", ["x", "y"], probe=lambda i: probes.append(i) or "connection refused")
    rot.probe_interval_s = 0.01
    assert rot.failed(1, "reset") is True and rot.live == [0] and probes == [1, 1, 1]
    check_servers(type("R", (), {"rotation": rot})())
    rot.drop(0, "gone")
    with pytest.raises(
        ServersDown, match=r"x: gone; y: reset; health probe \(3 probes\): connection refused"
    ):
        check_servers(type("R", (), {"rotation": rot})())


def test_a_server_that_misses_one_probe_is_slow_not_dead():
    """An overloaded server that misses a probe stays: dropping it would pile its load on the others (at 1024
    episodes in flight that took all three sandbox servers out one after the other)."""
    answers = iter(["timed out", "timed out", None])
    rot = Rotation("sandbox server", ["x", "y"], probe=lambda i: next(answers))
    rot.probe_interval_s = 0.01
    assert rot.failed(0, "sandbox did not start") is False and rot.live == [0, 1]


def test_rotation_waits_for_a_free_slot():
    import threading

    rot = Rotation("sandbox server", ["x"], probe=lambda i: None, capacity=[1])
    assert rot.acquire() == 0
    got = []
    t = threading.Thread(target=lambda: got.append(rot.acquire()))
    t.start()
    t.join(0.3)
    assert not got  # full: waits
    rot.release(0)
    t.join(5)
    assert got == [0]


def test_speculative_placements_never_wait_and_leave_the_reserve():
    rot = Rotation("sandbox server", ["x", "y"], probe=lambda i: None, capacity=[2, 2])
    needed = rot.acquire()
    ahead = [rot.acquire(reserve=2), rot.acquire(reserve=2)]  # 4 slots, 2 kept: 2 may be taken ahead
    with pytest.raises(NoRoom):
        rot.acquire(reserve=2)  # a slot is free, but only for the sandboxes needed now
    assert rot.ahead[0] + rot.ahead[1] == 2 and sum(rot.load) == 3
    rot.claim(ahead[0])  # in use now: one more may be taken ahead, here the last free slot
    rot.acquire(reserve=2)
    t0 = time.monotonic()
    with pytest.raises(NoRoom):
        rot.acquire(reserve=0)  # every server full: no wait
    assert time.monotonic() - t0 < 0.5
    rot.release(ahead[1], ahead=True)
    rot.release(needed)
    assert sum(rot.ahead) == 1 and sum(rot.load) == 2 and rot.overcommits == 0
    unlimited = Rotation("sandbox server", ["z"], probe=lambda i: None)
    assert [unlimited.acquire(reserve=5) for _ in range(3)] == [0, 0, 0]


def test_engine_death_mid_iteration_retries_episodes_on_the_other_server(tmp_path, chat, stubs):
    """Server a crashes on its 3rd request (in flight); every episode still ends submitted, on b."""
    submit = chat.encode("I am done.\n```\nsubmit\n```") + [chat.eos_id]
    a, b = VllmStub(submit, delay_s=0.2, die_after=3), VllmStub(submit, delay_s=0.2)
    try:
        eng = routed([a.url, b.url])
        tasks = [make_task(tmp_path, f"t{i}") for i in range(4)]
        setup = RolloutSetup(
            eng,
            lambda task: DirSandbox(task.extra["repo_dir"]),
            lambda task, patch: GradeOutcome(0.0, False),
            chat,
            load_prompts(AgentConfig().prompts),
            AgentConfig(concurrency=4, infra_retries=2),
            LIMITS,
        )
        trajs, stats = run_rollouts(tasks, 2, setup, tmp_path / "t.jsonl", progress=False)
    finally:
        a.close()
        b.close()
    assert len(trajs) == 8
    assert all(t.exit_reason == ExitReason.submitted and not t.excluded for t in trajs)
    assert stats.retries >= 1 and stats.infra_failures == 0
    assert list(eng.rotation.dead) == [0] and a.completions >= 3 and 1 <= a.answered <= 2
    # every episode but those a answered before it died (1 or 2: a request in flight when it dies is lost
    # too, and which arrives third depends on thread timing) is redone on b, and none is run twice
    assert b.completions == 8 - a.answered
    check_servers(eng)  # b is left: the iteration stands


def test_weight_reload_runs_on_every_server_at_once(stubs):
    """At 72B a reload takes minutes per server: the servers reload in parallel, not one after another."""
    servers = stubs(3, delay_s=0.5)

    def reload_time(urls):
        eng = routed(urls)
        t = time.perf_counter()
        eng.reload_weights("/ckpt/1")
        return time.perf_counter() - t

    one, three = reload_time([servers[0].url]), reload_time([s.url for s in servers])
    print(f"reload: one server {one:.2f} s, three servers {three:.2f} s")
    assert all("/collective_rpc" in s.paths for s in servers)
    assert three < 1.6 * one
