"""Tiny real tasks for pipeline tests: the grading tests' `calc` task (real repo, real pytest env), several copies."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "grading"))
import tiny_task  # noqa: E402

from swe_megatron.tasks.load import write_tasks  # noqa: E402


def make_task_files(root: Path, n_train: int = 2, n_test: int = 1) -> tuple[Path, Path]:
    """root/train.jsonl and root/test.jsonl with n copies of the calc task (distinct ids and repos)."""
    env = tiny_task.build_env()
    rows = {"train": [], "test": []}
    for split, n in (("train", n_train), ("test", n_test)):
        for i in range(n):
            iid = f"calc__calc-{split}{i}"
            folder = root / iid
            folder.mkdir(parents=True, exist_ok=True)
            t = tiny_task.build_task(folder, env, iid)
            extra = dict(t.extra, repo_dir=f"{iid}/repo", env_dir=os.path.relpath(env, root))
            rows[split].append(dataclasses.replace(t, extra=extra))
    write_tasks(rows["train"], root / "train.jsonl")
    write_tasks(rows["test"], root / "test.jsonl")
    return root / "train.jsonl", root / "test.jsonl"


if __name__ == "__main__":
    print(make_task_files(Path(sys.argv[1])))
