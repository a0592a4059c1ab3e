"""local backend (development only): the persistent shell as a plain subprocess in a temp copy of the repo.

Nothing is isolated: commands run as you, see your files and the network, and have no limits but the
timeout and the output cap. It is refused unless sandbox.allow_local is true. Commands run in the copy's
real path (not at spec.workdir), so absolute /testbed paths do not work here; read_file/write_file still
accept them.
"""

from __future__ import annotations

import os

from swe_megatron.config import ConfigError
from swe_megatron.sandbox.base import SandboxSpec
from swe_megatron.sandbox.shell import ShellSandbox
from swe_megatron.sandbox.users import SandboxUser, current_user

REFUSED = (
    "sandbox.backend=local runs agent commands unsandboxed on this machine (as you, with your files and "
    "network); use bwrap or apptainer, or set sandbox.allow_local=true for development"
)


class LocalSandbox(ShellSandbox):
    """A plain bash subprocess in a private copy of the repository (no isolation)."""

    backend = "local"

    def __init__(self, spec: SandboxSpec, cfg):
        if not cfg.allow_local:
            raise ConfigError(REFUSED)
        super().__init__(spec, cfg)

    def _identity(self) -> SandboxUser:
        return current_user()

    def _process_limit(self) -> None:
        return None  # not enforced here

    def _shell_workdir(self) -> str:
        return str(self.workspace.repo)

    def _state_file(self) -> str:
        return str(self.workspace.folder / "state")

    def _launch(self) -> tuple[list[str], dict[str, str]]:
        path = "/usr/local/bin:/usr/bin:/bin"
        env = {"HOME": os.environ.get("HOME", "/tmp"), "LANG": "C.UTF-8", "TERM": "dumb", "PAGER": "cat"}
        if self.spec.env_dir:
            venv = os.path.abspath(self.spec.env_dir)
            path = f"{venv}/bin:{path}"
            env["VIRTUAL_ENV"] = venv
        env["PATH"] = path
        return [], env
