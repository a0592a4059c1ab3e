import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from fake_sandbox import DirSandbox  # noqa: E402

from swe_megatron.agent.commands import Aci  # noqa: E402
from swe_megatron.agent.prompts import load_prompts  # noqa: E402
from swe_megatron.config.schema import AgentConfig  # noqa: E402


def make_repo(root: Path) -> Path:
    """A small git repository with a module, a non-UTF-8 file and a subfolder."""
    repo = root / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "calc.py").write_text(
        "".join(f"# line {i}\n" for i in range(1, 31)) + "def add(a, b):\n    return a - b\n"
    )
    (repo / "latin1.txt").write_bytes(b"caf\xe9\nplain\n")
    subprocess.run(
        "git init -q && git add -A && git -c user.email=t@t -c user.name=t commit -qm init",
        shell=True,
        cwd=repo,
        check=True,
    )
    return repo


@pytest.fixture
def aci(tmp_path):
    sb = DirSandbox(make_repo(tmp_path), output_cap=2000)
    sb.start()
    a = Aci(sb, AgentConfig(window=10), load_prompts(AgentConfig().prompts), sb.workdir, 5.0, 4000)
    a.start()
    yield a
    sb.stop()


@pytest.fixture(scope="session")
def chat():
    """The Qwen2.5 tokenizer with its chat template (loaded once per test session)."""
    from swe_megatron.agent.tokens import ChatFormat
    from swe_megatron.model.tokenizer import load_tokenizer

    return ChatFormat(load_tokenizer("qwen2.5"))
