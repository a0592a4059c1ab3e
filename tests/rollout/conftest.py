import json
import sys
from pathlib import Path

import pytest

# The agent tests' labelled fake sandbox and the grading tests' tiny real task are shared here.
sys.path.insert(0, str(Path(__file__).parents[1] / "agent"))
sys.path.insert(0, str(Path(__file__).parents[1] / "grading"))


@pytest.fixture
def sandbox_servers(tmp_path):
    """make(n, max_concurrent=2): n real sandbox servers (stopped after the test)."""
    from sandbox_servers import SandboxServer

    made = []

    def make(n: int = 1, max_concurrent: int = 2) -> list:
        made.extend(SandboxServer(tmp_path, max_concurrent) for _ in range(n))
        return made[-n:]

    yield make
    for s in made:
        s.close()


@pytest.fixture
def gold_task(tmp_path):
    """(tasks, chat): the grading tests' tiny real task, loaded by the task loader, and the Qwen2.5 chat."""
    import tiny_task

    from swe_megatron.agent.tokens import ChatFormat
    from swe_megatron.model.tokenizer import load_tokenizer
    from swe_megatron.tasks.load import load_tasks

    folder = tmp_path / "tasks"
    folder.mkdir()
    task = tiny_task.build_task(folder, tiny_task.build_env())
    (folder / "tasks.jsonl").write_text(json.dumps(task.__dict__) + "\n")
    return load_tasks(folder / "tasks.jsonl"), ChatFormat(load_tokenizer("qwen2.5"))
