"""One live driver per run folder (issue 42 item 1), with real processes: a second `swe-megatron run` in a folder
whose driver is alive is refused with one line and stops nothing of the live run; once the driver is SIGKILLed the
kernel frees the folder and the next owner reaps what the dead driver left."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from swe_megatron.config.load import load_config
from swe_megatron.errors import UsageError
from swe_megatron.pipeline import run_lock
from swe_megatron.pipeline.topology import Topology

ROOT = Path(__file__).resolve().parents[2]

# A stand-in driver: takes the folder's lock as the real driver does (run_lock.RunLock.take), starts a "server" in
# a process group of its own, records it in topology/pids.json the way Topology._record does, then lives on.
DRIVER = textwrap.dedent("""
    import json, subprocess, sys, time
    from pathlib import Path
    from swe_megatron.pipeline.run_lock import RunLock
    from swe_megatron.pipeline.topology import _start_time
    root = Path(sys.argv[1])
    RunLock.take(root)
    server = subprocess.Popen(["sleep", "600"], start_new_session=True)
    (root / "topology").mkdir(exist_ok=True)
    (root / "topology" / "pids.json").write_text(json.dumps([{"pid": server.pid, "start": _start_time(server.pid)}]))
    print(server.pid, flush=True)
    time.sleep(600)
""")


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def live_driver(tmp_path):
    """(run folder, driver process, its server's pid) of a live stand-in driver; everything stopped at the end."""
    run = tmp_path / "run"
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(run)], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    server = int(driver.stdout.readline())
    yield run, driver, server
    driver.kill()
    driver.wait()
    if _group_alive(server):
        os.killpg(server, signal.SIGKILL)


@pytest.mark.e2e  # the real `swe-megatron run` up to its lock (~30 s on 2 cores)
def test_a_second_run_beside_a_live_driver_is_refused_with_one_line_and_stops_nothing(live_driver):
    run, driver, server = live_driver
    env = dict(os.environ, OMP_NUM_THREADS="1")
    second = subprocess.Popen(
        [sys.executable, "-m", "swe_megatron.cli", "run", "embedded", f"run_dir={run}", "monitor.progress=false"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while second.poll() is None and time.monotonic() < deadline:
            # Without the lock the second start reaps pids.json: the live run's server dies at once.
            assert _group_alive(server), "the second start stopped the live run's server"
            time.sleep(0.2)
        out, err = second.communicate(timeout=5)
    finally:
        if second.poll() is None:
            second.kill()
    assert second.returncode == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert (
        f"pid {driver.pid} on host {socket.gethostname()}" in lines[0]
        and f"kill -INT {driver.pid}" in lines[0]
    )
    assert driver.poll() is None and _group_alive(server)
    assert not (run / "config.yaml").exists()  # the refused start wrote nothing of a run
    assert json.loads((run / "driver.json").read_text())["pid"] == driver.pid


def test_a_killed_drivers_folder_is_free_at_once_and_its_leftovers_are_reaped_by_the_next_owner(live_driver):
    run, driver, server = live_driver
    assert run_lock.holder(run)["pid"] == driver.pid
    with pytest.raises(UsageError, match=f"pid {driver.pid}"):
        run_lock.RunLock.take(run, wait_s=0.3)
    driver.kill()
    driver.wait()
    assert _group_alive(server)  # a server the parent-death signal does not reach
    assert run_lock.holder(run) is None  # the kernel dropped the dead driver's lock
    with run_lock.RunLock.take(run, wait_s=0):
        assert run_lock.holder(run)["pid"] == os.getpid()
        cfg = load_config("embedded", [f"run_dir={run}"])
        with Topology(cfg, run / "topology", run / "config.yaml", reap=True):
            deadline = time.monotonic() + 10
            while _group_alive(server) and time.monotonic() < deadline:
                time.sleep(0.05)  # killpg is sent; the zombie is reaped by init once the group has died
            assert not _group_alive(server)
    assert run_lock.holder(run) is None


def test_the_lock_is_not_inherited_by_servers_the_driver_starts(tmp_path):
    """A server started by the driver (exec) must not keep the folder locked after the driver dies."""
    script = textwrap.dedent("""
        import subprocess, sys
        from swe_megatron.pipeline.run_lock import RunLock
        RunLock.take(sys.argv[1])
        child = subprocess.Popen(["sleep", "600"], start_new_session=True, close_fds=False,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        print(child.pid, flush=True)
    """)
    out = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, cwd=ROOT
    )
    child = int(out.stdout)
    try:
        assert _group_alive(child) and run_lock.holder(tmp_path) is None
    finally:
        os.killpg(child, signal.SIGKILL)


@pytest.mark.dist
def test_with_two_ranks_rank_zero_refuses_and_rank_one_adds_one_line(live_driver):
    """The multi-rank start (srun's or torchrun's environment, issue 42 item 3): only rank 0 owns the folder, so
    only it meets the lock; rank 1 learns of the failure through spmd's broadcast and says so in one line, not a
    traceback."""
    from swe_megatron.net import free_port

    run, driver, server = live_driver
    base = dict(
        os.environ, OMP_NUM_THREADS="1", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port())
    )
    argv = [sys.executable, "-m", "swe_megatron.cli", "run", "embedded", f"run_dir={run}", "parallel.world_size=2",
            "parallel.tensor_parallel=2", "model.num_key_value_heads=2", "monitor.progress=false"]  # fmt: skip
    ranks = [
        subprocess.Popen(
            argv,
            cwd=ROOT,
            env=dict(base, RANK=str(r), LOCAL_RANK=str(r)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for r in (0, 1)
    ]
    try:
        (out0, err0), (out1, err1) = (p.communicate(timeout=300) for p in ranks)
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
    assert ranks[0].returncode == 2 and err0.count("\n") == 1 and f"pid {driver.pid}" in err0, err0
    assert ranks[1].returncode == 1, err1
    assert err1 == "swe-megatron run: rank 1 stops because rank 0 failed (rank 0 says why)\n", err1
    assert _group_alive(server) and driver.poll() is None
