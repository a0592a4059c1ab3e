"""Atomic file writes: a reader (or a run resumed after a crash) sees the old file or the new one, never a torn one.

The data goes to a uniquely named temporary file in the target's folder, is fsynced and renamed over the
target; the folder is fsynced too, so the rename itself survives a power cut.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any


def write_atomic(path: str | os.PathLike, data: str | bytes, mode: int | None = None) -> Path:
    """Replace path's content with data (str as UTF-8) in one step; creates missing folders; returns the path.

    mode: the file's permission bits exactly (e.g. 0o600 for a secret); None: as open() would create it
    (0o666 less the umask). The temporary file is removed when anything fails.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666 if mode is None else mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)  # the umask may have cut bits off
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return path


def write_json_atomic(path: str | os.PathLike, data: Any, mode: int | None = None, **dump_kw: Any) -> Path:
    """write_atomic of json.dumps(data, **dump_kw) (e.g. indent=1)."""
    return write_atomic(path, json.dumps(data, **dump_kw), mode)
