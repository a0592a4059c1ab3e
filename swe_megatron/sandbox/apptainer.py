"""apptainer backend (clusters): the persistent shell in `apptainer exec` of the task's read-only SIF.

    [sh -c 'join the sandbox cgroup']  [setpriv ... --]  prlimit --cpu --fsize --nofile --core=0 --
    apptainer exec --contain --cleanenv --pid --ipc --no-home --no-mount hostfs,bind-paths,cwd
                   --net --network none --writable-tmpfs --bind WORKSPACE:/testbed --pwd /testbed
                   [--memory BYTES --pids-limit N]  IMAGE  <shell supervisor>

One `apptainer exec` per sandbox runs the shell's supervisor (shell.py); a shell that dies is restarted
inside the same container. The image stays read-only; writes outside /testbed land in a tmpfs overlay
(--writable-tmpfs) and are lost if the whole sandbox restarts. --contain gives a private /tmp and /dev,
--no-home and --no-mount keep the user's home, the cwd and the admin's `bind path` entries out, and
`--net --network none` leaves only loopback. The apptainer CLI is the whole interface. spython (0.3.14, the
maintained Apptainer client on PyPI) does not fit: its exec runs a fixed `singularity` binary to completion
(communicate) or streams stdout lines as text, with no stdin pipe, no binary output and no prefix command
(setpriv/prlimit/cgroup join), and the sandbox's shell supervisor needs all four.

Limits: CPU seconds, file size and open files with prlimit. Memory and processes of the whole sandbox:
in the sandbox's own cgroup (shell.py, cgroups.py) where this process can make one (root, or a delegated
cgroup v2 subtree); otherwise, with sandbox.cgroup_limits on, through apptainer's --memory/--pids-limit
(apptainer asks systemd for the cgroup; rootless runs need systemd delegation, and apptainer fails clearly
without it: set sandbox.cgroup_limits=false there); otherwise only the Slurm job's own limits apply. Address-space and process rlimits are not used here: apptainer's
runtime itself needs more address space, and RLIMIT_NPROC would count the job user's every process.

Run as root (CI), the backend first drops to the sandbox user (whose passwd entry apptainer needs);
on a cluster it runs as the job's user.

Tests run this backend against tests/fake_apptainer/apptainer, a stand-in over bwrap that implements
exactly the options above and refuses anything else.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from swe_megatron.sandbox.base import SandboxError
from swe_megatron.sandbox.shell import ShellSandbox
from swe_megatron.sandbox.users import SandboxUser, current_user, lookup_user

SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def find_apptainer() -> str:
    """The apptainer binary on the user's PATH (tests put a stand-in first); SandboxError naming the fix."""
    found = shutil.which("apptainer", path=os.environ.get("PATH", SAFE_PATH))
    if found is None:
        raise SandboxError(
            "apptainer is not installed (no `apptainer` on PATH); on a laptop use sandbox.backend=bwrap"
        )
    return found


class ApptainerSandbox(ShellSandbox):
    """A sandbox in an Apptainer container made from spec.image (a SIF, or a name in sandbox.sif_dir)."""

    backend = "apptainer"

    def _identity(self) -> SandboxUser:
        return lookup_user(self.cfg.user) if os.geteuid() == 0 else current_user()

    def _image(self) -> str:
        image = self.spec.image
        if not image:
            raise SandboxError("the apptainer backend needs SandboxSpec.image (a SIF file)")
        path = Path(image)
        if not path.is_absolute() and self.cfg.sif_dir:
            path = Path(self.cfg.sif_dir) / path
        if not path.exists():
            raise SandboxError(
                f"image {path} not found (SandboxSpec.image, sandbox.sif_dir={self.cfg.sif_dir!r})"
            )
        return str(path.resolve())

    def _process_limit(self) -> int | None:
        return self.cfg.max_processes if self.cfg.cgroup_limits or self._cgroup is not None else None

    def _prepare(self) -> None:
        self._apptainer = find_apptainer()
        self._tools = {name: shutil.which(name, path=SAFE_PATH) for name in ("setpriv", "prlimit")}
        if self._tools["prlimit"] is None or (os.geteuid() == 0 and self._tools["setpriv"] is None):
            raise SandboxError(
                "setpriv/prlimit (util-linux) not installed: run tools/sandbox_setup.sh as root"
            )
        self._image_path = self._image()

    def _launch(self) -> tuple[list[str], dict[str, str]]:
        cfg, spec, user = self.cfg, self.spec, self.user
        argv: list[str] = []
        if os.geteuid() == 0:
            argv += [
                self._tools["setpriv"],
                f"--reuid={user.uid}",
                f"--regid={user.gid}",
                "--clear-groups",
                "--",
            ]
        argv += [
            self._tools["prlimit"],
            f"--cpu={cfg.cpu_seconds}:{cfg.cpu_seconds + 2}",  # SIGXCPU at the limit, SIGKILL 2 s later
            f"--fsize={cfg.max_file_mb << 20}",
            f"--nofile={cfg.max_open_files}",
            "--core=0",
        ]
        argv += ["--", self._apptainer, "exec", "--contain", "--cleanenv", "--pid", "--ipc", "--no-home"]
        argv += ["--no-mount", "hostfs,bind-paths,cwd", "--net", "--network", "none", "--writable-tmpfs"]
        argv += ["--bind", f"{self.workspace.repo}:{spec.workdir}", "--pwd", spec.workdir]
        if cfg.cgroup_limits and self._cgroup is None:  # no group of our own: apptainer's (systemd's)
            argv += ["--memory", str(cfg.memory_mb << 20), "--pids-limit", str(cfg.max_processes)]
        argv.append(self._image_path)
        home = "/nonexistent"
        if os.geteuid() != 0:
            home = os.environ.get("HOME", home)
        env = {"PATH": SAFE_PATH, "LANG": "C.UTF-8", "HOME": home, "USER": user.name, "LOGNAME": user.name}
        return argv, env
