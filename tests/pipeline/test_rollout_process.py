"""pipeline/rollout_process.py: async mode's rollouts in a process of their own. The child is the real one
(the module's main() in a child python, its pipe, its VersionGate, its rotations); what it rolls out is a test
worker (rollout_workers.py) behind a fake engine. test_rollout_process_rollouts.py builds the real Rollouts
through it; test_async_e2e.py runs a whole run's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
from rollout_workers import BrokenSpec, ProbeSpec, SlowEngine, rotation

from swe_megatron.engine.gate import VersionGate
from swe_megatron.pipeline.ahead import STOPPING, Ahead
from swe_megatron.pipeline.rollout_process import RolloutProcess, RolloutProcessError

HERE = str(Path(__file__).resolve().parent)
pytestmark = pytest.mark.timeout(45, method="thread")  # a deadlock fails in under a minute, not in 1800 s;
# "thread": the child may hang close() in a finally too, which a signal (one alarm) would not end


def _start(spec=None, rotations=()) -> RolloutProcess:
    return RolloutProcess(spec or ProbeSpec(), rotations, pythonpath=[HERE])


def test_rolls_run_in_another_process_in_order_and_their_errors_come_back_with_the_childs_traceback():
    proc = _start()
    try:
        pid = proc.roll("pid")
        assert pid != os.getpid() and pid == proc.proc.pid
        results = []
        threads = [
            threading.Thread(target=lambda k=k: results.append(proc.roll("echo", k))) for k in range(3)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(results) == [(0,), (1,), (2,)]
        with pytest.raises(KeyError, match="no-such-task") as err:
            proc.roll("raise", "no-such-task")
        (note,) = err.value.__notes__
        assert note.startswith(
            f"in the rollout process (pid {pid}):\nTraceback (most recent call last):\n  File "
        )
        assert 'rollout_workers.py", line' in note and note.endswith("KeyError: 'no-such-task'\n")
        assert proc.roll("echo", "after") == ("after",), "an error in one roll must not stop the next"
    finally:
        proc.close()
    assert proc.proc.returncode == 0


def test_the_child_imports_the_given_paths_first_and_keeps_the_inherited_pythonpath(monkeypatch):
    """pythonpath (where a spec's class lives) goes before the inherited PYTHONPATH, which is kept; none inherited
    leaves no empty entry (one would put the child's working folder on its import path)."""
    for inherited, want in ((None, HERE), ("/opt/run", HERE + os.pathsep + "/opt/run")):
        if inherited is None:
            monkeypatch.delenv("PYTHONPATH", raising=False)
        else:
            monkeypatch.setenv("PYTHONPATH", inherited)
        proc = _start()
        try:
            assert proc.roll("env", "PYTHONPATH") == want
        finally:
            proc.close()


def test_a_spec_that_fails_to_build_in_the_child_fails_the_start_with_its_error():
    with pytest.raises(RuntimeError, match="^no vLLM server answers") as err:
        _start(BrokenSpec())
    assert any("in the rollout process" in n for n in err.value.__notes__)


def test_rolls_asked_at_once_run_one_after_the_other():
    """One unit at a time: a roll asked while another runs starts when that one has ended."""
    proc = _start(ProbeSpec(turn_s=0.3))
    try:
        got: list = []
        rolls = [threading.Thread(target=lambda: got.append(proc.roll("turns", 1)[0])) for _ in range(2)]
        for t in rolls:
            t.start()
        for t in rolls:
            t.join()
    finally:
        proc.close()
    (start_a, end_a, _), (start_b, end_b, _) = sorted(got)
    assert start_b >= end_a, got


def test_an_error_that_does_not_pickle_comes_back_as_its_text():
    proc = _start()
    try:
        with pytest.raises(
            RolloutProcessError, match=r"RuntimeError\('holds a lock'\) in the rollout process"
        ):
            proc.roll("unpicklable")
    finally:
        proc.close()


def test_a_reply_that_cannot_be_read_stops_the_child_and_fails_the_call_instead_of_hanging_it():
    proc = _start()
    with pytest.raises(RolloutProcessError, match="could not be read .*does not unpickle.*it was stopped"):
        proc.roll("poison")
    assert proc.proc.poll() is not None
    with pytest.raises(RolloutProcessError):
        proc.roll("pid")
    proc.close()


def test_a_pause_the_rollout_process_cannot_take_leaves_the_trainers_gate_open():
    gate = VersionGate(SlowEngine(0.0), 2)
    ahead = Ahead(gate)
    ahead.start_process(_start)
    with pytest.raises(RolloutProcessError):
        ahead.process.roll("exit")
    with pytest.raises(RolloutProcessError, match="exited with status 3"):
        ahead.pause()
    assert gate.generate([1], 1).policy_version == 2  # not held back: the failed sync does not hang the run
    ahead.resume(None)  # after a failed update: that update's error is the run's, not the child's
    with pytest.raises(RolloutProcessError):
        ahead.resume(3)  # after a good one the child must serve it: its absence is an error
    ahead.close()


def test_a_failed_pause_without_a_trainers_gate_raises_the_childs_error():
    ahead = Ahead()  # no gate: e.g. a Context built without the driver's
    ahead.start_process(_start)
    with pytest.raises(RolloutProcessError):
        ahead.process.roll("exit")
    with pytest.raises(RolloutProcessError, match="exited with status 3"):
        ahead.pause()
    ahead.close()


def test_a_child_that_dies_fails_the_roll_in_flight_and_every_later_call_with_its_exit_status():
    proc = _start()
    why = (
        rf"^the rollout process \(pid {proc.proc.pid}\) exited with status 3 \(its output is in this run's log; a "
        r"negative status is the signal that killed it, e.g. -9 by the OOM killer\): the unit is not committed; "
        "rerun to resume$"
    )
    with pytest.raises(RolloutProcessError, match=why):
        proc.roll("exit")
    with pytest.raises(RolloutProcessError, match=why):
        proc.pause()
    proc.close()  # already gone: nothing to stop, no error


def test_pause_waits_for_the_childs_turn_in_flight_and_resume_gives_later_turns_the_new_version():
    proc = _start(ProbeSpec(turn_s=0.6, version=4))
    try:
        turns: list = []
        roll = threading.Thread(target=lambda: turns.extend(proc.roll("turns", 3)))
        roll.start()
        time.sleep(0.3)  # the first turn is in flight
        proc.pause()
        paused_at = time.monotonic()
        time.sleep(0.5)  # no turn may start while paused
        proc.resume(5)
        resumed_at = time.monotonic()
        roll.join()
    finally:
        proc.close()
    assert turns[0][1] <= paused_at, "pause returned while a turn was in flight"
    assert turns[0][2] == 4
    assert all(start >= resumed_at - 0.05 and version == 5 for start, _, version in turns[1:]), turns


def test_servers_out_of_rotation_on_either_side_are_dropped_on_the_other():
    engines, sandboxes = rotation("vLLM server", "e0", "e1"), rotation("sandbox server", "s0")
    proc = _start(rotations=[engines, sandboxes])
    try:
        proc.roll("drop", "e1")  # an engine died under the child's episodes: its reply tells the parent
        assert engines.dead == {1: "connection refused (seen by the other rollout process)"}
        proc.pause()
        sandboxes.drop(0, "gone")  # e.g. the weight sync dropped a server: resume tells the child
        proc.resume(1)
        assert proc.roll("dead") == {"vLLM server": ["e1"], "sandbox server": ["s0"]}
    finally:
        proc.close()


def test_servers_the_trainer_dropped_reach_the_child_at_pause_not_only_at_resume():
    """A server dropped on the trainer's side (a failed sync, a health check) is out of the child's rotation as
    soon as pause() returns: the child's work while paused (its probes, its episodes' next routing) skips it."""
    engines, sandboxes = rotation("vLLM server", "e0", "e1"), rotation("sandbox server", "s0")
    proc = _start(rotations=[engines, sandboxes])
    try:
        engines.drop(0, "missed the update")
        proc.pause()
        assert proc.roll("dead") == {"vLLM server": ["e0"], "sandbox server": []}
        proc.resume(1)
    finally:
        proc.close()


def test_close_with_a_roll_in_flight_refuses_its_turns_and_returns_it():
    ahead = Ahead()
    ahead.start_process(lambda: _start(ProbeSpec(turn_s=0.2)))
    ahead.submit("stage1:1", lambda: ahead.process.roll("turns", 10_000))
    time.sleep(0.5)
    t = time.monotonic()
    ahead.close()
    assert time.monotonic() - t < 10
    assert ahead.process is None


def test_close_ends_the_roll_in_flight_with_the_stopping_reason():
    proc = _start(ProbeSpec(turn_s=0.1))
    turns: list = []
    roll = threading.Thread(target=lambda: turns.extend(proc.roll("turns", 10_000)))
    roll.start()
    time.sleep(0.4)
    proc.close(STOPPING)
    roll.join(timeout=10)
    assert turns[-1] == ("refused", STOPPING) and len(turns) > 1


def test_the_rollout_process_dies_with_the_trainers_process_even_by_sigkill(tmp_path):
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {HERE!r})
        from rollout_workers import ProbeSpec
        from swe_megatron.pipeline.rollout_process import RolloutProcess
        p = RolloutProcess(ProbeSpec(turn_s=120), pythonpath=[{HERE!r}])
        p._call("roll", "turns", 1)  # a turn of 120 s in flight: the child would outlive its pipe for it
        time.sleep(0.5)
        print(p.proc.pid, flush=True)
        time.sleep(600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    os.kill(child, 0)  # alive
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(child, signal.SIGKILL)
    pytest.fail("the rollout process outlived the trainer's process")


def test_a_trainers_process_that_ends_without_close_exits_and_the_rollout_process_with_it():
    """An error path that never reaches close(): the parent's reader thread must not hold its exit (it waits on
    the child, which waits on the parent's pipe), and the child sees the pipe end and stops."""
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {HERE!r})
        from rollout_workers import ProbeSpec
        from swe_megatron.pipeline.rollout_process import RolloutProcess
        print(RolloutProcess(ProbeSpec(), pythonpath=[{HERE!r}]).proc.pid, flush=True)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=20)
    assert done.returncode == 0, done.stderr[-2000:]
    child = int(done.stdout)
    deadline = time.monotonic() + 10
    while _alive(child):
        assert time.monotonic() < deadline, "the rollout process outlived the trainer's process"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    """Running (not gone, not a zombie)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_the_rollout_process_does_not_share_the_trainers_stdin():
    """An interactive run's terminal (or any stdin) stays the trainer's: the child's is /dev/null."""
    read, write = os.pipe()
    saved = os.dup(0)
    os.dup2(read, 0)  # the trainer's stdin is a pipe here, so an inherited one would show
    try:
        proc = _start()
    finally:
        os.dup2(saved, 0)
        for fd in (saved, read, write):
            os.close(fd)
    try:
        assert os.readlink(f"/proc/{proc.proc.pid}/fd/0") == "/dev/null"
    finally:
        proc.close()


def test_close_answers_once_the_unit_in_flight_has_returned():
    """The child closes its worker (the run's sandbox sessions) only after the unit in flight has returned: the
    roll's reply comes before close's."""
    proc = _start(ProbeSpec(turn_s=0.1))
    order: list[str] = []
    proc._call("roll", "turns", 10_000).add_done_callback(lambda _: order.append("roll"))
    time.sleep(0.3)
    closing = proc._call("close", STOPPING)
    closing.add_done_callback(lambda _: order.append("close"))
    proc._reader.join(10)  # the child has answered both and exited
    proc.close()
    assert order == ["roll", "close"] and closing.exception() is None  # answered, not failed by the exit
    assert proc.proc.returncode == 0


def test_a_child_whose_trainer_closed_the_pipe_without_a_close_request_ends_its_unit_and_exits():
    """The trainer's end of the pipe gone (its process ending) without close(): the child refuses the turns of
    the unit in flight, which returns (its reply still sent), then exits cleanly."""
    proc = _start(ProbeSpec(turn_s=0.1))
    roll = proc._call("roll", "turns", 10_000)
    time.sleep(0.3)
    proc._send.close()
    turns = roll.result(timeout=10)
    assert len(turns) > 1 and turns[-1] == ("refused", "rollouts cancelled: the trainer's process is gone")
    assert proc.proc.wait(timeout=10) == 0
    proc._reader.join(10)


@dataclass
class ClosingSpec:
    """ProbeSpec's worker over servers whose closing writes `mark` (the child imports this class from here)."""

    mark: str

    def build(self):
        worker = ProbeSpec().build()
        closed = SimpleNamespace(close=lambda: Path(self.mark).write_text("closed"))
        worker.rollouts = SimpleNamespace(provenance=None, sandboxes=closed)
        return worker


def test_close_closes_the_childs_worker_and_its_servers(tmp_path):
    mark = tmp_path / "mark"
    proc = _start(ClosingSpec(str(mark)))
    proc.roll("pid")
    assert not mark.exists()
    proc.close()
    assert mark.read_text() == "closed"
