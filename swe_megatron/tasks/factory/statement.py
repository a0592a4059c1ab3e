"""Problem statements that read like bug reports: the public API involved and the symptom.

Built from what a hidden failing test showed (the failing check and pytest's crash message), with every
mention of test names, test files, temporary paths and memory addresses taken out. The mutation itself
(file, line, operator) never appears.
"""

from __future__ import annotations

import random
import re

MAX_MESSAGE_LINES = 12
MAX_OUTPUT_LINES = 20
MAX_LINE_CHARS = 300

_TITLES_ASSERT = (
    "`{api}` returns a wrong result",
    "Wrong result from `{api}`",
    "`{api}` gives an unexpected result",
)
_TITLES_RAISE = (
    "`{api}` raises {exc}",
    "Unexpected {exc} from `{api}`",
    "`{api}` fails with {exc}",
)
_INTROS = (
    "Using {library}, a check in my code that uses `{api}` fails:",
    "After installing {library}, this check involving `{api}` no longer holds:",
    "I hit this with {library} while calling `{api}`:",
)
_OUTROS = (
    "I expected the check to pass; `{api}` should behave as documented.",
    "The expected behaviour is the one the check describes. Could `{api}` be fixed?",
    "This looks like a bug in `{api}` (or in something it relies on).",
)


def scrub(text: str, forbidden: list[str]) -> list[str]:
    """Lines of text that mention none of `forbidden` (test names, file names) and no file paths; memory
    addresses are masked."""
    out = []
    for line in text.splitlines():
        line = re.sub(r"0x[0-9a-fA-F]{6,}", "0x...", line.rstrip())
        if any(re.search(rf"(?<![A-Za-z0-9_]){re.escape(f)}(?![A-Za-z0-9_])", line) for f in forbidden if f):
            continue
        if re.search(r"\.py\b|/tmp/|swe-probe|_swe_megatron", line):
            continue
        if line.strip() and not line.strip(" ^~"):
            continue  # the traceback's position markers
        if len(line) > MAX_LINE_CHARS:
            line = line[:MAX_LINE_CHARS] + " ..."
        out.append(line)
    while out and not out[-1].strip():
        out.pop()
    return out


def problem_statement(
    *,
    library: str,
    api: str,
    exc_type: str,
    message: str,
    source: list[str],
    forbidden: list[str],
    seed: int,
    output: list[str] | tuple[str, ...] = (),
) -> str:
    """A bug report: title, the failing check (when it can be quoted), the observed error, the expectation.

    library: "toolz 1.1.0"; api: the public name involved; exc_type/message/source/output: the failing
    test's exception type, crash message, failing line(s) and printed output (quoted when the message alone
    says nothing); forbidden: names that must not appear (hidden test names, test file names); seed picks
    the wording.
    """
    rng = random.Random(seed)
    check = scrub("\n".join(source), forbidden)
    observed = scrub(message, forbidden)[:MAX_MESSAGE_LINES]
    printed = scrub("\n".join(output), forbidden)[:MAX_OUTPUT_LINES]
    is_assert = exc_type in ("AssertionError", "")
    title = rng.choice(_TITLES_ASSERT if is_assert else _TITLES_RAISE).format(api=api, exc=exc_type)
    parts = [title, ""]
    if check:
        parts += [rng.choice(_INTROS).format(library=library, api=api), ""]
        parts += [f"    {line}" for line in check] + [""]
        parts += ["fails with:" if is_assert else f"raises {exc_type}:", ""]
    else:
        parts += [f"With {library}, calling `{api}` in my code fails with:", ""]
    if observed:
        if not is_assert and not observed[0].startswith(exc_type):
            observed[0] = f"{exc_type}: {observed[0]}"
        parts += [f"    {line}" for line in observed] + [""]
    else:
        parts += [f"    {exc_type or 'AssertionError'}", ""]
    if printed and len(" ".join(observed)) < 60:  # a short message: what the test printed says more
        parts += ["What it printed:", ""] + [f"    {line}" for line in printed] + [""]
    parts.append(rng.choice(_OUTROS).format(api=api))
    return "\n".join(parts) + "\n"
