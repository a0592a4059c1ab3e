"""TEST FAKE at the engine boundary: a scripted policy that plays fixed assistant turns.

`ScriptedPolicy` answers `generate` with the next turn of the script of the session's task, tokenised with
the real tokenizer and closed with the end-of-turn token (logprob 0: the script is deterministic). The turn
index is read from the prompt (how many assistant turns it already holds), so a retried episode replays.
`gold_patch_script` turns a task's gold patch into the interface's own commands (open + edit per run of
changed lines, create for new files), each turn within the engine's per-turn token cap, so a full rollout can
reach reward 1 through the real sandbox and grader; `ScriptedPolicy.problems` names the scripts that still
cannot (a single line longer than the cap, more turns than t_max).
"""

from __future__ import annotations

from collections.abc import Callable

from unidiff import PatchSet

from swe_megatron.agent.tokens import ChatFormat
from swe_megatron.engine.base import Generation

SESSION_SEP = "/"
"""Session keys are "TASK_ID/SAMPLE/ATTEMPT"; the scripted policy picks the script of "TASK_ID/SAMPLE", else
of TASK_ID."""


def _block(reason: str, command: str) -> str:
    return f"{reason}\n```\n{command}\n```"


def _changes(hunk) -> list[tuple[int, int, list[str]]]:
    """(start, end, new lines) per run of changed lines of a hunk: source lines start..end become the new lines
    (end = start - 1: inserted before line start). Context lines are left alone, so edits stay short."""
    out: list[tuple[int, int, list[str]]] = []
    # The source line before the hunk's first line ("@@ -5,0" inserts after line 5).
    last = hunk.source_start - 1 if hunk.source_length else hunk.source_start
    run: list | None = None
    for line in hunk:
        if line.is_context:
            if run is not None:
                out.append(tuple(run))
                run = None
            last = line.source_line_no
        elif line.is_removed or line.is_added:  # not "\ No newline at end of file"
            if run is None:
                run = [last + 1, last, []]
            if line.is_removed:
                run[1] = last = line.source_line_no
            else:
                run[2].append(line.value.rstrip("\n"))
    if run is not None:
        out.append(tuple(run))
    return out


def _edit_turns(path: str, start: int, end: int, new: list[str], fits: Callable[[str], bool]) -> list[str]:
    """Turns that replace lines start..end of `path` with `new`: one edit when it fits, else the first edit
    replaces the range with as many lines as fit and the next ones insert the rest below them."""

    def turn(s: int, e: int, lines: list[str]) -> str:
        return _block(
            f"I change lines {s}-{e} of {path}.", "\n".join([f"edit {s}:{e}", *lines, "end_of_edit"])
        )

    turns, i, s, e = [], 0, start, end
    while not turns or i < len(new):
        k = len(new)
        # Else the longest run of lines that fits, at least one (a line too long for any turn stays in; the
        # rollout names it through ScriptedPolicy.problems).
        if not fits(turn(s, e, new[i:k])):
            k = i + 1
            while k < len(new) and fits(turn(s, e, new[i : k + 1])):
                k += 1
        turns.append(turn(s, e, new[i:k]))
        s, e, i = s + k - i, s + k - i - 1, k
    return turns


def gold_patch_script(patch: str, fits: Callable[[str], bool] = lambda turn: True) -> list[str]:
    """Assistant turns that apply `patch` with open/edit/create, then submit: one edit per run of changed lines
    (bottom-up, so line numbers hold), split into several edits where a turn would not pass `fits` (e.g.
    `turn_fits(chat, sampling.max_tokens_per_turn)`: an engine cuts a longer turn)."""
    turns = []
    for pf in PatchSet(patch):
        path = pf.path
        if pf.is_removed_file:
            turns.append(_block(f"{path} is no longer needed.", f"rm {path}"))
            continue
        if pf.is_added_file:
            turns.append(_block(f"I create {path}.", f"create {path}"))
        else:
            turns.append(_block(f"Let me open {path}.", f"open {path}"))
        changes = [c for hunk in pf for c in _changes(hunk)]
        for start, end, new in sorted(changes, key=lambda c: c[0], reverse=True):
            turns += _edit_turns(path, start, end, new, fits)
    turns.append(_block("The fix is in place.", "submit"))
    return turns


def turn_fits(chat: ChatFormat, max_tokens: int) -> Callable[[str], bool]:
    """Whether an assistant turn (its tokens and the end-of-turn token) fits in max_tokens, as ScriptedPolicy
    plays it."""
    return lambda text: len(chat.encode(text)) + 1 <= max_tokens


class ScriptedPolicy:
    """Plays `scripts["task_id/sample"]` or else `scripts[task_id]` turn by turn (then `submit`); a labelled
    fake, never a model."""

    def __init__(self, chat: ChatFormat, scripts: dict[str, list[str]]):
        self.chat = chat
        self.scripts = scripts
        gen_prompt = chat.render([{"role": "user", "content": "x"}], add_generation_prompt=True)
        self._marker = gen_prompt[len(chat.render([{"role": "user", "content": "x"}], False)) :].strip()

    def problems(self, max_tokens: int, t_max: int) -> dict[str, str]:
        """Why a script cannot play out within the episode limits, by script key: a turn an engine would cut at
        max_tokens (sampling.max_tokens_per_turn), or more turns than t_max (the episode ends before submit)."""
        fits, out = turn_fits(self.chat, max_tokens), {}
        for key, script in self.scripts.items():
            long = [j for j, text in enumerate(script) if not fits(text)]
            if long:
                n = len(self.chat.encode(script[long[0]])) + 1
                out[key] = (f"turn {long[0] + 1} of {len(script)} needs {n} tokens, more than "
                            f"sampling.max_tokens_per_turn={max_tokens}")  # fmt: skip
            elif len(script) > t_max:
                out[key] = f"the script needs {len(script)} turns, more than the stage's t_max={t_max}"
        return out

    def turn_index(self, prompt_ids: list[int]) -> int:
        """Assistant turns already in the prompt (the prompt ends with one generation prompt)."""
        return self.chat.decode(prompt_ids).count(self._marker) - 1

    def generate(self, prompt_ids: list[int], max_tokens: int, session: str = "") -> Generation:
        """The script's next turn as token ids (cut at max_tokens like an engine would)."""
        task, sample = (session.split(SESSION_SEP) + [""])[:2]
        script = self.scripts.get(f"{task}{SESSION_SEP}{sample}", self.scripts.get(task, []))
        j = self.turn_index(prompt_ids)
        text = script[j] if j < len(script) else _block("Done.", "submit")
        ids = self.chat.encode(text) + [self.chat.eos_id]
        if len(ids) > max_tokens:
            return Generation(ids[:max_tokens], [0.0] * max_tokens, "length")
        return Generation(ids, [0.0] * len(ids), "stop")

    def end_session(self, session: str) -> None:
        """Stateless."""

    def reload_weights(self, path: str) -> None:
        """A script has no weights."""
