"""pipeline/ahead.py on its own: the rollout clock against a fake clock, the rollout thread's order and errors,
and close() stopping rollouts that would otherwise run forever. test_async_e2e is the second line.

Fakes at the outer boundary only: time.monotonic (a clock the test moves) and the engine behind the real
VersionGate (a generation that returns at once); the rollouts are plain functions.
"""

from __future__ import annotations

import threading

import pytest

from swe_megatron.engine.base import EngineError, Generation
from swe_megatron.engine.gate import VersionGate
from swe_megatron.pipeline import ahead as ahead_mod
from swe_megatron.pipeline.ahead import STOPPING, Ahead, BusyClock

pytestmark = pytest.mark.timeout(30, method="thread")  # a deadlock fails in seconds, not at the 1800 s default


class FakeTime:
    """time.monotonic under the test's control."""

    def __init__(self):
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> FakeTime:
    fake = FakeTime()
    monkeypatch.setattr(ahead_mod, "time", fake)
    return fake


def _approx(pair):
    return pytest.approx(pair, abs=1e-9)


def test_busy_time_is_split_at_each_read(clock):
    c = BusyClock()
    busy = c.busy()
    busy.__enter__()  # a rollout starts at 100.0 and runs across two reads
    clock.now = 100.3
    assert c.take() == _approx((0.3, 0.3))
    clock.now = 100.6
    assert c.take() == _approx((0.3, 0.3)), "busy time counted twice: the read must restart the busy span"
    clock.now = 100.7
    busy.__exit__(None, None, None)
    clock.now = 101.0
    assert c.take() == _approx((0.1, 0.4))  # busy 100.6..100.7 of the cycle 100.6..101.0
    clock.now = 101.5
    assert c.take() == _approx((0.0, 0.5))  # nothing ran
    with c.busy():  # a finished span and one still running at the read add up
        clock.now = 101.7
    clock.now = 101.8
    running = c.busy()
    running.__enter__()
    clock.now = 102.0
    assert c.take() == _approx((0.4, 0.5))
    running.__exit__(None, None, None)


def test_overlapping_rollouts_count_once_and_gaps_not_at_all(clock):
    c = BusyClock()
    clock.now = 101.0
    with c.busy():  # inline rollouts 101.0..103.0, with rollouts ahead 102.0..104.0 overlapping them
        clock.now = 102.0
        with c.busy():
            clock.now = 103.0
        clock.now = 104.0
    clock.now = 106.0
    with c.busy():
        clock.now = 106.5
    clock.now = 110.0
    assert c.take() == _approx((3.5, 10.0))  # 101..104 and 106..106.5 of 100..110


def test_cycle_metrics_by_hand(clock):
    a = Ahead()
    a.begin("stage1")  # the stage's first cycle starts here, not at construction
    clock.now = 104.0
    a.run(lambda: setattr(clock, "now", 107.0))  # rollouts inline: 104..107
    clock.now = 110.0
    assert a.cycle(trainer_wait_s=3.0) == pytest.approx(
        {"cycle_s": 10.0, "trainer_idle_frac": 0.3, "engine_idle_frac": 0.7}
    )
    clock.now = 111.0
    a.begin("stage1")  # the same stage: the cycle goes on from the last read
    clock.now = 112.0
    assert a.cycle(0.0)["cycle_s"] == pytest.approx(2.0)
    clock.now = 114.0
    a.begin("stage2")  # a new stage starts anew: 112..114 belongs to no cycle
    clock.now = 116.0
    a.submit("stage2:1", lambda: setattr(clock, "now", 120.0))  # rollouts ahead are busy time too
    a.take("stage2:1")
    assert a.cycle(trainer_wait_s=0.0) == pytest.approx(
        {"cycle_s": 6.0, "trainer_idle_frac": 0.0, "engine_idle_frac": 2 / 6}
    )
    a.close()
    assert a.cycle(1.0) == {
        "cycle_s": 0.0,
        "trainer_idle_frac": 0.0,
        "engine_idle_frac": 0.0,
    }  # no time passed


def test_engine_idle_fraction_is_not_clamped(clock, monkeypatch):
    """A clock that reports more busy time than the cycle had must show (below 0), not be hidden as 0."""
    a = Ahead()
    monkeypatch.setattr(a.clock, "take", lambda: (0.6, 0.3))
    assert a.cycle(0.0)["engine_idle_frac"] == pytest.approx(-1.0)


def test_rollouts_ahead_run_in_order_on_one_thread_and_their_errors_reach_take():
    a = Ahead()
    order, threads, go = [], set(), threading.Event()

    def roll(unit: str, wait: bool = False) -> str:
        if wait:
            assert go.wait(10)
        order.append(unit)
        threads.add(threading.current_thread().name)
        return f"rolled {unit}"

    def broken():
        raise RuntimeError("engine died")

    a.submit("s:1", roll, "s:1", True)  # held until the test lets it go: s:2 must wait for it
    a.submit("s:2", roll, "s:2")
    a.submit("s:3", broken)
    assert a.started("s:1") and a.started("s:2") and not a.started("s:4")
    assert order == []
    go.set()
    assert a.take("s:2") == "rolled s:2" and a.take("s:1") == "rolled s:1"
    assert order == ["s:1", "s:2"] and threads == {"rollouts-ahead_0"}  # one thread, named for stack dumps
    assert not a.started("s:1")  # taken
    with pytest.raises(RuntimeError, match="engine died"):
        a.take("s:3")
    assert a.take("s:4") is None  # never submitted: the caller rolls it out inline
    a.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("rollouts-ahead")]  # the thread ended


class InstantEngine:
    """Fake engine: every turn returns at once."""

    def generate(self, prompt_ids, max_tokens, session=""):
        return Generation([1], [-0.5], "stop")

    def end_session(self, session):
        pass


def _endless_rollouts(gate: VersionGate, turns: list[int]) -> None:
    """An episode that only ends when the gate refuses its turn (a rollout nobody will wait for)."""
    while True:
        gate.generate([0], 1, "ep")
        turns[0] += 1


def test_close_stops_rollouts_in_flight_through_the_gate():
    gate = VersionGate().serve(InstantEngine(), 0)
    a, turns = Ahead(gate), [0]
    a.submit("s:1", _endless_rollouts, gate, turns)
    while turns[0] < 3:  # running
        pass
    closer = threading.Thread(target=a.close, daemon=True)
    closer.start()
    closer.join(10)
    if closer.is_alive():
        gate.close("test over")  # free the rollout thread that close() did not stop
        pytest.fail("close() waits for rollouts it never stopped")
    with pytest.raises(EngineError, match="rollouts cancelled"):
        gate.generate([0], 1, "later")
    assert STOPPING.startswith("rollouts cancelled") and not a.started("s:1")


def test_close_with_nothing_in_flight_leaves_the_gate_open():
    gate = VersionGate().serve(InstantEngine(), 0)
    a = Ahead(gate)
    a.submit("s:1", lambda: 1)
    assert a.take("s:1") == 1
    a.close()
    assert gate.generate([0], 1, "x").policy_version == 0  # nothing was cancelled: nothing is refused
    a.submit("s:2", lambda: 2)  # a new thread after close
    assert a.take("s:2") == 2
    a.close()
