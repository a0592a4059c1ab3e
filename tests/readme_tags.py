"""README.md's TensorBoard tag list as patterns, to compare with the tags a run writes (README cannot drift).

The list is the backticked items of README's **TensorBoard** paragraph: `group/{a,b}` expands to group/a and
group/b; `*` and `<word>` are wildcards for one or more tag segments or characters (`infra/<kind>`, `rft/*`).
"""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_tag_patterns(kind: str = "scalars") -> list[str]:
    """The tags README lists for one kind ("scalars", "histograms" or "text"), braces expanded."""
    text = README.read_text(encoding="utf-8")
    para = text[text.index("**TensorBoard**") :].split("\n\n", 1)[0]
    sections = dict(
        re.findall(r"(scalars|histograms|text):(.*?)(?=\b(?:scalars|histograms|text):|\Z)", para, re.S)
    )
    out = []
    for item in re.findall(r"`([^`]+)`", sections[kind]):
        item = re.sub(r"\s+", "", item)
        if "/" not in item or item.startswith("tensorboard"):
            continue
        m = re.fullmatch(r"(.*?)\{(.*)\}(.*)", item)
        out += [m.group(1) + x + m.group(3) for x in m.group(2).split(",")] if m else [item]
    return out


def matches(tag: str, pattern: str) -> bool:
    """Whether `tag` is one `pattern` names (`*`, `<word>`: wildcards)."""
    rx = re.escape(pattern).replace(r"\*", ".+")
    rx = re.sub(r"<\w+>", ".+", rx.replace(r"\<", "<").replace(r"\>", ">"))
    return re.fullmatch(rx, tag) is not None


def compare(written: set[str], kind: str = "scalars") -> tuple[list[str], list[str]]:
    """(tags written that README does not list, README entries without a wildcard that were not written)."""
    patterns = readme_tag_patterns(kind)
    unlisted = sorted(t for t in written if not any(matches(t, p) for p in patterns))
    unwritten = sorted(p for p in patterns if "*" not in p and "<" not in p and p not in written)
    return unlisted, unwritten
