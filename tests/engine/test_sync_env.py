"""Issue 41: the NCCL error-handling mode of weight-sync groups comes from the environment each process starts
with (engine/sync_env.py), never from a write around the group's construction while other threads run; and a
helper thread forming a group that was given up on ends by the join's deadline. Groups here are real gloo ones."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from swe_megatron.config.schema import EngineConfig
from swe_megatron.engine.sync_env import SYNC_ENV
from swe_megatron.engine.vllm_server import server_env
from swe_megatron.engine.weight_receiver import SyncAborted, SyncGroup

CPU = torch.device("cpu")


def test_vllm_servers_start_with_cleanup_only_whatever_the_parent_has(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3")
    env = server_env(EngineConfig(cache_dir=str(tmp_path / "cache")), tmp_path)
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "2"
    assert SYNC_ENV == {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "2"}


def test_the_command_line_sets_it_before_the_command_runs_and_before_any_thread():
    """Every trainer rank runs cli.run (launch/steps.py, torchrun, the console script): a subprocess, so this test
    process's own environment is left alone."""
    probe = (
        "import os, threading, swe_megatron.cli as c\n"
        "def main():\n"
        "    print(os.environ['TORCH_NCCL_ASYNC_ERROR_HANDLING'], threading.active_count())\n"
        "    return 0\n"
        "c.main = main\n"
        "c.run()\n"
    )
    env = {**os.environ, "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["2", "1"]


def _join_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.endswith("-join")]


def test_a_join_given_up_while_gloo_forms_leaves_no_thread_past_its_deadline():
    """A member that never comes: join raises at the deadline, and its helper thread (blocked in gloo's rendezvous,
    which nothing can interrupt) ends with it. Before: the group formed with twice the deadline as its timeout, so
    the helper stayed blocked, holding a store connection, until 2 x the deadline (measured 4.05 s for 2 s; with the
    600 s default, 20 minutes per failed sync)."""
    deadline_s = 2.0
    master = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=30), wait_for_workers=False)
    g = SyncGroup(master, "gone", 0, 2, CPU, deadline_s)
    before = set(_join_threads())
    start = time.monotonic()
    with pytest.raises(SyncAborted, match="joining the group took longer than 2 s"):
        g.join()
    helpers = [t for t in _join_threads() if t not in before]
    assert len(helpers) == 1 and helpers[0].daemon  # a daemon: never holds the process's exit
    helpers[0].join(3 * deadline_s)
    ended_s = time.monotonic() - start
    assert not helpers[0].is_alive()
    assert ended_s < 1.5 * deadline_s, f"the helper ended {ended_s:.2f} s after the join began"


def test_a_formed_group_s_operations_keep_twice_the_deadline():
    """The other half: forming is bounded by the deadline, but the group's collectives still time out only after
    twice it, behind the poll's own deadline (a 2-member group, one thread each)."""
    store = dist.HashStore()
    members = [SyncGroup(store, "ok", r, 2, CPU, 1.5) for r in range(2)]
    errors = []

    def join(g):
        try:
            g.join()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=join, args=(g,)) for g in members]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    assert [g.group.options._timeout for g in members] == [timedelta(seconds=3)] * 2
    for g in members:
        g.close()


def test_an_abort_that_never_returns_holds_its_member_only_for_abort_wait_s(monkeypatch):
    """On one H200 (torch 2.11, NCCL 2.28.9) the abort of a group whose NCCL communicator was still forming had not
    returned after 150 s (tools/gpu_sync_checks.py nccl_abort): the trainer would hang in its failure path. The
    member now waits ABORT_WAIT_S for it, says whether it returned, and goes on; the group stays referenced."""
    from swe_megatron.engine import weight_receiver as wr

    release = threading.Event()

    class StuckGroup:  # stands in for a ProcessGroupNCCL whose abort waits on a communicator that never forms
        def abort(self):
            release.wait()

    monkeypatch.setattr(wr, "ABORT_WAIT_S", 0.5)
    store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=30), wait_for_workers=False)
    g = SyncGroup(store, "stuck", 0, 2, CPU, 5.0)
    g.group = StuckGroup()
    start = time.monotonic()
    g.abort("the peer never came")
    took = time.monotonic() - start
    assert 0.5 <= took < 2.0, took
    assert g.abort_returned is False and g.group in wr._ABORTED
    assert g.aborted() == "rank 0: the peer never came"  # the other members were still told
    stuck = [t for t in threading.enumerate() if t.name == "sync-abort" and t.is_alive()]
    assert stuck and all(t.daemon for t in stuck)  # never holds the process's exit
    release.set()
    h = SyncGroup(store, "fine", 0, 2, CPU, 5.0)
    h.group = type("Quick", (), {"abort": lambda self: None})()
    h.abort("x")
    assert h.abort_returned is True
