"""The multi-node test cluster (tools/slurm_up.sh --nodes 3): every node its own host and address.

Each node is a slurmd in its own network and UTS namespace, so a job step sees its node's hostname and
address, a server bound on one node is reached from another through that node's name, and 127.0.0.1 is
each node's own. Skipped (with the reason) unless the cluster has at least 3 ready nodes.

Run: tools/slurm_up.sh --nodes 3 && .venv/bin/python -m pytest tests/test_slurm_multinode.py -m slurm -v
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procs import alive

pytestmark = pytest.mark.slurm

PARTITION = "debug"
REPO = Path(__file__).resolve().parents[1]
STATE = Path(os.environ.get("SWE_MEGATRON_SLURM_DIR", "/var/lib/swe-megatron-slurm"))
JOB_TIMEOUT_S = 300  # submit to finish: each job runs in seconds but may queue behind others
READY_STATES = {"idle", "mixed", "allocated", "completing"}
SMALL = ["--cpus-per-task=1", "--mem=256M", "--time=2", f"--partition={PARTITION}"]


def _run(cmd: list[str], timeout: float = 30, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=check)


@pytest.fixture(scope="module")
def nodes() -> dict[str, str]:
    """The cluster's ready nodes: name -> address (sinfo's NodeAddr), at least 3 of them."""
    if shutil.which("sinfo") is None:
        pytest.skip("Slurm is not installed (no `sinfo`); run tools/slurm_up.sh --nodes 3")
    out = _run(["sinfo", "-h", "-N", "-p", PARTITION, "-o", "%n %o %T"], check=False)
    ready = {}
    for line in out.stdout.splitlines():
        name, addr, state = line.split()
        if state.rstrip("*~#!%$@^-") in READY_STATES:
            ready[name] = addr
    if len(ready) < 3:
        pytest.skip(f"needs a cluster of >= 3 ready nodes, found {len(ready)} ({out.stdout.strip() or out.stderr.strip()!r}); "
                    "run tools/slurm_up.sh --nodes 3")  # fmt: skip
    return ready


def _sbatch(tmp_path: Path, script: str, *args: str) -> str:
    """Run `script` with `sbatch --wait`; assert it succeeded and return the job id."""
    path = tmp_path / "job.sh"
    path.write_text("#!/bin/bash\nset -euo pipefail\n" + script)
    cmd = ["sbatch", "--wait", "--parsable", f"--output={tmp_path}/slurm-%j.out", *SMALL, *args, str(path)]
    try:
        proc = _run(cmd, timeout=JOB_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        _run(["scancel", f"--name={path.name}"], check=False)
        pytest.fail(f"`sbatch --wait` did not return within {JOB_TIMEOUT_S} s")
    job_id = proc.stdout.strip().split(";")[0]
    assert job_id.isdigit(), f"sbatch printed no job id: {proc.stdout!r} {proc.stderr!r}"
    log = tmp_path / f"slurm-{job_id}.out"
    out = log.read_text() if log.exists() else ""
    assert proc.returncode == 0, f"job {job_id} failed (rc {proc.returncode}): {proc.stderr}\n{out}"
    return job_id


def _sacct(job_id: str) -> str:
    """The job's 'State|NNodes|NodeList' from accounting, polled until it shows COMPLETED (it lags)."""
    deadline = time.monotonic() + 20
    line = ""
    while time.monotonic() < deadline:
        out = _run(
            ["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State,NNodes,NodeList"], check=False
        ).stdout
        line = out.strip().splitlines()[0] if out.strip() else ""
        if line.startswith("COMPLETED"):
            break
        time.sleep(0.5)
    return line


def test_each_node_has_its_own_hostname_and_address(tmp_path: Path, nodes: dict[str, str]) -> None:
    report = f'{sys.executable} -c "import json, os, socket; h = socket.gethostname(); ' \
             f"print(json.dumps([h, socket.gethostbyname(h), os.environ['SLURMD_NODENAME'], os.listdir('/sys/fs/cgroup')]))\""  # fmt: skip
    job_id = _sbatch(tmp_path, f"srun --ntasks-per-node=1 {report} > {tmp_path}/hosts.jsonl\n",
                     "--nodes=3", "--ntasks-per-node=1")  # fmt: skip
    seen = [json.loads(line) for line in (tmp_path / "hosts.jsonl").read_text().splitlines()]
    assert len(seen) == 3, seen
    # /sys/fs/cgroup is the host's in every step (the sandboxes need it; `ip netns exec` would hide it)
    assert all(cgroups for *_, cgroups in seen), seen
    seen = [entry[:3] for entry in seen]
    names = sorted(h for h, _, _ in seen)
    assert len(set(names)) == 3 and set(names) <= set(nodes), seen  # the step's hostname is its node's name
    assert all(h == slurm_name for h, _, slurm_name in seen), seen
    assert {h: addr for h, addr, _ in seen} == {n: nodes[n] for n in names}  # and its address the node's
    assert len({addr for _, addr, _ in seen}) == 3
    state, n_nodes, node_list = _sacct(job_id).split("|")
    assert (state, n_nodes) == ("COMPLETED", "3"), node_list


SERVER = """
import socket, sys, os
srv = socket.socket()
srv.bind((socket.gethostbyname(socket.gethostname()), 0))  # this node's address, not 0.0.0.0
srv.listen()
srv.settimeout(20)
port_file = sys.argv[1]
with open(port_file + ".tmp", "w") as f:
    f.write(str(srv.getsockname()[1]))
os.replace(port_file + ".tmp", port_file)
conn, peer = srv.accept()
conn.sendall(socket.gethostname().encode())
print("peer", peer[0])
"""

CLIENT = """
import json, os, socket, sys, time
port_file, server_node = sys.argv[1], sys.argv[2]
deadline = time.monotonic() + 20
while not os.path.exists(port_file) and time.monotonic() < deadline:
    time.sleep(0.1)
port = int(open(port_file).read())
try:
    socket.create_connection(("127.0.0.1", port), timeout=5).close()
    loopback = "connected"
except OSError as e:
    loopback = type(e).__name__
with socket.create_connection((server_node, port), timeout=10) as s:
    answer = s.recv(100).decode()
print(json.dumps({"me": socket.gethostname(), "server": server_node, "answer": answer, "loopback": loopback}))
"""


def test_server_on_one_node_is_reached_from_another_by_name(tmp_path: Path, nodes: dict[str, str]) -> None:
    (tmp_path / "server.py").write_text(SERVER)
    (tmp_path / "client.py").write_text(CLIENT)
    port = tmp_path / "port"
    step = "srun --nodes=1 --ntasks=1 --exact"
    _sbatch(tmp_path, f"""
job_nodes=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))
{step} --nodelist=${{job_nodes[0]}} {sys.executable} {tmp_path}/server.py {port} > {tmp_path}/server.out &
{step} --nodelist=${{job_nodes[1]}} {sys.executable} {tmp_path}/client.py {port} ${{job_nodes[0]}} > {tmp_path}/client.out
wait
""", "--nodes=2", "--ntasks=2")  # fmt: skip
    client = json.loads((tmp_path / "client.out").read_text())
    server_node, client_node = client["server"], client["me"]
    assert server_node != client_node and {server_node, client_node} <= set(nodes), client
    assert client["answer"] == server_node  # reached the server on the other node through its name
    assert client["loopback"] == "ConnectionRefusedError"  # 127.0.0.1 is the client node's own
    assert (tmp_path / "server.out").read_text().split() == ["peer", nodes[client_node]]


def test_lost_node_is_killed_whole_and_revived(tmp_path: Path, nodes: dict[str, str]) -> None:
    """tools/slurm_node.sh kill leaves no process of the node (slurmd, job steps); revive runs jobs there again."""
    if os.geteuid() != 0:
        pytest.skip("tools/slurm_node.sh needs root")
    free = [n for n in sorted(nodes) if not _run(["squeue", "-h", "-w", n, "-o", "%i"]).stdout.strip()]
    if not free:
        pytest.skip("every node runs someone's job; killing one would break it")
    node, pid_file = free[-1], tmp_path / "step.pid"
    job_id = _run(["sbatch", "--parsable", f"--nodelist={node}", "--nodes=1", *SMALL,
                   "--wrap", f'srun sh -c "echo \\$\\$ > {pid_file}; exec sleep 120"']).stdout.strip()  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        step_pid = int(pid_file.read_text())
        slurmd_pid = int((STATE / "pids" / f"slurmd-{node}.pid").read_text())
        assert alive(step_pid) and alive(slurmd_pid)
        _run([str(REPO / "tools/slurm_node.sh"), "kill", node])
        assert not alive(step_pid) and not alive(slurmd_pid)
    finally:
        _run(["scancel", job_id], check=False)
    _run([str(REPO / "tools/slurm_node.sh"), "revive", node], timeout=60)
    out = _run(["srun", f"--nodelist={node}", *SMALL, "hostname"], timeout=60)
    assert out.stdout.strip() == node
