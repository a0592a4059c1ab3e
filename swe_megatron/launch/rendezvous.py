"""The rendezvous of one Slurm job: how the driver learns the addresses of its engines and sandbox servers.

Layout of the job folder (on the shared filesystem, mode 0700, every file 0600):

    JOB_DIR/sandbox.token              per-job secret of the sandbox servers (fresh on every (re)start)
    JOB_DIR/rendezvous.d/ROLE-N.json   one entry per server, written by the server's job step
    JOB_DIR/rendezvous.json            the merged file, written once every expected entry is there

An entry: {"role": "engine" | "sandbox", "index": N, "url": "http://HOST:PORT", "node": HOST, "pid": PID}.
The merged file (format version 1):

    {"version": 1, "job_id": "1234", "token_file": "JOB_DIR/sandbox.token",
     "engines": ["http://gpu09:8100", ...], "sandbox_servers": ["http://gpu01:8760", ...],
     "written_at": 1732250000.0}

Each writer owns its own file and every file is written to a temporary name and renamed, so readers on
other nodes never see a partial file, and no lock is needed (locks are unreliable on NFS/Lustre).

The run reads it with `load(cfg.cluster.rendezvous)`; the token is read from token_file, which must not be
readable by group or others.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from swe_megatron.atomic_write import write_atomic
from swe_megatron.errors import UsageError

VERSION = 1
TOKEN_FILE = "sandbox.token"
ENTRIES = "rendezvous.d"
MERGED = "rendezvous.json"
ROLES = ("engine", "sandbox")


class RendezvousError(UsageError):
    """The rendezvous could not complete (a server did not come up) or its files are unsafe or malformed."""


def init_job_dir(job_dir: str | Path) -> Path:
    """Create JOB_DIR (0700), drop entries of an earlier start of the job, write a fresh token; returns its path."""
    job_dir = Path(job_dir)
    job_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(job_dir, 0o700)
    shutil.rmtree(job_dir / ENTRIES, ignore_errors=True)
    (job_dir / MERGED).unlink(missing_ok=True)
    (job_dir / ENTRIES).mkdir(mode=0o700)
    token = job_dir / TOKEN_FILE
    write_atomic(token, secrets.token_hex(32) + "\n", mode=0o600)
    return token


def read_token(path: str | Path) -> str:
    """The token in path; RendezvousError if group or others can read it, or it is missing/short."""
    path = Path(path)
    try:
        st = path.stat()
        if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise RendezvousError(f"token file {path} is accessible by other users; chmod 600 it")
        token = path.read_text().strip()
    except OSError as e:
        raise RendezvousError(f"cannot read token file {path}: {e.strerror}") from None
    if len(token) < 16:
        raise RendezvousError(f"token file {path} holds no token of at least 16 characters")
    return token


def publish(job_dir: str | Path, role: str, index: int, url: str, node: str, pid: int | None = None) -> Path:
    """Write one server's entry (atomic); the server calls this once it answers requests."""
    if role not in ROLES:
        raise ValueError(f"role {role!r} is not one of {ROLES}")
    entry = {"role": role, "index": index, "url": url, "node": node, "pid": pid or os.getpid()}
    path = Path(job_dir) / ENTRIES / f"{role}-{index}.json"
    write_atomic(path, json.dumps(entry) + "\n", mode=0o600)
    return path


def entries(job_dir: str | Path) -> dict[str, dict[int, dict]]:
    """Published entries by role and index (files being written are not seen: they have a temporary name)."""
    found: dict[str, dict[int, dict]] = {r: {} for r in ROLES}
    folder = Path(job_dir) / ENTRIES
    for p in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            e = json.loads(p.read_text())
            found[e["role"]][int(e["index"])] = e
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise RendezvousError(f"malformed rendezvous entry {p}: {err}") from None
    return found


@dataclass(frozen=True)
class Rendezvous:
    """The merged rendezvous of a job."""

    job_id: str
    """Slurm job id."""
    token_file: str
    """File with the sandbox servers' secret token (mode 0600)."""
    engines: tuple[str, ...]
    """Base URLs of the vLLM servers (empty: the run starts its own)."""
    sandbox_servers: tuple[str, ...]
    """Base URLs of the sandbox servers, one per node."""

    @property
    def token(self) -> str:
        """The sandbox servers' token (read from token_file, permissions checked)."""
        return read_token(self.token_file)

    def to_json(self) -> str:
        """The merged file's text."""
        return (
            json.dumps(
                {
                    "version": VERSION,
                    "job_id": self.job_id,
                    "token_file": self.token_file,
                    "engines": list(self.engines),
                    "sandbox_servers": list(self.sandbox_servers),
                    "written_at": time.time(),
                },
                indent=2,
            )
            + "\n"
        )


def wait(
    job_dir: str | Path,
    job_id: str,
    expected: dict[str, int],
    timeout_s: float,
    alive: Callable[[], str | None] = lambda: None,
    poll_s: float = 0.5,
) -> Rendezvous:
    """Wait until `expected` entries per role are published, then write and return the merged rendezvous.

    alive() returns a message when a server step has died (then this fails at once instead of waiting).
    """
    job_dir = Path(job_dir)
    deadline = time.monotonic() + timeout_s
    while True:
        found = entries(job_dir)
        missing = {r: sorted(set(range(n)) - set(found[r])) for r, n in expected.items()}
        if not any(missing.values()):
            break
        dead = alive()
        if dead:
            raise RendezvousError(f"{dead}; still missing: {_describe(missing)}")
        if time.monotonic() > deadline:
            raise RendezvousError(
                f"servers did not publish within {timeout_s:.0f} s (cluster.startup_timeout_s): missing "
                f"{_describe(missing)}; see their logs in {job_dir}/logs"
            )
        time.sleep(poll_s)
    rv = Rendezvous(
        job_id=job_id,
        token_file=str((job_dir / TOKEN_FILE).resolve()),
        engines=tuple(found["engine"][i]["url"] for i in range(expected.get("engine", 0))),
        sandbox_servers=tuple(found["sandbox"][i]["url"] for i in range(expected.get("sandbox", 0))),
    )
    write_atomic(job_dir / MERGED, rv.to_json(), mode=0o600)
    return rv


def _describe(missing: dict[str, list[int]]) -> str:
    return ", ".join(f"{r} {ids}" for r, ids in missing.items() if ids)


def load(path: str | Path) -> Rendezvous:
    """Read a merged rendezvous file (cfg.cluster.rendezvous); RendezvousError naming the problem."""
    path = Path(path)
    try:
        if path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise RendezvousError(f"rendezvous file {path} is accessible by other users; chmod 600 it")
        data = json.loads(path.read_text())
    except OSError as e:
        raise RendezvousError(
            f"cannot read rendezvous file {path} (cluster.rendezvous): {e.strerror}; it is written by "
            "slurm/*.sbatch once the servers are up"
        ) from None
    except ValueError as e:
        raise RendezvousError(f"rendezvous file {path} is not JSON: {e}") from None
    if data.get("version") != VERSION:
        raise RendezvousError(
            f"rendezvous file {path} has version {data.get('version')!r}; expected {VERSION}"
        )
    return Rendezvous(
        job_id=str(data["job_id"]),
        token_file=data["token_file"],
        engines=tuple(data.get("engines", ())),
        sandbox_servers=tuple(data.get("sandbox_servers", ())),
    )
