"""sandbox/prewarm.py with real bwrap sandboxes: prefetched sandboxes are started, fresh and handed out once;
stops happen in the background; after close() (errors included) no process or workspace of the pool is left."""

from __future__ import annotations

import os
import threading
import time

import pytest

from swe_megatron.sandbox import SandboxError, SandboxSpec, make_sandbox
from swe_megatron.sandbox.prewarm import Prewarmer


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


class Recorder:
    """Makes real sandboxes and remembers what each one was, to check afterwards that it is gone."""

    def __init__(self, cfg, repo):
        self.cfg, self.repo = cfg, repo
        self.made = []

    def __call__(self, repo_dir=None):
        sb = make_sandbox(SandboxSpec(repo_dir=str(repo_dir or self.repo)), self.cfg)
        self.made.append(sb)
        return sb

    def traces(self):
        """(workspace folder, shell pid) of every sandbox that started."""
        out = []
        for sb in self.made:
            if sb.workspace is not None and sb._shell is not None:
                out.append((sb.workspace.folder, sb._shell._shell_pid))
        return out


def _gone(traces) -> bool:
    return all(not folder.exists() and not _alive(pid) for folder, pid in traces)


def test_prefetched_sandboxes_are_started_fresh_and_handed_out_once(cfg, repo):
    rec = Recorder(cfg, repo)
    with Prewarmer(2) as pool:
        assert pool.prefetch("a", rec) and pool.prefetch("a", rec)
        assert not pool.prefetch("b", rec)  # full: at most `capacity` wait
        first = pool.take("a")
        assert first is not None and first.sandbox._shell is not None  # started before it was taken
        first.start()  # idempotent
        assert first.exec("echo agent > left_by_a && cat pkg/__init__.py").exit_code == 0
        second = pool.take("a")
        assert second is not None and second.sandbox is not first.sandbox
        res = second.exec("test -e left_by_a; echo $?")
        assert res.output.strip() == b"1"  # its own copy: nothing the first sandbox wrote
        assert pool.take("a") is None and pool.take("b") is None
        traces = rec.traces()
        assert len(traces) == 2 and all(_alive(pid) for _, pid in traces)
        t = time.monotonic()
        first.stop()
        assert time.monotonic() - t < 0.05  # handed to the reaper, not stopped inline
        first.stop()  # idempotent
        with pytest.raises(SandboxError):
            first.start()
        assert pool.hits == 2 and pool.prefetched == 2
    assert _gone(traces)  # close() waited for the reaper and stopped the one still handed out


def test_a_failed_prefetch_is_dropped_and_the_caller_makes_a_fresh_one(cfg, repo, tmp_path):
    rec = Recorder(cfg, repo)
    with Prewarmer(1) as pool:
        assert pool.prefetch("x", lambda: rec(tmp_path / "missing"))
        assert pool.take("x") is None and pool.failed_starts == 1
        fresh = pool.lease(rec())
        fresh.start()
        assert fresh.exec("true").exit_code == 0
        traces = rec.traces()
    assert _gone(traces)


class Boom(Exception):
    pass


def test_nothing_is_left_running_after_an_error(cfg, repo):
    rec = Recorder(cfg, repo)
    traces = []
    with pytest.raises(Boom), Prewarmer(3) as pool:
        for key in ("a", "b", "c"):
            pool.prefetch(key, rec)
        taken = pool.take("b")
        taken.exec("sleep 3171 &")  # a background process of the agent's
        leased = pool.lease(rec())
        leased.start()
        time.sleep(0.2)  # let the other prefetches get going (started or mid-start)
        traces = rec.traces()
        raise Boom
    assert pool.closed
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not _gone(rec.traces() + traces):
        time.sleep(0.05)
    assert len(rec.made) == 4 and _gone(rec.traces() + traces)
    assert all(sb._stopped and sb.workspace is None and sb._shell is None for sb in rec.made)
    with pytest.raises(SandboxError):
        pool.lease(rec())  # a closed pool hands nothing out (and stops what it was given)
    assert _gone(rec.traces())
    assert not [p for p in os.listdir("/proc") if p.isdigit() and _alive(int(p)) and _is_our_sleep(int(p))]


def _is_our_sleep(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read() == b"sleep\x003171\x00"
    except OSError:
        return False


def test_a_prefetch_still_queued_when_needed_is_cancelled_not_waited_for(cfg, repo):
    """With a thousand episodes in flight the starter threads' queue was minutes long and episodes waited in
    it for their grading sandbox: one not begun is cancelled and the caller starts its own at once."""
    rec, gate = Recorder(cfg, repo), threading.Event()

    def held():
        gate.wait(30)
        return rec()

    with Prewarmer(8) as pool:  # 4 starter threads
        for k in range(4):
            assert pool.prefetch(f"busy{k}", held)
        assert pool.prefetch("queued", rec) and pool.prefetch("dropped", rec)
        t = time.monotonic()
        assert pool.take("queued") is None
        pool.discard("dropped")
        assert time.monotonic() - t < 1 and pool.unstarted == 1 and rec.made == []
        gate.set()
    assert len(rec.made) == 4  # the four begun ones only (close() stopped them)


class Traced:
    """A real sandbox that remembers its workspace and shell once started, and whether it was stopped."""

    def __init__(self, sandbox):
        self.sandbox, self.trace, self.stopped = sandbox, None, False

    def start(self):
        self.sandbox.start()
        self.trace = (self.sandbox.workspace.folder, self.sandbox._shell._shell_pid)

    def stop(self):
        self.sandbox.stop()
        self.stopped = True


def test_discarding_a_prefetch_that_is_starting_returns_at_once_and_stops_it_after(cfg, repo):
    rec, gate, begun, made = Recorder(cfg, repo), threading.Event(), threading.Event(), []

    def held():
        begun.set()
        gate.wait(30)
        made.append(Traced(rec()))
        return made[-1]

    with Prewarmer(2) as pool:
        assert pool.prefetch("a", held) and begun.wait(10)
        t = time.monotonic()
        pool.discard("a")  # the episode will not be graded: it does not wait for this start
        assert time.monotonic() - t < 0.5 and pool.take("a") is None
        gate.set()
    assert len(made) == 1 and made[0].trace is not None and made[0].stopped and _gone([made[0].trace])
