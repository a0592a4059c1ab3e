"""The windowed file viewer and line edits, as pure functions over a file's lines.

Files are decoded with `surrogateescape` so that bytes which are not UTF-8 survive an edit of other lines
unchanged; what the model sees is decoded with `backslashreplace` (`display`).
"""

from __future__ import annotations

from dataclasses import dataclass


class ViewerError(ValueError):
    """A viewer command the model got wrong (bad line range, no open file); shown to it as the output."""


@dataclass
class FileLines:
    """A text file as lines without their newlines, and whether it ended with one."""

    lines: list[str]
    """The file's lines (surrogate-escaped str)."""
    trailing_newline: bool = True
    """The file ended with a newline."""

    @classmethod
    def from_bytes(cls, data: bytes) -> FileLines:
        """Split raw file content into lines."""
        text = data.decode("utf-8", "surrogateescape")
        if not text:
            return cls([], True)
        trailing = text.endswith("\n")
        return cls((text[:-1] if trailing else text).split("\n"), trailing)

    def to_bytes(self) -> bytes:
        """The file content these lines stand for (bytes not valid UTF-8 restored as they were)."""
        if not self.lines:
            return b""
        text = "\n".join(self.lines) + ("\n" if self.trailing_newline else "")
        return text.encode("utf-8", "surrogateescape")


def display(text: str) -> str:
    """Text for the model: undecodable bytes shown as \\xNN escapes."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def clamp_top(top: int, n_lines: int, window: int) -> int:
    """First line (1-based) of a window that stays inside a file of n_lines."""
    return max(1, min(top, n_lines - window + 1))


def top_for_line(line: int, n_lines: int, window: int) -> int:
    """First line of a window that shows `line` about a third of the way down."""
    return clamp_top(line - window // 3, n_lines, window)


def render_window(path: str, f: FileLines, top: int, window: int) -> str:
    """`[File: PATH (N lines total)]`, the numbered lines of the window, and how many lie above/below."""
    n = len(f.lines)
    top = clamp_top(top, n, window)
    end = min(n, top + window - 1)
    out = [f"[File: {path} ({n} lines total)]"]
    if top > 1:
        out.append(f"({top - 1} more lines above)")
    out += [f"{i}:{display(f.lines[i - 1])}" for i in range(top, end + 1)]
    if end < n:
        out.append(f"({n - end} more lines below)")
    return "\n".join(out)


def apply_edit(f: FileLines, start: int, end: int, replacement: list[str]) -> FileLines:
    """Replace lines start..end (1-based, inclusive) with `replacement`; end = start - 1 inserts before start."""
    n = len(f.lines)
    if start < 1 or start > n + 1:
        raise ViewerError(f"START must be between 1 and {n + 1} (the file has {n} lines), got {start}")
    if end < start - 1 or end > n:
        raise ViewerError(
            f"END must be between START - 1 ({start - 1}, to insert) and {n} (the last line), got {end}"
        )
    lines = f.lines[: start - 1] + list(replacement) + f.lines[end:]
    return FileLines(lines, f.trailing_newline or n == 0)


def search_lines(f: FileLines, term: str, max_matches: int) -> list[tuple[int, str]]:
    """(line number, displayed line) of every line holding `term`, at most max_matches + 1 of them."""
    hits = []
    for i, line in enumerate(f.lines, 1):
        if term in line:
            hits.append((i, display(line)))
            if len(hits) > max_matches:
                break
    return hits
