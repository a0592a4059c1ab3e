"""Exactly one fenced command block per assistant turn; anything else is a format error."""

from __future__ import annotations

import re

# A fence opens at the start of a line with ``` and an optional info string, and closes with ``` on a
# line of its own. Non-greedy so that two blocks are two matches.
_BLOCK = re.compile(r"^```[^\n`]*\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)


class FormatError(Exception):
    """The turn held zero or several command blocks; `count` says how many."""

    def __init__(self, count: int):
        super().__init__(f"expected exactly one fenced command block, found {count}")
        self.count = count


def parse_action(text: str) -> str:
    """The command inside the single fenced block of `text` (trailing whitespace trimmed).

    Raises FormatError when there is not exactly one block, or the block is empty.
    """
    blocks = _BLOCK.findall(text)
    if len(blocks) != 1:
        raise FormatError(len(blocks))
    command = blocks[0].strip("\n").rstrip()
    if not command.strip():
        raise FormatError(0)
    return command
