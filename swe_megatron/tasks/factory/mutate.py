"""Procedural bug injection: small AST-located edits inside function bodies, applied to the source text.

Each mutation replaces one byte span of the file (the operator token, a constant, an argument pair ...), so
the gold patch that undoes it is a one- or two-line diff and the rest of the file keeps its formatting.
Only statements in function bodies are touched: not decorators, default values or annotations (they run
at import time), not docstrings, `raise`/`assert` statements or f-strings (message-only changes).

Operators (name: what it does):
  binary_operator      a + b -> a - b, * <-> /, // -> /, % -> //, ** -> *, << <-> >>, & <-> |, ^ -> |
  comparison           < <-> <=, > <-> >=, == <-> !=, is <-> is not, in <-> not in
  boolean_operator     and <-> or
  drop_not             not x -> x
  negate_condition     if c: -> if not (c):
  constant_off_by_one  integer n -> n + 1 and n - 1
  boolean_constant     True <-> False
  swap_arguments       f(a, b, ...) -> f(b, a, ...)
  augmented_assignment += <-> -=
  min_max              min <-> max, any <-> all
  break_continue       break <-> continue
"""

from __future__ import annotations

import ast
import random
from dataclasses import asdict, dataclass

OPERATORS = (
    "binary_operator",
    "comparison",
    "boolean_operator",
    "drop_not",
    "negate_condition",
    "constant_off_by_one",
    "boolean_constant",
    "swap_arguments",
    "augmented_assignment",
    "min_max",
    "break_continue",
)

_BINOP = {
    ast.Add: ("+", "-"),
    ast.Sub: ("-", "+"),
    ast.Mult: ("*", "/"),
    ast.Div: ("/", "*"),
    ast.FloorDiv: ("//", "/"),
    ast.Mod: ("%", "//"),
    ast.Pow: ("**", "*"),
    ast.LShift: ("<<", ">>"),
    ast.RShift: (">>", "<<"),
    ast.BitAnd: ("&", "|"),
    ast.BitOr: ("|", "&"),
    ast.BitXor: ("^", "|"),
}
_CMP = {
    ast.Lt: ("<", "<="),
    ast.LtE: ("<=", "<"),
    ast.Gt: (">", ">="),
    ast.GtE: (">=", ">"),
    ast.Eq: ("==", "!="),
    ast.NotEq: ("!=", "=="),
    ast.Is: ("is", "is not"),
    ast.IsNot: ("is not", "is"),
    ast.In: ("in", "not in"),
    ast.NotIn: ("not in", "in"),
}
_AUG = {ast.Add: ("+=", "-="), ast.Sub: ("-=", "+=")}
_SWAP_NAMES = {"min": "max", "max": "min", "any": "all", "all": "any"}
# Calls whose swapped arguments only give a TypeError or a different message.
_NO_SWAP = {"isinstance", "issubclass", "getattr", "setattr", "hasattr", "super", "print", "format", "join"}
_NO_SWAP |= {"warn", "debug", "info", "warning", "error", "exception", "critical", "log"}


@dataclass(frozen=True, order=True)
class Mutation:
    """One edit: replace source bytes [start, end) by `replacement`."""

    file: str
    """Path of the file (as given to find_mutations)."""
    start: int
    """Byte offset where the replaced span starts."""
    end: int
    """Byte offset where it ends (exclusive)."""
    operator: str
    """Which operator made it (see OPERATORS)."""
    replacement: str
    """The new text of the span."""
    original: str
    """The old text of the span."""
    line: int
    """1-based line of the span's start."""
    function: str
    """Qualified name of the enclosing function (as in the code object's co_qualname)."""
    function_line: int
    """First line of the enclosing function, decorators included (the code object's co_firstlineno)."""

    def as_dict(self) -> dict:
        """A JSON-ready record (Task.extra["mutation"])."""
        return asdict(self)


def apply_mutation(source: str, m: Mutation) -> str:
    """The source with the mutation applied."""
    data = source.encode("utf-8")
    if data[m.start : m.end].decode("utf-8") != m.original:
        raise ValueError(
            f"{m.file}:{m.line}: the source does not hold {m.original!r} where the mutation expects it"
        )
    return (data[: m.start] + m.replacement.encode("utf-8") + data[m.end :]).decode("utf-8")


def find_mutations(
    source: str, file: str, functions: set[int] | None = None, *, verify: bool = True
) -> list[Mutation]:
    """Every mutation of the file, sorted by position; only inside functions whose first line is in `functions`
    (all functions when None). Each differs from the source; with verify, each also compiles (else the
    caller checks with `compiles` before use: compiling every mutant of a large module up front is slow)."""
    tree = ast.parse(source)
    data = source.encode("utf-8")
    line_starts = [0]
    for line in data.splitlines(keepends=True):
        line_starts.append(line_starts[-1] + len(line))
    finder = _Finder(data, line_starts, file)
    finder.visit_scope(tree.body, qual_prefix="", func=None)
    found = []
    for m in sorted(set(finder.found)):
        if functions is not None and m.function_line not in functions:
            continue
        if not verify or compiles(apply_mutation(source, m)):
            found.append(m)
    return found


def order_mutations(mutations: list[Mutation], seed: int) -> list[Mutation]:
    """A seeded order that spreads over functions and operators: rounds over the functions (in shuffled
    order), each taking that function's mutation of the operator used least so far (ties: shuffled order)."""
    rng = random.Random(seed)
    by_func: dict[tuple[str, int], list[Mutation]] = {}
    for m in sorted(mutations):
        by_func.setdefault((m.file, m.function_line), []).append(m)
    keys = sorted(by_func)
    rng.shuffle(keys)
    for k in keys:
        rng.shuffle(by_func[k])
    used: dict[str, int] = dict.fromkeys(OPERATORS, 0)
    out: list[Mutation] = []
    while len(out) < len(mutations):
        for k in keys:
            left = by_func[k]
            if left:
                pick = min(range(len(left)), key=lambda i: (used.get(left[i].operator, 0), i))
                m = left.pop(pick)
                used[m.operator] = used.get(m.operator, 0) + 1
                out.append(m)
    return out


def _stringy(node: ast.AST) -> bool:
    """A string literal, f-string, or a concatenation/formatting of one."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str | bytes)
    if isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Mod):
        return _stringy(node.left) or _stringy(node.right)
    return False


def compiles(source: str) -> bool:
    """Whether Python accepts the source."""
    try:
        compile(source, "<mutant>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True


class _Finder:
    """Walks function bodies and records candidate edits."""

    def __init__(self, data: bytes, line_starts: list[int], file: str):
        self.data, self.line_starts, self.file = data, line_starts, file
        self.found: list[Mutation] = []
        self.func: tuple[str, int] | None = None

    # -- positions ---------------------------------------------------------------------------------
    def off(self, lineno: int, col: int) -> int:
        return self.line_starts[lineno - 1] + col

    def span(self, node: ast.AST) -> tuple[int, int]:
        return self.off(node.lineno, node.col_offset), self.off(node.end_lineno, node.end_col_offset)

    def text(self, start: int, end: int) -> str:
        return self.data[start:end].decode("utf-8")

    def line_of(self, offset: int) -> int:
        lo, hi = 0, len(self.line_starts) - 1
        while lo < hi:  # last line start <= offset
            mid = (lo + hi + 1) // 2
            if self.line_starts[mid] <= offset:
                lo = mid
            else:
                hi = mid - 1
        return lo + 1

    def add(self, start: int, end: int, operator: str, replacement: str) -> None:
        if self.func is None:
            return
        original = self.text(start, end)
        if original == replacement:
            return
        self.found.append(
            Mutation(
                file=self.file,
                start=start,
                end=end,
                operator=operator,
                replacement=replacement,
                original=original,
                line=self.line_of(start),
                function=self.func[0],
                function_line=self.func[1],
            )
        )

    def token_between(self, left: ast.AST, right: ast.AST, token: str) -> tuple[int, int] | None:
        """The span of `token` (possibly two words) between two nodes, when nothing but parentheses,
        whitespace and that token lie there."""
        start, end = self.off(left.end_lineno, left.end_col_offset), self.off(right.lineno, right.col_offset)
        gap = self.text(start, end)
        if "#" in gap or "\\" in gap:
            return None
        if gap.replace("(", " ").replace(")", " ").split() != token.split():
            return None
        first = token.split()[0]
        i = gap.find(first)
        j = gap.rfind(token.split()[-1]) + len(token.split()[-1])
        return start + i, start + j

    # -- scopes ------------------------------------------------------------------------------------
    def visit_scope(self, body: list[ast.stmt], qual_prefix: str, func: tuple[str, int] | None) -> None:
        for stmt in body:
            self.visit_stmt(stmt, qual_prefix, func)

    def visit_stmt(self, stmt: ast.stmt, qual_prefix: str, func: tuple[str, int] | None) -> None:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            first = min([stmt.lineno, *(d.lineno for d in stmt.decorator_list)])
            qual = f"{qual_prefix}{stmt.name}"
            body = stmt.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                body = body[1:]  # docstring
            self.visit_scope(body, f"{qual}.<locals>.", (qual, first))
            return
        if isinstance(stmt, ast.ClassDef):
            self.visit_scope(stmt.body, f"{qual_prefix}{stmt.name}.", None)
            return
        if func is None or isinstance(stmt, ast.Raise | ast.Assert):
            # Module and class bodies run at import time; raise/assert mostly carry messages.
            for child in ast.iter_child_nodes(stmt):
                if isinstance(child, ast.stmt):
                    self.visit_stmt(child, qual_prefix, func)
            return
        saved, self.func = self.func, func
        try:
            self.visit_statement_nodes(stmt, qual_prefix, func)
        finally:
            self.func = saved

    def visit_statement_nodes(self, stmt: ast.stmt, qual_prefix: str, func: tuple[str, int]) -> None:
        if isinstance(stmt, ast.If) and not (
            isinstance(stmt.test, ast.UnaryOp) and isinstance(stmt.test.op, ast.Not)
        ):
            s, e = self.span(stmt.test)
            self.add(s, e, "negate_condition", f"not ({self.text(s, e)})")
        if isinstance(stmt, ast.Break):
            s, e = self.span(stmt)
            self.add(s, e, "break_continue", "continue")
        if isinstance(stmt, ast.Continue):
            s, e = self.span(stmt)
            self.add(s, e, "break_continue", "break")
        if isinstance(stmt, ast.AugAssign) and type(stmt.op) in _AUG:
            old, new = _AUG[type(stmt.op)]
            sp = self.token_between(stmt.target, stmt.value, old)
            if sp:
                self.add(*sp, "augmented_assignment", new)
        self.visit_children(stmt, qual_prefix, func)

    def visit_children(self, node: ast.AST, qual_prefix: str, func: tuple[str, int]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt):
                self.visit_stmt(child, qual_prefix, func)
            elif isinstance(child, ast.expr | ast.keyword | ast.comprehension):
                self.visit_expr(child)
            elif isinstance(child, ast.excepthandler | ast.withitem | ast.match_case):
                self.visit_children(child, qual_prefix, func)  # their bodies are statements

    def visit_expr(self, node: ast.AST) -> None:
        if isinstance(node, ast.JoinedStr):
            return
        if isinstance(node, ast.Lambda):
            self.visit_expr(node.body)
            return
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOP:
            old, new = _BINOP[type(node.op)]
            is_str = _stringy(node.left) or _stringy(node.right)
            if not is_str:  # string concatenation / %-formatting: a mutant would only be a TypeError
                sp = self.token_between(node.left, node.right, old)
                if sp:
                    self.add(*sp, "binary_operator", new)
        elif isinstance(node, ast.Compare):
            items = [node.left, *node.comparators]
            for i, op in enumerate(node.ops):
                if type(op) in _CMP:
                    old, new = _CMP[type(op)]
                    sp = self.token_between(items[i], items[i + 1], old)
                    if sp:
                        self.add(*sp, "comparison", new)
        elif isinstance(node, ast.BoolOp) and len(node.values) == 2:
            old, new = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
            sp = self.token_between(node.values[0], node.values[1], old)
            if sp:
                self.add(*sp, "boolean_operator", new)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            s, _ = self.span(node)
            prefix = self.text(s, self.span(node.operand)[0])  # "not ", "not (", "not("
            if prefix.startswith("not") and "#" not in prefix and "\\" not in prefix:
                self.add(s, s + 3 + (len(prefix[3:]) - len(prefix[3:].lstrip())), "drop_not", "")
        elif isinstance(node, ast.Constant):
            if type(node.value) is bool:
                s, e = self.span(node)
                self.add(s, e, "boolean_constant", str(not node.value))
            elif type(node.value) is int:
                s, e = self.span(node)
                if self.text(s, e).isdigit():  # plain decimal literals only (not 0x.., 1_000)
                    self.add(s, e, "constant_off_by_one", str(node.value + 1))
                    if node.value > 0:
                        self.add(s, e, "constant_off_by_one", str(node.value - 1))
        elif isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name) and node.func.id in _SWAP_NAMES:
                s, e = self.span(node.func)
                self.add(s, e, "min_max", _SWAP_NAMES[node.func.id])
            args = node.args
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            if (
                len(args) >= 2
                and name not in _NO_SWAP
                and not any(isinstance(a, ast.Starred) for a in args[:2])
            ):
                a0, a1 = self.span(args[0]), self.span(args[1])
                t0, t1 = self.text(*a0), self.text(*a1)
                if t0 != t1 and a0[1] <= a1[0]:
                    between = self.text(a0[1], a1[0])
                    self.add(a0[0], a1[1], "swap_arguments", t1 + between + t0)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr | ast.comprehension | ast.keyword):
                self.visit_expr(child)
