"""The job steps slurm/common.sh starts (`swe-megatron job-step [OPTIONS] ROLE [CONFIG key=value ...]`).

    init            (batch script) check the allocation against the config, make the job folder and token,
                    print the layout as shell assignments
    sandbox-server  (one task per node) run `swe-megatron sandbox-server` on this node, publish its URL
    engine          (one task per vLLM server) run a vLLM server on this task's GPUs, publish its URL
    wait            (batch script) wait for every server's entry, write JOB_DIR/rendezvous.json
    trainer         (parallel.world_size tasks) torch.distributed env from Slurm, then `swe-megatron run`

Stopping: Slurm's USR2 (time limit near, or `scancel --signal=USR2`) reaches every step. Servers ignore it.
The trainer step's rank 0 asks the run to stop after the iteration in flight commits (RUN_DIR/STOP), gives
it up to cluster.signal_delay_s - 60 s, then sends SIGTERM (the uncommitted iteration is redone on resume),
and exits with EXIT_RESUMABLE so the batch script requeues the job.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from swe_megatron.config.load import load_config
from swe_megatron.launch import rendezvous
from swe_megatron.launch.layout import job_layout
from swe_megatron.launch.slurm_env import SlurmEnv
from swe_megatron.net import server_port

EXIT_RESUMABLE = 75
"""Exit status of a trainer step stopped before the end of its schedule (the job should be requeued)."""
STOP_FILE = "STOP"
"""RUN_DIR/STOP asks the run to stop after the iteration in flight commits (removed when a step starts)."""
ALLOCATOR_CONF = "expandable_segments:True"
"""The trainer ranks' CUDA caching allocator settings, as PYTORCH_ALLOC_CONF (torch >= 2.9's name; the older
PYTORCH_CUDA_ALLOC_CONF is still read, with a deprecation warning: c10/core/AllocatorConfig.cpp). Segments grow
in place instead of leaving blocks sized for one micro-batch's shapes behind, so packed micro-batches of varying
length do not fragment the memory the plan counts on. A site's own setting (either name) wins. vLLM 0.33.0
objects to it only beside a KV connector (vllm/config/vllm.py), which the engines do not use."""


def _cli() -> list[str]:
    return [sys.executable, "-m", "swe_megatron.cli"]


def init(config: str, overrides: list[str], environ=None) -> str:
    """Shell assignments of the job's layout; creates JOB_DIR with a fresh token (see layout.py)."""
    env = SlurmEnv.from_environ(environ)
    cfg = load_config(config, overrides)
    # the allocation's real CPUs per node (an --exclusive job gets all of them), else cluster.cpus_per_node
    lay = job_layout(cfg, env.hostnames, env.job_id, min(env.job_cpus_per_node, default=None))
    rendezvous.init_job_dir(lay.job_dir)
    Path(lay.job_dir, "logs").mkdir(mode=0o700, exist_ok=True)
    Path(lay.log_dir).mkdir(parents=True, exist_ok=True)
    return lay.shell() + (
        f"STARTUP_TIMEOUT_S={int(cfg.cluster.startup_timeout_s)}\nSIGNAL_DELAY_S={cfg.cluster.signal_delay_s}\n"
    )


class _Child:
    """A server subprocess that stops with this step: SIGTERM/SIGINT are passed on, USR2 is ignored."""

    def __init__(self, argv: list[str], log: Path, env: dict[str, str] | None = None):
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # inherited: a preemption notice is not for servers
        self.log = log
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
            )
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._forward)

    def _forward(self, signum, frame) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signum)

    def tail(self, n: int = 20) -> str:
        """Last lines of its log."""
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def wait(self) -> int:
        """Wait for the child (through signals); its exit status, 128+N when killed by signal N."""
        while True:
            try:
                rc = self.proc.wait()
                return rc if rc >= 0 else 128 - rc
            except InterruptedError:  # pragma: no cover - PEP 475 retries for us
                continue


def sandbox_server(job_dir: str, config: str, overrides: list[str], port: int = 0, environ=None) -> int:
    """Run this node's sandbox server and publish its URL as sandbox entry SLURM_PROCID; returns its status."""
    env = SlurmEnv.from_environ(environ)
    job = Path(job_dir)
    host = env.hostname
    log = job / "logs" / f"sandbox-{env.rank}-{host}.log"
    argv = [*_cli(), "sandbox-server", "--host", host, "--port", str(port), "--token-file",
            str(job / rendezvous.TOKEN_FILE), "--config", config, *overrides]  # fmt: skip
    # The log is appended to across restarts of the job (a requeue keeps SLURM_JOB_ID): only what this start
    # writes counts, or an earlier start's address would be published.
    start = log.stat().st_size if log.exists() else 0
    child = _Child(argv, log)
    deadline = time.monotonic() + 300
    url = None
    while url is None:
        m = re.search(r"sandbox-server listening on (http://\S+)", _read(log, start))
        if m:
            url = m.group(1)
        elif child.proc.poll() is not None:
            print(
                f"sandbox server on {host} exited ({child.proc.returncode}):\n{child.tail()}", file=sys.stderr
            )
            return child.wait() or 1
        elif time.monotonic() > deadline:
            child.proc.terminate()
            print(f"sandbox server on {host} did not start in 300 s:\n{child.tail()}", file=sys.stderr)
            return 1
        else:
            time.sleep(0.2)
    rendezvous.publish(job, "sandbox", env.rank, url, host, child.proc.pid)
    print(f"sandbox server {env.rank} on {url}", flush=True)
    return child.wait()


def engine(job_dir: str, config: str, overrides: list[str], stage: str, environ=None) -> int:
    """Run one vLLM server (engine entry SLURM_PROCID) on this task's GPUs; returns its status."""
    # lazy: torch, transformers (engine.vllm_server); the other steps run without them
    from swe_megatron.engine.vllm_server import engine_model_dir, server_command, server_env, wait_serving

    env = SlurmEnv.from_environ(environ)
    cfg = load_config(config, overrides)
    job = Path(job_dir)
    work = job / "engines" / f"engine{env.rank}"
    work.mkdir(parents=True, exist_ok=True)
    # model.hf_path's weights (a null one: the tiny random weights the run initialises from) with the trainer's
    # config.json, so the server has the trainer's rope scaling before the run reloads its weights.
    model_dir = str(engine_model_dir(cfg.model, work / "model", seed=cfg.seed))
    port = server_port(cfg.engine.port, env.local_rank)  # the real port is what the rendezvous publishes
    context = (
        getattr(cfg, stage).context_length
        if stage
        else max(cfg.stage2.context_length, cfg.eval.context_length)
    )
    argv = server_command(model_dir, port, cfg.engine, context, "policy")
    argv[argv.index("--host") + 1] = env.hostname  # reachable from the trainer's node, not only localhost
    child = _Child(argv, work / "vllm.log", server_env(cfg.engine, work))
    url = f"http://{env.hostname}:{port}"
    why = wait_serving(url, child.proc, model_dir, cfg.cluster.startup_timeout_s)
    if why is not None:
        print(f"vLLM server {url} {why}:\n{child.tail()}", file=sys.stderr)
        if child.proc.poll() is not None:
            return child.wait() or 1
        child.proc.terminate()
        return 1
    rendezvous.publish(job, "engine", env.rank, url, env.hostname, child.proc.pid)
    print(f"engine {env.rank} on {url}", flush=True)
    return child.wait()


def _read(path: Path, offset: int = 0) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def wait(job_dir: str, engines: int, sandboxes: int, timeout_s: float, watch: list[int], environ=None) -> int:
    """Wait for the servers' entries (failing at once when a watched server step exits); writes the merged file."""
    env = SlurmEnv.from_environ(environ)

    def alive() -> str | None:
        for pid in watch:
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # not our child (the batch shell started it): look at /proc
                done, _status = (0 if Path(f"/proc/{pid}").exists() else pid), 0
            if done:
                return f"server step (pid {pid}) exited before publishing its address; see {job_dir}/logs"
        return None

    rv = rendezvous.wait(job_dir, env.job_id, {"engine": engines, "sandbox": sandboxes}, timeout_s, alive)
    print(f"rendezvous: {len(rv.engines)} engine(s), {len(rv.sandbox_servers)} sandbox server(s)", flush=True)
    return 0


def trainer_env(environ, env: SlurmEnv) -> dict[str, str]:
    """The environment of a trainer rank's run: environ, torch.distributed's variables from Slurm, and the
    allocator settings (ALLOCATOR_CONF) unless environ sets its own."""
    out = {**environ, **env.torch_env()}
    if "PYTORCH_ALLOC_CONF" not in out and "PYTORCH_CUDA_ALLOC_CONF" not in out:
        out["PYTORCH_ALLOC_CONF"] = ALLOCATOR_CONF
    return out


def trainer(run_dir: str, config: str, overrides: list[str], grace_s: float, environ=None) -> int:
    """One trainer rank: torch.distributed env from Slurm, then `swe-megatron run`; handles USR2 (see module doc)."""
    env = SlurmEnv.from_environ(environ)
    stop_file = Path(run_dir) / STOP_FILE
    if env.rank == 0:
        stop_file.unlink(missing_ok=True)
    child_env = trainer_env(os.environ, env)
    print(f"trainer rank {env.rank} of {env.world_size} on {env.hostname} (master {child_env['MASTER_ADDR']})",
          flush=True)  # fmt: skip
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # the run learns of a stop through STOP_FILE or SIGTERM
    proc = subprocess.Popen([*_cli(), "run", config, *overrides], env=child_env)
    stop = {"at": None}

    def on_usr2(signum, frame) -> None:
        if stop["at"] is None:
            stop["at"] = time.monotonic()
            if env.rank == 0:
                stop_file.parent.mkdir(parents=True, exist_ok=True)
                stop_file.write_text(f"USR2 at {time.ctime()}\n")
                print(f"trainer: stop requested; SIGTERM in {grace_s:.0f} s unless the run stops", flush=True)

    signal.signal(signal.SIGUSR2, on_usr2)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, f: proc.poll() is None and proc.send_signal(s))
    while proc.poll() is None:
        if stop["at"] is not None and time.monotonic() - stop["at"] > grace_s:
            proc.terminate()
            stop["at"] = float("inf")  # once
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=0.5)
    rc = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
    if stop["at"] is not None and rc != 0:
        print(f"trainer: run stopped (status {rc}); it resumes from its last complete iteration", flush=True)
        return EXIT_RESUMABLE
    return rc
