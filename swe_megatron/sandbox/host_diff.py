"""The agent's patch, computed on the host: the workspace against the task's pristine repository.

Every episode's patch is taken here (agent/commands.py `Aci.patch`, through Sandbox.host_patch), also when the
sandbox's shell cannot start again. Nothing in the sandbox runs to produce it: the agent's shell keeps its
functions, aliases, PATH, git config and processes, so a `git diff` run there prints what the agent chose
(issue 40). This module compares the workspace with the task's pristine repository (SandboxSpec.repo_dir) in
Python, running nothing the agent wrote (no git in the agent's .git: its config could name filters and diff
drivers); the only git it runs is `git check-ignore` on the pristine repository.

What it reads is untrusted: the walk never follows a symlink (os.fwalk with dir fds, files opened with
O_NOFOLLOW | O_NONBLOCK), reads regular files only, stops after MAX_ENTRIES entries, and gives up (the empty
patch) once the diff passes `max_bytes`. Left out, as git's text diff leaves them out
or as the sanitiser would drop them: .git, bytecode (__pycache__, *.pyc/*.pyo), binary files (a NUL byte, as
git decides), symlinks, paths git would quote (control characters, `"`, backslash: a newline in a file name
would otherwise write header lines of the agent's choosing), and new paths the pristine repository's .gitignore
ignores (`git check-ignore`, run on the pristine repository only).
"""

from __future__ import annotations

import difflib
import hashlib
import logging
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path
from typing import NamedTuple

log = logging.getLogger(__name__)

MAX_ENTRIES = 200_000
"""Files and folders the walk of one tree visits at most (an agent can create millions of empty files)."""
_SKIP_DIRS = frozenset({".git", "__pycache__"})
_GIT = shutil.which("git")
# git with no configuration but the pristine repository's own (the host user's could name fsmonitor hooks).
_GIT_ENV = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": "/dev/null", "LC_ALL": "C"}  # fmt: skip
_QUOTED = re.compile(r'[\x00-\x1f\x7f"\\]')
"""Characters git quotes a path for (C-style, in double quotes); the sanitiser drops such paths anyway."""


class TooLarge(Exception):
    """The diff (or one changed file) passed max_bytes."""


class _File(NamedTuple):
    digest: bytes
    text: str | None
    """None: binary, or over max_bytes (`big`)."""
    big: bool
    executable: bool


def host_diff(pristine: str | os.PathLike, workspace: str | os.PathLike, max_bytes: int) -> str:
    """The git-style diff from the pristine repository to the workspace ('' when over max_bytes)."""
    try:
        before, after = _files(Path(pristine), max_bytes), _files(Path(workspace), max_bytes)
        added = _not_ignored(Path(pristine), sorted(set(after) - set(before)))
        out: list[str] = []
        size = 0
        for rel in sorted((set(before) & set(after)) | set(before) - set(after) | set(added)):
            if _QUOTED.search(rel):  # git would quote it; written bare it could add header lines of its own
                log.warning("the host-side diff of %s leaves out the path %r", workspace, rel)
                continue
            old, new = before.get(rel), after.get(rel)
            if old is not None and new is not None and old.digest == new.digest:
                continue  # same content (a mode change alone is not carried)
            if any(f is not None and f.big for f in (old, new)):
                raise TooLarge
            if any(f is not None and f.text is None for f in (old, new)):
                continue  # binary: git's text diff carries no content either
            text = _file_diff(rel, old, new)
            size += len(text.encode("utf-8", "surrogateescape"))
            if size > max_bytes:
                raise TooLarge
            out.append(text)
    except TooLarge:
        log.warning(
            "the host-side diff of %s is over %d bytes: taken as the empty patch", workspace, max_bytes
        )
        return ""
    return "".join(out)


def _files(root: Path, max_bytes: int) -> dict[str, _File]:
    """{relative path: _File} of the tree's regular files."""
    files: dict[str, _File] = {}
    seen = 0
    for top, dirs, names, dir_fd in os.fwalk(root, follow_symlinks=False):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
        seen += len(dirs) + len(names)
        if seen > MAX_ENTRIES:
            raise TooLarge
        rel_top = os.path.relpath(top, root)
        for name in names:
            if name.endswith((".pyc", ".pyo")):
                continue
            read = _read_text(name, dir_fd, max_bytes)
            if read is not None:
                files[name if rel_top == "." else f"{rel_top}/{name}"] = read
    return files


def _read_text(name: str, dir_fd: int, max_bytes: int) -> _File | None:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:  # a symlink (ELOOP), gone, or unreadable: not carried
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        digest, head = hashlib.sha256(), b""
        while chunk := f.read(1 << 20):
            digest.update(chunk)
            if len(head) <= max_bytes:
                head += chunk
    big = len(head) > max_bytes
    text = None
    if not big and b"\0" not in head:  # git's test for binary; other bytes go through as themselves
        text = head.decode("utf-8", "surrogateescape")
    return _File(digest.digest(), text, big, bool(st.st_mode & 0o100))


def _not_ignored(pristine: Path, paths: list[str]) -> list[str]:
    """paths, less those the pristine repository's .gitignore ignores (all of them where git cannot say)."""
    if not paths:
        return paths
    try:
        res = subprocess.run(
            [
                _GIT or "git",
                "-c",
                "safe.directory=*",
                "-c",
                "core.fsmonitor=false",
                "-C",
                str(pristine),
                "check-ignore",
                "--no-index",
                "-z",
                "--stdin",
            ],
            input="\0".join(paths).encode("utf-8", "surrogateescape"),
            capture_output=True,
            timeout=60,
            env=_GIT_ENV,
        )
    except (OSError, subprocess.SubprocessError) as e:
        log.warning("git check-ignore in %s failed (%s): new files are all kept", pristine, e)
        return paths
    if res.returncode not in (0, 1):  # 1: none ignored
        log.warning("git check-ignore in %s: %s", pristine, res.stderr.decode(errors="replace")[-300:])
        return paths
    ignored = set(res.stdout.decode("utf-8", "surrogateescape").split("\0"))
    return [p for p in paths if p not in ignored]


def _lines(text: str) -> list[str]:
    return re.findall(r"[^\n]*\n|[^\n]+\Z", text)  # git's lines: only \n ends one


def _file_diff(rel: str, old: _File | None, new: _File | None) -> str:
    head = [f"diff --git a/{rel} b/{rel}\n"]
    if old is None:
        head.append(f"new file mode {'100755' if new.executable else '100644'}\n")
    elif new is None:
        head.append(f"deleted file mode {'100755' if old.executable else '100644'}\n")
    a, b = _lines(old.text) if old else [], _lines(new.text) if new else []
    if not a and not b:  # an empty file added or deleted: the header says it all
        return "".join(head)
    lines = difflib.unified_diff(
        a, b, f"a/{rel}" if old else os.devnull, f"b/{rel}" if new else os.devnull, lineterm="\n"
    )
    body = [ln if ln.endswith("\n") else ln + "\n\\ No newline at end of file\n" for ln in lines]
    return "".join(head + body)
