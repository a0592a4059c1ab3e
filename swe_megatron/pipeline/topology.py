"""The topology of a run: vLLM server(s) and sandbox server(s), owned by trainer rank 0.

Locally, `Topology` starts a sandbox server and the vLLM server(s) itself and owns them: it stops all of them on
exit, on Ctrl-C and on SIGTERM (the signal handlers stop the servers first, so in-flight episodes fail fast
instead of running to their turn limit). Children get PR_SET_PDEATHSIG, so they also die when the driver is
SIGKILLed; their process groups are recorded in RUN/topology/pids.json as well, and the next start in the same
run directory reaps any that survived (a vLLM server forks its engine core, which a parent-death signal does
not reach). Only a driver that holds the run folder's lock reaps (reap=True; pipeline/run_lock.py): a second
start beside a live run is refused before it gets here, so it never stops the live run's servers.

In a Slurm job (cfg.cluster.rendezvous set, see launch/rendezvous.py) it starts no server: it connects to every
sandbox server and every engine the rendezvous lists, owns none of their processes (the job steps do), and
closes only its own sessions. Engines listed there reload the run's current weights (the last checkpoint's HF
export) from the shared filesystem when connected, as local engines start from it; after every update they
get the weights as engine.weight_sync says (train/weight_sync.py: reload of the export, or broadcast). A rendezvous without engines (cluster.engine_nodes
= 0) leaves the engines to this process, as locally. Episodes are spread over the servers and dead servers are
taken out of rotation by rollout/routing.py.

Only trainer rank 0 has a Topology; the other ranks get `NullTopology` (no servers, no engine) and wait for
rank 0's batches (pipeline/spmd.py). The trainer's process groups are not part of it (spmd.start).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path

from swe_megatron.agent.tokens import ChatFormat
from swe_megatron.engine.base import EngineError
from swe_megatron.engine.vllm_server import VllmServer, engine_model_dir
from swe_megatron.errors import stop_on_signal
from swe_megatron.launch import rendezvous
from swe_megatron.model.tokenizer import load_tokenizer
from swe_megatron.net import free_port, server_port, wait_healthy
from swe_megatron.procfs import die_with_parent, proc_stat
from swe_megatron.rollout.routing import RoutedEngine, SandboxPool, policy_engine, run_sandboxes


def _start_time(pid: int) -> str | None:
    st = proc_stat(pid)
    return None if st is None else str(st.start_time)  # pids.json keeps it as a string


def reap_stale(pid_file: Path) -> int:
    """Kill the process groups a previous driver recorded in pid_file if any of their processes still run;
    returns how many groups were signalled.

    A group outlives its leader: a vLLM server killed by its parent-death signal leaves its engine core
    running in the server's group. Linux does not reuse a number while a process group still holds it, so a
    group found under a dead leader's pid is that leader's; only a live leader with another start time means
    the number now names an unrelated process.
    """
    try:
        entries = json.loads(pid_file.read_text())
    except (OSError, json.JSONDecodeError):
        return 0
    killed = 0
    for e in entries:
        started = _start_time(e["pid"])
        if started is not None and started != e["start"]:
            continue
        try:
            os.killpg(e["pid"], signal.SIGKILL)
            killed += 1
        except ProcessLookupError:
            pass
    pid_file.unlink(missing_ok=True)
    return killed


class NullTopology:
    """The topology as ranks other than 0 see it: no servers and no engine (rank 0 owns them; see spmd.py)."""

    engine = None
    sandboxes = None

    def __enter__(self) -> NullTopology:
        return self

    def __exit__(self, *exc) -> None:
        pass


class Topology:
    """The engines and sandbox servers of one run (a context manager; see the module docstring)."""

    def __init__(self, cfg, work_dir: Path, config_file: Path, reap: bool = False):
        self.cfg = cfg
        self.reap = reap
        """Whether to stop the servers an earlier process recorded in pids.json: only for a caller that holds
        the folder's lock (pipeline/run_lock.py), which proves that process is dead."""
        self.work_dir = Path(work_dir)
        self.config_file = config_file
        self.pid_file = self.work_dir / "pids.json"
        self.servers: list[VllmServer] = []
        self.sandbox_proc: subprocess.Popen | None = None
        self.sandboxes: SandboxPool | None = None
        """The sandbox servers (a sandbox factory: `sandboxes.sandbox(spec)`)."""
        self.engine: RoutedEngine | None = None
        """The vLLM servers behind one Engine."""
        self.chat = None
        """The ChatFormat of model.tokenizer the engines stop on (its eos), made by start_engines; the run's
        rollouts reuse it."""
        self.rendezvous: rendezvous.Rendezvous | None = None
        """The Slurm job's servers (cfg.cluster.rendezvous), or None: this process starts its own."""
        self._old_handlers: dict[int, object] = {}

    # lifecycle --------------------------------------------------------------------------------------
    def __enter__(self) -> Topology:
        if self.cfg.cluster.rendezvous:
            self.rendezvous = rendezvous.load(self.cfg.cluster.rendezvous)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        n = reap_stale(self.pid_file) if self.reap else 0
        if n:
            print(f"topology: stopped {n} process group(s) left by a killed earlier driver", file=sys.stderr)
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._old_handlers[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, *exc) -> None:
        self.stop_all()
        for sig, h in self._old_handlers.items():
            signal.signal(sig, h)

    def _on_signal(self, signum, frame) -> None:
        logging.disable(
            logging.WARNING
        )  # stopping the servers fails the episodes in flight: no warning storm
        self.stop_all()
        stop_on_signal(signum, frame)

    def _record(self) -> None:
        procs = [s.proc for s in self.servers if s.proc] + ([self.sandbox_proc] if self.sandbox_proc else [])
        entries = [{"pid": p.pid, "start": _start_time(p.pid)} for p in procs if p.poll() is None]
        self.pid_file.write_text(json.dumps(entries))

    def stop_all(self) -> None:
        """Stop the servers this process started and close its sessions with the others (idempotent, safe
        from a signal handler)."""
        if self.sandboxes is not None:
            with contextlib.suppress(Exception):  # best effort while shutting down
                self.sandboxes.close()
            self.sandboxes = None
        self.stop_engines()
        p, self.sandbox_proc = self.sandbox_proc, None
        if p is not None and p.poll() is None:
            p.terminate()
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self._record()

    # engines ----------------------------------------------------------------------------------------
    def start_engines(self, model_dir: str, max_model_len: int) -> RoutedEngine:
        """An Engine over the vLLM server(s) serving model_dir (reused across stages): the rendezvous' engines,
        told to reload model_dir, or local servers started on it."""
        ecfg = self.cfg.engine
        self.chat = ChatFormat(load_tokenizer(self.cfg.model.tokenizer))
        if self.rendezvous is not None and self.rendezvous.engines:
            urls = list(self.rendezvous.engines)
            self.engine = policy_engine(self.cfg, urls, self.chat.eos_id)
            self.engine.reload_weights(model_dir)  # they started on model.hf_path; serve this run's policy
            print(f"topology: {len(self.engine.urls)} vLLM server(s) of job {self.rendezvous.job_id}, serving "
                  f"{model_dir}", file=sys.stderr, flush=True)  # fmt: skip
            return self.engine
        # The trainer's config.json (rope scaling), whatever folder the weights come from.
        served = str(engine_model_dir(self.cfg.model, self.work_dir / "model", model_dir))
        self.servers = [
            VllmServer(served, server_port(ecfg.port, i), ecfg, self.work_dir / f"vllm{i}", max_model_len)
            for i in range(ecfg.num_servers)
        ]
        for s in self.servers:
            s.start()
        self._record()
        for s in self.servers:
            s.wait_healthy(timeout_s=600)
        self.engine = policy_engine(self.cfg, [s.url for s in self.servers], self.chat.eos_id)
        return self.engine

    def stop_engines(self) -> None:
        """Stop the vLLM servers this process started (e.g. before restarting them with a longer context)."""
        for s in self.servers:
            s.stop(grace_s=10)
        self.servers, self.engine = [], None

    # sandboxes --------------------------------------------------------------------------------------
    def start_sandbox_server(self) -> SandboxPool:
        """Sessions with the rendezvous' sandbox servers, or with a sandbox server subprocess started here."""
        if self.rendezvous is not None and self.rendezvous.sandbox_servers:
            rv = self.rendezvous
            self.sandboxes = run_sandboxes(self.cfg, rv.sandbox_servers, rv.token)
            print(f"topology: {len(self.sandboxes.rotation.live)} sandbox server(s) of job {rv.job_id}",
                  file=sys.stderr, flush=True)  # fmt: skip
            return self.sandboxes
        token = secrets.token_hex(24)
        token_file = self.work_dir / "sandbox.token"
        token_file.write_text(token)
        token_file.chmod(0o600)
        port = free_port()
        log = open(self.work_dir / "sandbox-server.log", "ab")  # noqa: SIM115 - the child owns it
        cmd = [sys.executable, "-m", "swe_megatron.cli", "sandbox-server", "--port", str(port),
               "--token-file", str(token_file), "--config", str(self.config_file)]  # fmt: skip
        self.sandbox_proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent
        )
        log.close()
        self._record()
        url = f"http://127.0.0.1:{port}"
        print(f"topology: starting sandbox server on {url} (log: {self.work_dir / 'sandbox-server.log'})",
              file=sys.stderr, flush=True)  # fmt: skip
        auth = {"Authorization": f"Bearer {token}"}
        why = wait_healthy(url, self.sandbox_proc, 120, "/v1/health", auth, interval_s=0.5)
        if why is not None:
            tail = (self.work_dir / "sandbox-server.log").read_text(errors="replace")[-2000:]
            raise EngineError(f"sandbox server on {url} {why}:\n{tail}")
        print(f"topology: sandbox server on {url} ready", file=sys.stderr, flush=True)
        self.sandboxes = run_sandboxes(self.cfg, [url], token)
        return self.sandboxes
