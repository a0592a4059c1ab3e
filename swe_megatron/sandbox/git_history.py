"""Cut a workspace's git repository down to its base commit's history before an episode starts.

Real SWE-bench / SWE-rebench images carry the repository's whole history, and agents read the fix from it
(`git log --all`, later commits, remote-tracking refs, tags, reflog, stash, packed or unreachable objects;
SWE-bench issue 465). The workspace is a private copy, so its `.git` is rewritten in place: every ref but
HEAD's branch and the tags already in HEAD's history goes, with the remotes, reflogs, other worktrees and
alternates, then the object store is repacked from what is left and everything unreachable is pruned.
The index is kept (and its objects), so the working tree's state is untouched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from swe_megatron.sandbox.base import SandboxError

# What names or quotes commits outside the refs (reflogs, other worktrees, messages, state); removed.
_STRAY = ("logs", "worktrees", "FETCH_HEAD", "ORIG_HEAD", "MERGE_HEAD", "CHERRY_PICK_HEAD", "REVERT_HEAD",
          "BISECT_LOG", "rr-cache", "COMMIT_EDITMSG", "MERGE_MSG", "SQUASH_MSG", "rebase-merge", "rebase-apply",
          "sequencer")  # fmt: skip
_ALTERNATES = ("objects/info/alternates", "objects/info/http-alternates")  # other object stores (all history)


def _git(repo: Path, owner: tuple[int, int], *args: str, stdin: str | None = None, check: bool = True) -> str:
    # The copy's config is the task's; no hooks, fsmonitor or pager of it (or the host's) may run here.
    cmd = ["git", "-c", f"safe.directory={repo}", "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false",
           "-c", "gc.auto=0", "-C", str(repo), *args]  # fmt: skip
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GIT_CONFIG_NOSYSTEM": "1", "HOME": "/nonexistent",
           "GIT_CONFIG_GLOBAL": "/dev/null", "LANG": "C"}  # fmt: skip
    # As the workspace's owner: what git writes stays theirs, and root never runs git on task data.
    as_owner = {"user": owner[0], "group": owner[1], "extra_groups": []} if os.geteuid() == 0 else {}
    res = subprocess.run(cmd, input=stdin, capture_output=True, text=True, env=env, check=False, **as_owner)
    if res.returncode != 0 and check:
        raise SandboxError(
            f"cannot cut the workspace's git history (git {' '.join(args)}): {res.stderr.strip()}"
        )
    return res.stdout


def cut_to_head(repo: Path, uid: int, gid: int) -> bool:
    """Leave repo's git repository (owned by uid:gid) holding only HEAD's history (module docstring); False
    when repo has no `.git` folder (nothing to cut); SandboxError when git fails."""
    git_dir = repo / ".git"
    if not git_dir.is_dir() or git_dir.is_symlink():
        return False
    if shutil.which("git") is None:
        raise SandboxError(
            "git is not installed: the workspace's git history cannot be cut to the base commit"
        )
    owner = (uid, gid)
    head = (git_dir / "HEAD").read_text(encoding="utf-8", errors="replace")
    branch = _git(repo, owner, "symbolic-ref", "-q", "HEAD").strip() if head.startswith("ref:") else ""
    born = _git(repo, owner, "rev-parse", "--verify", "-q", "HEAD^{commit}", check=False).strip()
    tags = _git(repo, owner, "tag", "--merged", "HEAD").split() if born else []  # unborn HEAD: nothing kept
    keep = {branch} | {f"refs/tags/{t}" for t in tags}
    refs = _git(repo, owner, "for-each-ref", "--format=%(refname)").split()
    drop = "".join(f"delete {ref}\n" for ref in refs if ref not in keep)
    if drop:
        _git(repo, owner, "update-ref", "--no-deref", "--stdin", stdin=drop)
    for remote in _git(repo, owner, "remote").split():
        _git(repo, owner, "config", "--remove-section", f"remote.{remote}")
    for name in _STRAY:
        path = git_dir / name
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink(missing_ok=True)
    # -a -d: one pack of what HEAD, the kept tags and the index reach (alternates' objects copied in); packed
    # objects nothing reaches are dropped. Then the alternates can go, and prune drops loose unreachable ones.
    _git(repo, owner, "repack", "-a", "-d", "-q")
    for name in _ALTERNATES:
        (git_dir / name).unlink(missing_ok=True)
    _git(repo, owner, "prune", "--expire=now")
    return True
