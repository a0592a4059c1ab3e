"""`swe-megatron sandbox-server`: serve this node's sandboxes over HTTP to the rollout driver (server.py).

    swe-megatron sandbox-server --host 127.0.0.1 --port 8760 --token-file runs/job/sandbox.token
    SWE_MEGATRON_SANDBOX_TOKEN=... swe-megatron sandbox-server --backend apptainer --config paper-72b

The token (per job, at least 16 characters) comes from --token-file (which must not be readable by other
users) or the SWE_MEGATRON_SANDBOX_TOKEN environment variable. Sandbox settings come from the run config's
`sandbox` section (--config and key=value overrides; defaults without --config); --backend and
--max-concurrent override it. Prints one line `sandbox-server listening on http://HOST:PORT` when ready.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import stat
import sys
from pathlib import Path

from swe_megatron.config.load import load_config
from swe_megatron.config.schema import SandboxBackend, SandboxConfig
from swe_megatron.config.validate import sandbox_problems
from swe_megatron.errors import UsageError
from swe_megatron.net import raise_open_files
from swe_megatron.sandbox.local import REFUSED

TOKEN_ENV = "SWE_MEGATRON_SANDBOX_TOKEN"
"""Environment variable holding the server token when --token-file is not given."""


def _read_token(path: str | None) -> str:
    if path:
        try:
            st = os.stat(path)
            if st.st_mode & stat.S_IROTH:
                raise UsageError(f"token file {path} is readable by other users; chmod 600 it")
            token = Path(path).read_text().strip()
        except OSError as e:
            raise UsageError(f"cannot read token file {path}: {e.strerror}") from None
    else:
        token = os.environ.get(TOKEN_ENV, "").strip()
        if not token:
            raise UsageError(f"no token: give --token-file FILE or set {TOKEN_ENV}")
    if len(token) < 16:
        raise UsageError("the token must be at least 16 characters (e.g. `openssl rand -hex 32`)")
    return token


def _serve(args: argparse.Namespace) -> int:
    from omegaconf import OmegaConf

    # lazy: the server's HTTP stack (sandbox.server, 0.2 s); the CLI imports every command module at start
    from swe_megatron.sandbox.server import SandboxServer

    token = _read_token(args.token_file)
    cfg = SandboxConfig()
    if args.config:
        cfg = OmegaConf.to_object(load_config(args.config, args.overrides).sandbox)
    if args.backend:
        cfg = dataclasses.replace(cfg, backend=SandboxBackend(args.backend))
    if args.max_concurrent is not None:
        cfg = dataclasses.replace(cfg, max_concurrent=args.max_concurrent)
    problems = sandbox_problems(cfg) + (
        [] if 0 <= args.port < 65536 else [f"--port {args.port}: allowed 0..65535"]
    )
    if problems:
        raise UsageError("; ".join(p.replace("sandbox.max_concurrent", "--max-concurrent") for p in problems))
    if cfg.backend == SandboxBackend.local and not cfg.allow_local:
        raise UsageError(REFUSED)
    # per sandbox: its shell's pipes, the cgroup counters kept open, a client connection or two
    raise_open_files(16 * cfg.max_concurrent + 256, f"--max-concurrent {cfg.max_concurrent}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s sandbox-server %(message)s")
    server = SandboxServer(cfg, token)

    def ready(port: int) -> None:
        print(
            f"sandbox-server listening on http://{args.host}:{port} (backend {cfg.backend.value})", flush=True
        )

    asyncio.run(server.serve(args.host, args.port, ready))
    print("sandbox-server stopped; all sandboxes removed", file=sys.stderr, flush=True)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the sandbox-server subcommand."""
    p = sub.add_parser("sandbox-server", help="serve this node's sandboxes over HTTP (one per node)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8760, help="port (0: any free port; default 8760)")
    p.add_argument("--token-file", help=f"file holding the per-job secret token (else ${TOKEN_ENV})")
    p.add_argument("--backend", choices=["bwrap", "apptainer", "local"], help="overrides sandbox.backend")
    p.add_argument("--max-concurrent", type=int, help="overrides sandbox.max_concurrent")
    p.add_argument("--config", help="run preset or YAML whose `sandbox` section to use (default: defaults)")
    p.add_argument(
        "overrides", nargs="*", metavar="key=value", help="overrides of --config, e.g. sandbox.memory_mb=4096"
    )
    p.set_defaults(func=_serve)
