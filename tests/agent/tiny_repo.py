"""A one-file git repository task used by the rollout and engine tests."""

import subprocess

from swe_megatron.tasks.schema import Task


def make_task(root, name):
    """Repo where f() returns 1; the gold patch makes it return 2."""
    repo = root / name
    repo.mkdir()
    (repo / "m.py").write_text("def f():\n    return 1\n")
    git = "git -c user.email=t@t -c user.name=t"
    subprocess.run(f"git init -q && git add -A && {git} commit -qm init", shell=True, cwd=repo, check=True)
    gold = "--- a/m.py\n+++ b/m.py\n@@ -1,2 +1,2 @@\n def f():\n-    return 1\n+    return 2\n"
    return Task(
        name,
        "x/y",
        "HEAD",
        f"diff --git a/m.py b/m.py\n{gold}",
        "",
        f"{name}: f() must return 2",
        [],
        [],
        extra={"repo_dir": str(repo), "test_cmd": "python -m pytest -q"},  # a test command: every task has a plan
    )
