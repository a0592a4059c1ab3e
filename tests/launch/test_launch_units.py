"""Unit tests of launch/: Slurm environment, node layout, rendezvous files, submitit parameters."""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys

import pytest

from swe_megatron.config.load import load_config
from swe_megatron.launch import rendezvous
from swe_megatron.launch.layout import job_layout
from swe_megatron.launch.slurm_env import LaunchError, SlurmEnv, expand_nodelist


@pytest.mark.parametrize(
    "nodelist, hosts",
    [
        ("vm", ["vm"]),
        ("gpu[01-03,07]", ["gpu01", "gpu02", "gpu03", "gpu07"]),
        ("a[8-10],login1", ["a8", "a9", "a10", "login1"]),
        ("n[1-2]-ib,x", ["n1-ib", "n2-ib", "x"]),
    ],
)
def test_expand_nodelist(nodelist, hosts):
    assert expand_nodelist(nodelist) == hosts


def test_slurm_env_reads_the_job_and_step():
    """A task on gpu03, the first node of a step on gpu[03-04]: SLURM_NODEID is step-relative (0)."""
    env = SlurmEnv.from_environ({
        "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "gpu[01-04]", "SLURM_STEP_NODELIST": "gpu[03-04]",
        "SLURM_NODEID": "0", "SLURM_PROCID": "9", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1",
        "SLURM_TASKS_PER_NODE": "8(x2)", "SLURM_RESTART_COUNT": "3",
    })  # fmt: skip
    assert env.hostnames == ("gpu01", "gpu02", "gpu03", "gpu04") and env.hostname == "gpu03"
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size, env.restart_count) == (
        9,
        16,
        1,
        8,
        3,
    )
    t = env.torch_env(master_port=29500)
    assert t == {"MASTER_ADDR": "gpu03", "MASTER_PORT": "29500", "RANK": "9", "WORLD_SIZE": "16",
                 "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "8"}  # fmt: skip
    assert 20000 <= env.master_port() < 40000


def test_slurm_env_outside_a_job_is_a_clear_error():
    with pytest.raises(LaunchError, match="not inside a Slurm job"):
        SlurmEnv.from_environ({})
    assert SlurmEnv.detect({}) is None


def test_paper_layout_splits_trainer_and_engine_nodes(tmp_path):
    cfg = load_config("paper-72b", [f"run_dir={tmp_path}/run"])
    hosts = [f"gpu{i:02d}" for i in range(16)]
    lay = job_layout(cfg, hosts, "77")
    assert lay.trainer_nodes == tuple(hosts[:8]) and lay.engine_nodes == tuple(hosts[8:])
    assert (lay.trainer_tasks, lay.trainer_tasks_per_node) == (64, 8)
    assert (lay.engines, lay.engines_per_node, lay.gpus_per_engine) == (16, 2, 4)
    assert lay.job_dir == f"{tmp_path}/run/jobs/77"
    shell = lay.shell()
    assert "TRAINER_NODES=gpu00,gpu01,gpu02,gpu03,gpu04,gpu05,gpu06,gpu07\n" in shell
    assert "N_ENGINES=16\n" in shell


def test_layout_errors_name_the_fix(tmp_path):
    cfg = load_config("paper-72b", [f"run_dir={tmp_path}"])
    with pytest.raises(LaunchError, match=r"sbatch --nodes=16"):
        job_layout(cfg, ["a", "b"], "1")
    cfg = load_config("paper-72b", [f"run_dir={tmp_path}", "engine.num_servers=17"])
    with pytest.raises(LaunchError, match="engine.num_servers=17"):
        job_layout(cfg, [f"n{i}" for i in range(16)], "1")
    cfg = load_config("embedded", [f"run_dir={tmp_path}"])
    lay = job_layout(cfg, ["vm"], "5")
    assert lay.engines == 0 and lay.engine_nodes == () and lay.trainer_tasks == 1


def test_rendezvous_roundtrip_is_private(tmp_path):
    job = tmp_path / "job"
    token_file = rendezvous.init_job_dir(job)
    assert stat.S_IMODE(os.stat(job).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
    rendezvous.publish(job, "sandbox", 0, "http://n1:8760", "n1")
    rendezvous.publish(job, "engine", 1, "http://n2:8101", "n2")
    rendezvous.publish(job, "engine", 0, "http://n2:8100", "n2")
    rv = rendezvous.wait(job, "9", {"engine": 2, "sandbox": 1}, timeout_s=5)
    assert rv.engines == ("http://n2:8100", "http://n2:8101") and rv.sandbox_servers == ("http://n1:8760",)
    merged = job / rendezvous.MERGED
    assert stat.S_IMODE(os.stat(merged).st_mode) == 0o600
    back = rendezvous.load(merged)
    assert back == rv and len(back.token) == 64
    assert not [p for p in job.rglob("*") if p.name.endswith(".tmp")]
    # a restart of the job clears the old entries and changes the token
    old = back.token
    rendezvous.init_job_dir(job)
    assert rendezvous.entries(job) == {"engine": {}, "sandbox": {}} and not merged.exists()
    assert rendezvous.read_token(token_file) != old


def test_rendezvous_refuses_readable_files_and_reports_missing_servers(tmp_path):
    job = tmp_path / "job"
    token_file = rendezvous.init_job_dir(job)
    os.chmod(token_file, 0o644)
    with pytest.raises(rendezvous.RendezvousError, match="chmod 600"):
        rendezvous.read_token(token_file)
    with pytest.raises(rendezvous.RendezvousError, match=r"missing sandbox \[1\]"):
        rendezvous.publish(job, "sandbox", 0, "http://a:1", "a")
        rendezvous.wait(job, "1", {"sandbox": 2}, timeout_s=0.3, poll_s=0.05)
    with pytest.raises(rendezvous.RendezvousError, match="server step .* died"):
        rendezvous.wait(job, "1", {"sandbox": 2}, timeout_s=30, alive=lambda: "server step 12 died")
    with pytest.raises(rendezvous.RendezvousError, match="cluster.rendezvous"):
        rendezvous.load(tmp_path / "nope.json")


@pytest.mark.skipif(shutil.which("srun") is None, reason="submitit's Slurm executor needs srun on PATH")
def test_executor_parameters_come_from_the_cluster_config(tmp_path):
    from swe_megatron.launch.submit import PipelineJob, make_executor

    cfg = load_config("paper-72b", ["cluster.partition=gpu", "cluster.account=proj", "cluster.qos=high"])
    ex = make_executor(cfg, "slurm", tmp_path)
    p = ex._executor.parameters
    assert (p["nodes"], p["gpus_per_node"], p["cpus_per_task"], p["mem"]) == (16, 8, 32, "960GB")
    assert (p["partition"], p["account"], p["time"]) == ("gpu", "proj", 2880)
    assert (
        p["signal_delay_s"] == 600 and p["qos"] == "high" and p["additional_parameters"] == {"requeue": True}
    )
    assert ex._executor.max_num_timeout == 3
    job = PipelineJob("paper-72b", ["a=1"], repo="/repo")
    assert job.command(True) == ["bash", "/repo/slurm/common.sh", "paper-72b", "a=1"]
    assert job.command(False)[-3:] == ["run", "paper-72b", "a=1"]
    state = job.__getstate__()
    assert "_proc" not in state and json.dumps(state)


def test_checkpoint_asks_the_run_to_stop_through_run_dir_stop(tmp_path, monkeypatch):
    """Locally checkpoint() writes RUN_DIR/STOP, waits for the run to exit by itself (grace), requeues."""
    import subprocess
    import sys
    import threading
    import time

    from swe_megatron.launch.submit import PipelineJob

    for k in ("SLURM_JOB_ID", "SLURM_PROCID", "SLURM_NODEID", "SLURM_JOB_NODELIST", "SLURM_NTASKS"):
        monkeypatch.delenv(k, raising=False)
    stop = tmp_path / "STOP"
    job = PipelineJob("embedded", [f"run_dir={tmp_path}"], repo=str(tmp_path), grace_s=30)
    assert job.stop_file == stop
    # a stand-in run: exits 75 once STOP appears (as the driver does after its unit commits)
    code = f"import os,sys,time\nwhile not os.path.exists({str(stop)!r}): time.sleep(0.05)\nsys.exit(75)"
    job._proc = proc = subprocess.Popen([sys.executable, "-c", code])
    threading.Thread(target=lambda: setattr(job, "_rc", proc.wait()), daemon=True).start()
    t = time.monotonic()
    again = job.checkpoint()
    assert job._rc == 75 and stop.exists() and time.monotonic() - t < 20  # stopped by itself, not SIGTERM
    assert again.function.grace_s == 30 and again.function.stop_file == stop
    assert PipelineJob("c", ["a=1"]).stop_file is None


def test_sandbox_step_publishes_this_starts_address_not_an_earlier_one(tmp_path, monkeypatch):
    """A requeued job keeps its id, so the server log already holds the previous start's address."""
    from swe_megatron.launch import steps

    job = tmp_path / "job"
    rendezvous.init_job_dir(job)
    (job / "logs").mkdir()
    (job / "logs" / "sandbox-0-vm.log").write_text("sandbox-server listening on http://vm:1111\n")
    # test fake at the process boundary: a "server" that announces its address after a moment, then exits
    fake = "import time; time.sleep(1); print('sandbox-server listening on http://vm:2222', flush=True)"
    monkeypatch.setattr(steps, "_cli", lambda: [sys.executable, "-c", fake])
    environ = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "vm", "SLURM_NODEID": "0", "SLURM_PROCID": "0",
               "SLURM_NTASKS": "1", "SLURM_LOCALID": "0", "SLURM_TASKS_PER_NODE": "1"}  # fmt: skip
    assert steps.sandbox_server(str(job), "embedded", [], environ=environ) == 0
    assert rendezvous.entries(job)["sandbox"][0]["url"] == "http://vm:2222"


@pytest.mark.parametrize("cluster", ["local", "slurm"])
def test_launch_names_squeue_only_for_a_slurm_job(tmp_path, capsys, monkeypatch, cluster):
    """Issue 42 item 10: `launch --cluster local` printed `squeue -j PID` for a job Slurm never saw.
    submitit's submission is the boundary faked here; the config, folders and printing are the real ones."""
    import submitit

    from swe_megatron.cli import main

    stdout = tmp_path / "run/slurm/4242/4242_0_log.out"
    job = type(
        "Job", (), {"job_id": "4242", "paths": type("Paths", (), {"stdout": stdout, "stderr": stdout})}
    )
    monkeypatch.setattr(submitit.AutoExecutor, "submit", lambda self, fn: job)
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")  # sbatch "present" for slurm
    assert main(["launch", "embedded", "--cluster", cluster, f"run_dir={tmp_path / 'run'}"]) == 0
    out = capsys.readouterr().out
    assert f"tail -f {stdout}" in out
    assert ("squeue -j 4242" in out) == (cluster == "slurm"), out
