"""Every command line in the README's code blocks goes through the real parser (issue 27 item 1), so README
and behaviour cannot drift apart: `swe-megatron ...` lines are parsed by `cli.parse_args` and their config
with its overrides is loaded (show-config and plan are run: they are cheap); `sbatch SCRIPT CONFIG ...` lines
name a script that exists and a config that loads; tools/ lines name a file that exists."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from swe_megatron.cli import main, parse_args
from swe_megatron.config.load import load_config

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "containers/README.md", "slurm/README.md")


def command_lines(text: str) -> list[str]:
    """The shell commands of a markdown text's ``` blocks: continuations joined, comments dropped, `&&` split."""
    commands = []
    for block in re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.S | re.M):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            words = shlex.split(line, comments=True)
            while words:
                cut = words.index("&&") if "&&" in words else len(words)
                if words[:cut]:
                    commands.append(shlex.join(words[:cut]))
                words = words[cut + 1 :]
    return commands


def _cli_argv(words: list[str]) -> list[str] | None:
    """The swe-megatron arguments of a command (console script, or `-m swe_megatron.cli` under torchrun)."""
    for i, w in enumerate(words):
        if w.endswith("swe-megatron"):
            return words[i + 1 :]
        if w == "swe_megatron.cli" and words[i - 1] == "-m":
            return words[i + 1 :]
    return None


ALL = [(doc, cmd) for doc in DOCS if (ROOT / doc).exists() for cmd in command_lines((ROOT / doc).read_text())]


def test_the_readme_has_commands():
    readme = [cmd for doc, cmd in ALL if doc == "README.md"]
    assert len(readme) >= 12 and sum(_cli_argv(shlex.split(c)) is not None for c in readme) >= 8, readme


def test_command_lines_are_extracted_whole():
    text = "x\n```bash\na --b c \\\n    d=1   # why\n# only a comment\ntools/x.sh && y z\n```\n"
    assert command_lines(text) == ["a --b c d=1", "tools/x.sh", "y z"]


@pytest.mark.parametrize(("doc", "command"), ALL, ids=[f"{d}: {c[:70]}" for d, c in ALL])
def test_documented_command_works(doc, command, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    words = shlex.split(command)
    while re.fullmatch(r"[A-Z_]+=\S*", words[0]):  # VAR=value before the program
        words = words[1:]
    if words[0] in ("export", "apptainer"):  # environment; Apptainer's own CLI on a repository file
        assert all((ROOT / w).is_file() for w in words if w.startswith("containers/")), command
        return
    argv = _cli_argv(words)
    if argv is not None:
        args = parse_args(argv)  # SystemExit (argparse's error) fails the test
        if args.command in ("show-config", "plan"):
            assert main(argv) == 0, capsys.readouterr().err
        elif getattr(args, "config", None):
            load_config(args.config, args.overrides)
        return
    if words[0] == "sbatch":
        script = next(i for i, w in enumerate(words) if w.endswith(".sbatch"))
        assert (ROOT / words[script]).is_file(), words[script]
        rest = [w for w in words[script + 1 :] if not re.search(r"[\[\]]|\.\.\.", w)]  # [CONFIG] [k=v ...]
        if rest:
            load_config(rest[0], rest[1:])
        return
    if words[1:3] == ["-m", "venv"] or words[-3:] == ["install", "-e", "."]:  # a plain venv of this checkout
        assert (ROOT / "pyproject.toml").is_file() and words[-1] in (".", ".venv"), command
        return
    path = next((w for w in words if w.startswith("tools/")), None)
    assert path is not None, f"{doc}: a command this test does not know how to check: {command}"
    assert (ROOT / path).is_file(), f"{doc}: {path} does not exist"


VENV_PROGRAMS = ("swe-megatron", "python", "tensorboard", "torchrun", "pytest", "pip")
"""Programs that exist only in the project's venv: in a fresh shell (no `source .venv/bin/activate`) the README must
spell them `.venv/bin/NAME` (issue 42 item 5: a bare `python -m swe_megatron` died with ModuleNotFoundError)."""


def _program(command: str) -> str:
    words = shlex.split(command)
    while re.fullmatch(r"[A-Z_]+=\S*", words[0]):
        words = words[1:]
    return words[0]


@pytest.mark.parametrize("command", [c for d, c in ALL if d == "README.md"], ids=lambda c: c[:70])
def test_readme_commands_run_in_a_fresh_shell(command):
    """Each README code-block command's program is a repository file or a system tool, never a bare venv
    program; a `.venv/bin/NAME` one exists in this checkout's venv."""
    program = _program(command)
    assert program not in VENV_PROGRAMS, f"README: `{command}` needs the venv: write .venv/bin/{program}"
    if program.startswith(".venv/bin/"):
        assert (ROOT / program).exists(), f"README: {program} is not in this checkout's venv"


def test_readme_prose_commands_name_the_venv():
    """Commands given inline in README prose (`tensorboard --logdir ...`) are run as written too: no bare venv
    program other than the project's own name (`swe-megatron X` in prose names `.venv/bin/swe-megatron X`, said
    once at the quick start)."""
    text = (ROOT / "README.md").read_text()
    assert "`.venv/bin/swe-megatron`" in text and "source .venv/bin/activate" in text
    spans = re.findall(r"`([^`\n]+)`", text)
    bare = [s for s in spans if s.split()[0] in VENV_PROGRAMS[1:] and len(s.split()) > 1]
    assert bare == [], bare
