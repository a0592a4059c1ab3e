"""Prompt templates of the scaffold, loaded from a YAML file in configs/prompts/ (never literals in code)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]


class PromptError(ValueError):
    """The prompt file is missing, unreadable or lacks a template."""


@dataclass(frozen=True)
class Prompts:
    """str.format templates; see configs/prompts/swe_agent.yaml for the placeholders each one takes."""

    system: str
    """System message; {interactive}, {window}."""
    instance: str
    """First user message: the problem statement; {problem_statement}, {workdir}, {cwd}, {file}."""
    demo: str
    """One-shot demonstration put before the instance when the stage asks for it."""
    observation: str
    """Every later user message; {output}, {cwd}, {file}."""
    format_error: str
    """Output of a malformed turn; {count} (code blocks found)."""
    no_output: str
    """Output shown when a command printed nothing and succeeded."""


def load_prompts(path: str | Path) -> Prompts:
    """Read a prompt YAML; relative paths are taken from the repository root when not found as given."""
    p = Path(path)
    if not p.is_absolute() and not p.exists():
        p = REPO_ROOT / p
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise PromptError(f"cannot read prompt file {path}: {e}; set agent.prompts to a YAML file") from e
    names = [f.name for f in fields(Prompts)]
    missing = [n for n in names if not isinstance((data or {}).get(n), str)]
    if missing:
        raise PromptError(f"prompt file {p} lacks template(s) {missing}")
    return Prompts(**{n: data[n] for n in names})
