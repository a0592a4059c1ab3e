"""Sandboxes where agent commands and grading run: `make_sandbox(spec, cfg)` picks the backend by name.

    from swe_megatron.sandbox import SandboxSpec, make_sandbox
    with make_sandbox(SandboxSpec(repo_dir="data/tasks/x/repo", env_dir="data/envs/x"), cfg.sandbox) as sb:
        sb.exec("cd src && python -m pytest -q", timeout_s=60)

A sandbox on another node is reached through `SandboxClient(url, token).sandbox(spec)` (client.py),
served by `swe-megatron sandbox-server` (server.py).
"""

from __future__ import annotations

import importlib

from swe_megatron.config import ConfigError
from swe_megatron.sandbox.base import ExecResult, Sandbox, SandboxError, SandboxSpec

BACKENDS = {
    "bwrap": "swe_megatron.sandbox.bwrap.BwrapSandbox",
    "apptainer": "swe_megatron.sandbox.apptainer.ApptainerSandbox",
    "local": "swe_megatron.sandbox.local.LocalSandbox",
}
"""Backend name (sandbox.backend) -> class implementing the Sandbox protocol."""


def backend_class(name) -> type:
    """The class registered for a backend name (a str or the SandboxBackend enum)."""
    key = getattr(name, "value", name)
    if key not in BACKENDS:
        raise ConfigError(f"sandbox.backend={key!r} is unknown; allowed: {', '.join(BACKENDS)}")
    module, _, cls = BACKENDS[key].rpartition(".")
    return getattr(importlib.import_module(module), cls)


def check_host(cfg) -> None:
    """SandboxError naming the fix when this machine lacks the tools of backend cfg.backend (checked before
    any work starts, instead of one failed sandbox per task)."""
    key = getattr(cfg.backend, "value", cfg.backend)
    if key == "bwrap":
        from swe_megatron.sandbox.bwrap import require_tools

        require_tools()
    elif key == "apptainer":
        from swe_megatron.sandbox.apptainer import find_apptainer

        find_apptainer()


def make_sandbox(spec: SandboxSpec, cfg) -> Sandbox:
    """A new, not yet started sandbox of the backend cfg.backend (cfg: a SandboxConfig)."""
    return backend_class(cfg.backend)(spec, cfg)


__all__ = [
    "BACKENDS",
    "ExecResult",
    "Sandbox",
    "SandboxError",
    "SandboxSpec",
    "backend_class",
    "check_host",
    "make_sandbox",
]
