"""The agent-computer interface (ACI): the paper's command set over the Sandbox protocol.

`Aci.run(command)` executes one command (the content of the turn's single code block) and returns its
output as text; `submit` raises Submitted. Viewer commands (open, goto, scroll_up, scroll_down, create,
edit, search_file, replace) are implemented here with `read_file`/`write_file` and a few shell probes, so
they behave the same on every backend. Anything else is a shell command run in the sandbox's persistent
shell, unless it starts an interactive program. A SandboxError (the sandbox itself failed) propagates:
it is an infrastructure failure, not an observation.
"""

from __future__ import annotations

import logging
import posixpath
import re
import shlex
from dataclasses import dataclass

from swe_megatron.agent.prompts import Prompts
from swe_megatron.agent.viewer import (
    FileLines,
    ViewerError,
    apply_edit,
    clamp_top,
    render_window,
    search_lines,
    top_for_line,
)
from swe_megatron.config.schema import AgentConfig
from swe_megatron.sandbox.base import ExecResult, Sandbox

log = logging.getLogger(__name__)

PATCH_MAX_BYTES = 64 << 20
"""Largest diff taken (the empty patch past it; grading caps patches far lower: sandbox.grade_max_patch_bytes)."""

# Environment of the agent's shell: no pagers or editors that wait for a terminal.
_SHELL_SETUP = (
    "export PAGER=cat GIT_PAGER=cat MANPAGER=cat GIT_EDITOR=true EDITOR=true VISUAL=true TERM=dumb "
    "PIP_NO_INPUT=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1"
)
_EDIT_HEAD = re.compile(r"edit\s+(\d+)\s*:\s*(\d+)\s*$")
_SEGMENT_SPLIT = re.compile(r"\|\|?|&&|;|\n|&")
_REPL_ONLY = {"python", "python3", "bash", "sh", "zsh", "node", "irb", "psql", "mysql", "sqlite3"}
_VIEWER = {"open", "goto", "scroll_up", "scroll_down", "create", "edit", "search_file", "replace", "submit"}


class Submitted(Exception):
    """The agent ran `submit`: the episode ends and the working tree's diff is graded."""


@dataclass
class ViewerState:
    """What the viewer shows: the open file (absolute path in the sandbox) and the window's first line."""

    file: str | None = None
    """Open file, or None."""
    top: int = 1
    """First line of the window."""


def cap_text(text: str, cap: int) -> str:
    """`text` cut to at most `cap` characters with a visible notice saying how much was dropped."""
    if cap <= 0 or len(text) <= cap:
        return text
    return text[:cap] + f"\n[... output truncated: showing the first {cap} of {len(text)} characters ...]"


def interactive_program(command: str, refused: list[str]) -> str | None:
    """The interactive program a shell command would start (so it is refused), or None."""
    for segment in _SEGMENT_SPLIT.split(command):
        try:
            words = shlex.split(segment)
        except ValueError:
            words = segment.split()
        while words and (
            "=" in words[0]
            and not words[0].startswith("=")
            or words[0] in ("sudo", "env", "nohup", "time", "exec")
        ):
            words = words[1:]
        if not words:
            continue
        prog = posixpath.basename(words[0])
        if prog in refused:
            return prog
        if re.fullmatch(r"python[0-9.]*", prog) and len(words) == 1 or prog in _REPL_ONLY and len(words) == 1:
            return prog
    return None


class Aci:
    """The command interface of one episode over one started sandbox (whose shell persists between calls)."""

    def __init__(
        self,
        sandbox: Sandbox,
        cfg: AgentConfig,
        prompts: Prompts,
        workdir: str,
        command_timeout_s: float,
        output_cap: int,
    ):
        self.sandbox = sandbox
        self.cfg = cfg
        self.prompts = prompts
        self.workdir = workdir
        self.command_timeout_s = command_timeout_s
        self.output_cap = output_cap
        self.cwd = workdir
        self.view = ViewerState()
        self.exec_seconds = 0.0
        """Seconds spent inside sandbox calls (the raw cost of commands, for overhead figures)."""

    # ---- sandbox access -------------------------------------------------------------------------
    def _exec(self, command: str, timeout_s: float | None = None) -> ExecResult:
        r = self.sandbox.exec(command, timeout_s=timeout_s or self.command_timeout_s)
        self.exec_seconds += r.duration_s
        return r

    def start(self) -> None:
        """Prepare the shell: no pagers or editors, cwd at the repository."""
        self._exec(f"{_SHELL_SETUP}; cd {shlex.quote(self.workdir)}")
        self._refresh_cwd()

    def _refresh_cwd(self) -> None:
        r = self._exec("pwd", timeout_s=30)
        lines = r.output.decode("utf-8", "backslashreplace").strip().splitlines()
        if r.exit_code == 0 and lines and lines[-1].startswith("/"):
            self.cwd = lines[-1]

    def _abs(self, path: str) -> str:
        return posixpath.normpath(posixpath.join(self.cwd, path))

    def _kind(self, path: str) -> str:
        """ "file", "dir" or "none" for a path in the sandbox."""
        q = shlex.quote(path)
        r = self._exec(
            f"if [ -d {q} ]; then echo dir; elif [ -e {q} ]; then echo file; else echo none; fi", 30
        )
        words = r.output.decode("utf-8", "replace").split()
        return words[-1] if words and words[-1] in ("file", "dir") else "none"

    def _read(self, path: str) -> FileLines:
        kind = self._kind(path)
        if kind == "dir":
            raise ViewerError(f"{path} is a directory; use `ls {path}` to list it")
        if kind == "none":
            raise ViewerError(f"File {path} not found")
        return FileLines.from_bytes(self.sandbox.read_file(path))

    def _require_open(self) -> str:
        if self.view.file is None:
            raise ViewerError("No file open. Use the `open` command first.")
        return self.view.file

    def _window(self, f: FileLines | None = None) -> str:
        path = self._require_open()
        f = f if f is not None else FileLines.from_bytes(self.sandbox.read_file(path))
        self.view.top = clamp_top(self.view.top, len(f.lines), self.cfg.window)
        return render_window(path, f, self.view.top, self.cfg.window)

    # ---- observation ----------------------------------------------------------------------------
    @property
    def current_file(self) -> str:
        """The open file for the prompt line ("n/a" when none)."""
        return self.view.file or "n/a"

    def observation(self, output: str) -> str:
        """The user message after a command: output, then `(Current directory: DIR, current file: FILE) bash-$`."""
        return self.prompts.observation.format(output=output, cwd=self.cwd, file=self.current_file)

    # ---- dispatch -------------------------------------------------------------------------------
    def run(self, command: str) -> str:
        """Execute one command and return its output text (capped); raises Submitted on `submit`."""
        head = command.split(None, 1)[0] if command.split() else ""
        if head in _VIEWER:
            try:
                out = getattr(self, f"_cmd_{head}")(command)
            except ViewerError as e:
                out = f"Error: {e}"
        else:
            out = self._shell(command)
        return cap_text(out, self.output_cap)

    def _shell(self, command: str) -> str:
        prog = interactive_program(command, self.cfg.interactive_programs)
        if prog is not None:
            return (
                f"Error: `{prog}` is interactive and is not supported here. Use non-interactive commands "
                "(e.g. `python script.py`, `cat FILE`) and the open/edit/create commands to view and change files."
            )
        r = self._exec(command)
        text = r.output.decode("utf-8", "backslashreplace").rstrip("\n")
        notes = []
        if r.truncated and "truncated" not in text[-300:]:
            notes.append(f"[output truncated at {len(r.output)} bytes]")
        if r.timed_out:
            notes.append(f"[command timed out after {self.command_timeout_s:g} s and was killed]")
        elif r.exit_code != 0:
            notes.append(f"[exit code {r.exit_code}]")
        self._refresh_cwd()
        if not text and not notes:
            return self.prompts.no_output
        return "\n".join([text, *notes] if text else notes)

    @staticmethod
    def _args(command: str) -> list[str]:
        try:
            return shlex.split(command)[1:]
        except ValueError as e:
            raise ViewerError(f"could not parse the arguments ({e}); check the quoting") from e

    def _cmd_submit(self, command: str) -> str:
        if command.strip() != "submit":
            raise ViewerError("`submit` takes no arguments and must be the only command")
        raise Submitted()

    def _cmd_open(self, command: str) -> str:
        args = self._args(command)
        if not 1 <= len(args) <= 2:
            raise ViewerError("usage: open FILE [LINE]")
        path = self._abs(args[0])
        f = self._read(path)
        line = 1
        if len(args) == 2:
            if not args[1].isdigit():
                raise ViewerError(f"LINE must be a number, got {args[1]!r}")
            line = int(args[1])
            if not 1 <= line <= max(1, len(f.lines)):
                raise ViewerError(f"LINE must be between 1 and {len(f.lines)}, got {line}")
        self.view = ViewerState(
            path, top_for_line(line, len(f.lines), self.cfg.window) if len(args) == 2 else 1
        )
        return self._window(f)

    def _cmd_goto(self, command: str) -> str:
        args = self._args(command)
        if len(args) != 1 or not args[0].isdigit():
            raise ViewerError("usage: goto LINE")
        path = self._require_open()
        f = FileLines.from_bytes(self.sandbox.read_file(path))
        line = int(args[0])
        if not 1 <= line <= max(1, len(f.lines)):
            raise ViewerError(f"LINE must be between 1 and {len(f.lines)}, got {line}")
        self.view.top = top_for_line(line, len(f.lines), self.cfg.window)
        return self._window(f)

    def _scroll(self, command: str, delta: int) -> str:
        if command.strip() not in ("scroll_up", "scroll_down"):
            raise ViewerError(f"`{command.split()[0]}` takes no arguments")
        self._require_open()
        self.view.top += delta
        return self._window()

    def _cmd_scroll_down(self, command: str) -> str:
        return self._scroll(command, self.cfg.window)

    def _cmd_scroll_up(self, command: str) -> str:
        return self._scroll(command, -self.cfg.window)

    def _cmd_create(self, command: str) -> str:
        args = self._args(command)
        if len(args) != 1:
            raise ViewerError("usage: create FILE")
        path = self._abs(args[0])
        if self._kind(path) != "none":
            raise ViewerError(f"{path} already exists; use `open {args[0]}` to view it")
        r = self._exec(f"mkdir -p -- {shlex.quote(posixpath.dirname(path))}", 30)
        if r.exit_code != 0:
            raise ViewerError(f"cannot create {path}: {r.output.decode('utf-8', 'backslashreplace').strip()}")
        self.sandbox.write_file(path, b"")
        self.view = ViewerState(path, 1)
        return self._window(FileLines([], True))

    def _cmd_edit(self, command: str) -> str:
        head, _, body = command.partition("\n")
        m = _EDIT_HEAD.fullmatch(head.strip())
        if not m:
            raise ViewerError("usage: edit START:END, then the replacement lines, then a line `end_of_edit`")
        path = self._require_open()
        lines = body.split("\n") if body else []
        if lines and lines[-1].strip() == "end_of_edit":
            lines = lines[:-1]
        start, end = int(m.group(1)), int(m.group(2))
        f = apply_edit(FileLines.from_bytes(self.sandbox.read_file(path)), start, end, lines)
        self.sandbox.write_file(path, f.to_bytes())
        self.view.top = top_for_line(start, len(f.lines), self.cfg.window)
        return self._window(f)

    def _cmd_search_file(self, command: str) -> str:
        args = self._args(command)
        if not 1 <= len(args) <= 2:
            raise ViewerError("usage: search_file TERM [FILE] (quote TERM if it has spaces)")
        path = self._abs(args[1]) if len(args) == 2 else self._require_open()
        term = args[0]
        hits = search_lines(self._read(path), term, self.cfg.search_max_matches)
        if not hits:
            return f'No matches found for "{term}" in {path}'
        if len(hits) > self.cfg.search_max_matches:
            return (
                f'More than {self.cfg.search_max_matches} lines match "{term}" in {path}; '
                "please narrow the search."
            )
        body = "\n".join(f"Line {i}: {line}" for i, line in hits)
        return f'Found {len(hits)} matches for "{term}" in {path}:\n{body}\nEnd of matches for "{term}" in {path}'

    def _cmd_replace(self, command: str) -> str:
        args = self._args(command)
        replace_all = "--replace-all" in args
        args = [a for a in args if a != "--replace-all"]
        if len(args) != 2 or not args[0]:
            raise ViewerError("usage: replace SEARCH REPLACE [--replace-all] (quote SEARCH and REPLACE)")
        search, repl = args
        path = self._require_open()
        data = self.sandbox.read_file(path).decode("utf-8", "surrogateescape")
        count = data.count(search)
        if count == 0:
            raise ViewerError(f"SEARCH text not found in {path}; nothing replaced")
        if count > 1 and not replace_all:
            raise ViewerError(
                f"SEARCH text occurs {count} times in {path}; make it unique or add --replace-all"
            )
        first_line = data[: data.index(search)].count("\n") + 1
        new = data.replace(search, repl) if replace_all else data.replace(search, repl, 1)
        self.sandbox.write_file(path, new.encode("utf-8", "surrogateescape"))
        f = FileLines.from_bytes(new.encode("utf-8", "surrogateescape"))
        self.view.top = top_for_line(first_line, len(f.lines), self.cfg.window)
        n = count if replace_all else 1
        return f"Replaced {n} occurrence{'s' * (n != 1)}.\n" + self._window(f)

    # ---- the answer -----------------------------------------------------------------------------
    def patch(self) -> str:
        """The working tree's changes against the task's pristine repository (new files included, bytecode caches
        left out), as a git diff the host takes (Sandbox.host_patch, sandbox/host_diff.py).

        Nothing in the sandbox takes part: its shell is the agent's (functions, aliases, `eval` redefined, PATH,
        BASH_ENV, git config, processes still rewriting files), so a diff run there prints what the agent chose,
        and a broken or committed-to .git changes nothing here. What the agent can still shape is the workspace's
        content, which the sanitiser and the grader read as untrusted text. SandboxError when the sandbox is gone.
        """
        return self.sandbox.host_patch(PATCH_MAX_BYTES)
