"""Mutants of a module's top-level constants and tables, which mutmut leaves alone (it mutates function bodies).

Where a module keeps its policy in data (the sanitiser's protected names, seccomp's refused calls, a canary
verdict's outcomes), a one-entry regression is an edit of that data. For each top-level assignment
(`NAME = ...` or `NAME: T = ...`) this makes one mutant per:

- element of a tuple, list or set literal, and entry of a dict literal: removed;
- number: n -> n + 1; bool: flipped; string: "XX" + s + "XX" (as mutmut does inside functions), except the
  strings that name a table's entries (elements, dict keys): their removal is that mutant already.

The same mutants are made in the bodies of the functions mutmut 3 leaves alone: those under a decorator other
than staticmethod and classmethod (functools.lru_cache, property). Not mutated: dunder names, f-strings, the
element types of a subscript (`dict[str, int]`), and whatever would not compile. tools/mutate.py writes each mutant into a copy of the tree and runs the tests there, so processes
the tests start import it too.

    for m in constant_mutants(Path("swe_megatron/grading/sanitize.py").read_text()):
        print(m.line, m.old, "->", m.new)
"""

from __future__ import annotations

import ast
from dataclasses import dataclass


@dataclass(frozen=True)
class ConstantMutant:
    """One edit of a top-level constant: where, what it replaced, and the module's whole mutated text."""

    name: str
    """The assigned name and a counter, e.g. `INTERNAL_DIRS__const_3` (unique in its module)."""
    line: int
    """The edited text's first line (1-based)."""
    old: str
    """The source text replaced."""
    new: str
    """Its replacement ("" for a removed element)."""
    source: str
    """The module's text with the edit."""


def _offsets(source: str):
    """(line, UTF-8 column) of the ast -> index into `source`."""
    starts, pos = [], 0
    for line in source.splitlines(keepends=True):
        starts.append(pos)
        pos += len(line)
    lines = source.splitlines(keepends=True)

    def at(lineno: int, col: int) -> int:
        return starts[lineno - 1] + len(lines[lineno - 1].encode()[:col].decode(errors="replace"))

    return at


def _targets(node: ast.stmt) -> tuple[str, ast.expr] | None:
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id, node.value
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
        return node.target.id, node.value
    return None


def _edits(value: ast.expr, at) -> list[tuple[int, int, str]]:
    """(start, end, replacement) of every mutation inside one assigned value."""
    skip: set[int] = set()
    for node in ast.walk(value):
        if isinstance(node, (ast.JoinedStr, ast.Subscript)):
            inner = node.values if isinstance(node, ast.JoinedStr) else [node.slice]
            skip |= {id(n) for part in inner for n in ast.walk(part)}
    span = lambda n: (at(n.lineno, n.col_offset), at(n.end_lineno, n.end_col_offset))  # noqa: E731
    edits = []
    for node in ast.walk(value):
        if id(node) in skip:
            continue
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            items = [span(e) for e in node.elts]
            # A name in a table (a string element, a dict key) is mutated by its removal only: "XX" + name + "XX"
            # is the same table without it (plus a name nothing uses).
            skip |= {id(e) for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
        elif isinstance(node, ast.Dict):
            items = [(span(k)[0], span(v)[1]) for k, v in zip(node.keys, node.values) if k is not None]
            skip |= {id(k) for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
        else:
            items = []
        for i, (start, end) in enumerate(items):
            if i + 1 < len(items):
                edits.append((start, items[i + 1][0], ""))  # the element and the separator after it
            elif i:
                edits.append((items[i - 1][1], end, ""))  # the last: the separator before it too
            else:
                edits.append((start, end, ""))
        if isinstance(node, ast.Constant):
            v = node.value
            if isinstance(v, bool):
                new = repr(not v)
            elif isinstance(v, (int, float)):
                new = repr(v + 1)
            elif isinstance(v, str):
                new = repr("XX" + v + "XX")
            else:
                continue
            edits.append((*span(node), new))
    return edits


def _decorated(tree: ast.Module):
    """Top-level functions and methods of top-level classes under a decorator mutmut skips (all but
    staticmethod and classmethod: functools.lru_cache, property, contextmanager...)."""
    scopes = [tree.body] + [n.body for n in tree.body if isinstance(n, ast.ClassDef)]
    for body in scopes:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                not (isinstance(d, ast.Name) and d.id in ("staticmethod", "classmethod"))
                for d in node.decorator_list
            ):
                yield node


def _body_values(func: ast.FunctionDef | ast.AsyncFunctionDef):
    """The expressions of every statement in func's body (its docstring, decorators and signature left out)."""
    body = func.body[1:] if ast.get_docstring(func) is not None else func.body
    for stmt in (n for top in body for n in ast.walk(top) if isinstance(n, ast.stmt)):
        for _, value in ast.iter_fields(stmt):
            for v in value if isinstance(value, list) else [value]:
                if isinstance(v, ast.expr):
                    yield v


def constant_mutants(source: str) -> list[ConstantMutant]:
    """Every mutant of the module's top-level constants and tables, and of the bodies of the functions mutmut
    skips (see the module docstring), in source order."""
    at = _offsets(source)
    out: list[ConstantMutant] = []
    tree = ast.parse(source)
    values = [t for t in map(_targets, tree.body) if t is not None and not t[0].startswith("__")]
    values += [(f.name, v) for f in _decorated(tree) for v in _body_values(f)]
    for name, value in values:
        for start, end, new in sorted(_edits(value, at)):
            text = source[:start] + new + source[end:]
            try:
                compile(text, "<mutant>", "exec")
            except SyntaxError:
                continue
            if text == source:
                continue
            line = source.count("\n", 0, start) + 1
            out.append(ConstantMutant(f"{name}__const_{len(out) + 1}", line, source[start:end], new, text))
    return out
