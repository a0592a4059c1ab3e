"""TEST FAKE at the engine boundary: a scripted policy that plays fixed assistant turns.

`ScriptedPolicy` answers `generate` with the next turn of the script of the session's task, tokenised with
the real tokenizer and closed with the end-of-turn token (logprob 0: the script is deterministic). The turn
index is read from the prompt (how many assistant turns it already holds), so a retried episode replays.
`gold_patch_script` turns a task's gold patch into the interface's own commands (open + edit per hunk,
create for new files), so a full rollout can reach reward 1 through the real sandbox and grader.
"""

from __future__ import annotations

from unidiff import PatchSet

from swe_megatron.agent.tokens import ChatFormat
from swe_megatron.engine.base import Generation

SESSION_SEP = "/"
"""Session keys are "TASK_ID/SAMPLE/ATTEMPT"; the scripted policy picks the script of "TASK_ID/SAMPLE", else
of TASK_ID."""


def _block(reason: str, command: str) -> str:
    return f"{reason}\n```\n{command}\n```"


def gold_patch_script(patch: str) -> list[str]:
    """Assistant turns that apply `patch` with open/edit/create (hunks bottom-up so line numbers hold), then submit."""
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
        for hunk in sorted(pf, key=lambda h: h.source_start, reverse=True):
            new = [line.value.rstrip("\n") for line in hunk if not line.is_removed]
            if hunk.source_length == 0:  # pure insertion after line source_start
                start, end = hunk.source_start + 1, hunk.source_start
            else:
                start, end = hunk.source_start, hunk.source_start + hunk.source_length - 1
            body = "\n".join([f"edit {start}:{end}", *new, "end_of_edit"])
            turns.append(_block(f"I change lines {start}-{end} of {path}.", body))
    turns.append(_block("The fix is in place.", "submit"))
    return turns


class ScriptedPolicy:
    """Plays `scripts["task_id/sample"]` or else `scripts[task_id]` turn by turn (then `submit`); a labelled
    fake, never a model."""

    def __init__(self, chat: ChatFormat, scripts: dict[str, list[str]]):
        self.chat = chat
        self.scripts = scripts
        gen_prompt = chat.render([{"role": "user", "content": "x"}], add_generation_prompt=True)
        self._marker = gen_prompt[len(chat.render([{"role": "user", "content": "x"}], False)) :].strip()

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
