"""engine/gate.py: weight updates land between turns (or between episodes), and each turn carries its version.

A fake engine at the outer boundary (a generation that blocks until the test releases it) stands in for vLLM:
what is tested is the gate's ordering, which needs the timing under the test's control.
"""

from __future__ import annotations

import threading
import time

import pytest

from swe_megatron.engine.base import EngineError, Generation
from swe_megatron.engine.gate import VersionGate

pytestmark = pytest.mark.timeout(30)  # a deadlocking gate fails in seconds, not at the 1800 s default


class HeldEngine:
    """Fake engine: each generate blocks until `release` is set; it records the calls it got."""

    def __init__(self):
        self.release = threading.Event()
        self.calls: list[str] = []
        self.requests: list[tuple[list[int], int]] = []
        self.ended: list[str] = []
        self.reloaded: list[str] = []
        self.per_session: dict[str, threading.Event] = {}  # a session's own release, where the test set one

    def generate(self, prompt_ids, max_tokens, session=""):
        self.calls.append(session)
        self.requests.append((prompt_ids, max_tokens))
        assert self.per_session.get(session, self.release).wait(10)
        return Generation([1], [-0.5], "stop")

    def end_session(self, session):
        self.ended.append(session)

    def reload_weights(self, path):
        self.reloaded.append(path)


def _start(fn, *args) -> tuple[threading.Thread, list]:
    out: list = []
    th = threading.Thread(target=lambda: out.append(fn(*args)), daemon=True)
    th.start()
    return th, out


def _wait_until(cond, timeout=5.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def test_an_update_waits_for_the_turn_in_flight_and_later_turns_get_the_new_version():
    engine = HeldEngine()
    gate = VersionGate().serve(engine, 3)
    turn, got = _start(gate.generate, [0], 4, "ep")
    _wait_until(lambda: engine.calls)
    paused, _ = _start(gate.pause)
    time.sleep(0.2)
    assert paused.is_alive(), "the update must wait for the turn in flight"
    late, late_got = _start(
        gate.generate, [0], 4, "ep"
    )  # the episode's next turn comes while the update waits
    engine.release.set()
    turn.join(5)
    paused.join(5)
    assert got[0].policy_version == 3 and not paused.is_alive()
    time.sleep(0.2)
    assert late.is_alive() and len(engine.calls) == 1, "no turn may start while the weights change"
    gate.resume(4)
    late.join(5)
    assert late_got[0].policy_version == 4


def test_a_failed_update_keeps_the_version():
    gate = VersionGate().serve(HeldEngine(), 7)
    gate.engine.release.set()
    gate.pause()
    gate.resume(None)
    assert gate.generate([0], 1, "s").policy_version == 7


def test_per_episode_an_update_waits_for_whole_episodes_and_new_episodes_wait_for_it():
    engine = HeldEngine()
    engine.release.set()
    gate = VersionGate(per_episode=True).serve(engine, 0)
    assert gate.generate([0], 1, "a").policy_version == 0
    paused, _ = _start(gate.pause)
    time.sleep(0.2)
    assert paused.is_alive(), "episode a is still running: the update waits for it"
    # a goes on with the weights it started with; a new episode b waits for the update.
    assert gate.generate([0], 1, "a").policy_version == 0
    b, b_got = _start(gate.generate, [0], 1, "b")
    time.sleep(0.2)
    assert b.is_alive() and paused.is_alive()
    gate.end_session("a")
    paused.join(5)
    assert not paused.is_alive() and b.is_alive()
    gate.resume(1)
    b.join(5)
    assert b_got[0].policy_version == 1 and engine.ended == ["a"]


def test_closing_refuses_turns_and_wakes_those_waiting():
    engine = HeldEngine()
    engine.release.set()
    gate = VersionGate().serve(engine, 0)
    gate.pause()
    waiting, got = _start(lambda: _refused(gate))
    time.sleep(0.1)
    gate.close("stopping")
    waiting.join(5)
    assert got == ["stopping"]
    with pytest.raises(EngineError, match="stopping"):
        gate.generate([0], 1, "x")


def _refused(gate: VersionGate) -> str:
    try:
        gate.generate([0], 1, "w")
    except EngineError as e:
        return str(e)
    return "not refused"


def test_closing_also_refuses_the_next_turn_of_an_episode_holding_the_gate():
    """per_episode: a session that already holds the gate does not pass `_enter` again; close must stop it too."""
    engine = HeldEngine()
    engine.release.set()
    gate = VersionGate(per_episode=True).serve(engine, 0)
    assert gate.generate([0], 1, "a").policy_version == 0  # a holds the gate from here on
    gate.close("stopping")
    with pytest.raises(EngineError, match="stopping"):
        gate.generate([0], 1, "a")
    assert engine.calls == ["a"]


@pytest.mark.parametrize("per_episode", [False, True])
def test_ending_a_session_that_holds_nothing_leaves_the_count_alone(per_episode):
    """end_session of a session the gate does not know (per-turn gates hold none) must not release a hold:
    a count below zero would make every later pause() wait forever."""
    engine = HeldEngine()
    engine.release.set()
    gate = VersionGate(per_episode=per_episode).serve(engine, 0)
    gate.generate([0], 1, "a")
    gate.end_session("never-seen")
    if per_episode:
        gate.end_session("a")
        gate.end_session("a")  # twice: the second holds nothing either
    paused, _ = _start(gate.pause)
    paused.join(2)
    assert not paused.is_alive(), "pause() hangs: the gate counts a hold nobody has"
    gate.resume(1)
    assert gate.generate([0], 1, "b").policy_version == 1
    assert "never-seen" in engine.ended  # its server slot is released all the same


def test_the_gate_forwards_requests_and_reloads_to_its_engine():
    engine = HeldEngine()
    engine.release.set()
    gate = VersionGate(engine, 5)  # built with its engine, no serve(): the constructor's version is served
    assert gate.generate([7, 8], 16, "s").policy_version == 5
    assert engine.requests == [([7, 8], 16)] and engine.calls == ["s"]
    gate.pause()
    gate.reload_weights("/ckpt/v6")
    gate.resume(6)
    assert engine.reloaded == ["/ckpt/v6"] and gate.generate([1], 1).policy_version == 6


def test_an_update_waits_for_every_turn_in_flight_not_only_the_first():
    engine = HeldEngine()
    engine.per_session = {"a": threading.Event(), "b": threading.Event()}
    gate = VersionGate().serve(engine, 0)
    a, _ = _start(gate.generate, [0], 1, "a")
    b, _ = _start(gate.generate, [0], 1, "b")
    _wait_until(lambda: len(engine.calls) == 2)
    paused, _ = _start(gate.pause)
    engine.per_session["a"].set()
    a.join(5)
    time.sleep(0.2)
    assert paused.is_alive(), "b's turn is still in flight: the update must wait for it too"
    engine.per_session["b"].set()
    b.join(5)
    paused.join(5)
    assert not paused.is_alive()


def test_a_turn_without_a_session_holds_the_gate_for_that_turn_only():
    """per_episode gates hold per episode only for a named session: a turn without one (default) is released."""
    engine = HeldEngine()
    engine.release.set()
    gate = VersionGate(engine, per_episode=True)
    assert gate.generate([0], 1).policy_version == 0  # the default version: 0
    paused, _ = _start(gate.pause)
    paused.join(2)
    assert not paused.is_alive(), "a session-less turn kept the gate held"


def test_a_second_update_waits_for_the_first_to_resume():
    """Two pausers (the trainer's sync and a failover reload): the second holds until the first resumes, so
    two weight loads never overlap, and the turns held back run on the last version."""
    engine = HeldEngine()
    engine.release.set()
    gate = VersionGate().serve(engine, 1)
    gate.pause()
    second, _ = _start(gate.pause)
    time.sleep(0.2)
    assert second.is_alive(), "a second pause() must wait while an update runs"
    turn, got = _start(gate.generate, [0], 4, "ep")
    gate.resume(2)
    second.join(5)
    assert not second.is_alive()
    time.sleep(0.1)
    assert turn.is_alive() and not engine.calls, "the second update holds the turns back too"
    gate.resume(3)
    turn.join(5)
    assert got[0].policy_version == 3


def test_the_gate_shows_its_engines_server_rotation_or_none():
    """routing.check_servers reads the rotation of the engine behind the gate; an engine without one has none."""
    engine = HeldEngine()
    gate = VersionGate().serve(engine, 1)
    assert gate.rotation is None
    engine.rotation = rotation = object()
    assert gate.rotation is rotation
