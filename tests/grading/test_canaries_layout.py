"""Canary planting without pytest (grading/canaries.py): the file's own lines kept as written, twins laid out like
them, their fallbacks (nothing to copy, no listed test, an empty file), every kind of literal they swap and what
they swap it for, and the static checks the grader runs before planting (breakable). Fast: these are the tests
the mutation check runs (the pytest-running ones are in test_canaries.py)."""

from __future__ import annotations

import ast
import io
import random
import re
import string
import tokenize

from test_canaries import _defs

from swe_megatron.grading import canaries
from swe_megatron.grading.canaries import Canaries, breakable, plant

FILE = "pkg/tests/test_layout.py"
LAYOUT = """\
import pytest


def test_one():
    assert f(1) == "ab"


class TestX:
    def test_two(self):
        assert f(2) == 'cd'

    def test_three(self):
        assert f(3) == 4


def test_last():
    assert f(4) == 5
"""
LAYOUT_IDS = [
    f"{FILE}::test_one",
    f"{FILE}::TestX::test_two",
    f"{FILE}::TestX::test_three",
    f"{FILE}::test_last",
]


def _blank_lines_before(lines: list[str], line: int) -> int:
    """Blank lines right above 1-based `line`."""
    n = 0
    while line - 2 - n >= 0 and not lines[line - 2 - n].strip():
        n += 1
    return n


def _swapped(before: str, after: str) -> tuple[str, str]:
    """The one string or number token that differs between two one-literal-apart sources."""
    ta = [t.string for t in tokenize.generate_tokens(io.StringIO(before).readline)]
    tb = [t.string for t in tokenize.generate_tokens(io.StringIO(after).readline)]
    return next((a, b) for a, b in zip(ta, tb) if a != b)


def _parses_with_each_twin_once(c: Canaries) -> dict[str, ast.FunctionDef]:
    tree = ast.parse(c.text)
    names = [n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
    for node in c.expected:
        assert names.count(node.split("::")[-1]) == 1, (node, c.text)
    return {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}


def test_the_files_own_lines_stay_as_written_and_twins_are_laid_out_like_them():
    """Whatever the file's line ends (CRLF or CR kept: a string spanning lines keeps its value) and whether its last
    line ends in one, its lines come back unchanged and in order, the text ends in its line end, and the twins sit
    two blank lines from module-level code and one from a method, as the file has them."""
    variants = {
        "lf": LAYOUT,
        "crlf": LAYOUT.replace("\n", "\r\n"),
        "cr": LAYOUT.replace("\n", "\r"),
        "no final newline": LAYOUT.rstrip("\n"),
    }
    for label, source in variants.items():
        for seed in range(8):
            c = plant(FILE, source, LAYOUT_IDS, random.Random(seed))
            assert c.file == FILE
            out = io.StringIO(c.text, newline="").readlines()
            rest = iter(out)
            for line in io.StringIO(source, newline="").readlines():
                assert any(o == line or o == line + "\n" for o in rest), (label, seed, line)
            assert c.text.endswith("\r" if label == "cr" else "\n"), (label, seed)
            lines = c.text.splitlines()
            tree = ast.parse(c.text)
            for node in tree.body:
                if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                    assert _blank_lines_before(lines, first) == 2, (label, seed, node.name)
                if isinstance(node, ast.ClassDef):
                    for method in node.body[1:]:
                        assert _blank_lines_before(lines, method.lineno) == 1, (label, seed, method.name)


def test_a_broken_copy_swaps_in_another_constant_of_the_file_in_the_literals_own_quotes():
    """The twin's literal is one the file uses elsewhere (here: each other one of its type), written like the
    literal it replaces; copies name the test each twin copies."""
    originals = _defs(LAYOUT)
    file_constants = {"ab", "cd", 1, 2, 3, 4, 5}
    for seed in range(8):
        c = plant(FILE, LAYOUT, LAYOUT_IDS, random.Random(seed))
        after = _defs(c.text)
        must_fail = {k for k, v in c.expected.items() if v == "FAILED"}
        assert (
            len(must_fail) == 4 and list(c.expected.values()).count("PASSED") == 1
        )  # as docs/security.md says
        assert set(c.copies) == must_fail and not c.stand_ins
        for node in must_fail:
            anchor = originals[c.copies[node].split("::")[-1]][3]
            old, new = _swapped(anchor, after[node.split("::")[-1]][3])
            if old[0] in "'\"":
                assert new[0] == old[0], (old, new)  # the literal's own quotes
            new_value = ast.literal_eval(new)
            assert type(new_value) is type(ast.literal_eval(old)) and new_value in file_constants - {
                ast.literal_eval(old)
            }


KINDS = """\
def test_float():
    assert f() == 2.5


def test_bytes():
    assert f() == b"xy"


def test_bool():
    assert f() == True


def test_none():
    assert f() is None


def test_true():
    assert f() is True


def test_false():
    assert f() is False


def test_joined():
    expected = ",".join(["1", "2"])
    assert f() == expected


def test_more():
    assert g("3,4", "5", 7) == 0
"""


def test_every_kind_of_literal_is_swapped_for_another_of_its_kind():
    """float, bytes, bool and str literals are broken with another of their type, `is` a singleton with each of
    the two others (never itself), a part of a joined text with a constant that holds no separator."""
    seen: dict[str, set] = {}
    for name in ("float", "bytes", "bool", "none", "true", "false", "joined"):
        test_id = f"{FILE}::test_{name}"
        assert breakable(FILE, KINDS, [test_id]), name
        for seed in range(12):
            c = plant(FILE, KINDS, [test_id], random.Random(seed), fail_to_pass=[test_id])
            after = _defs(c.text)
            for node, want in c.expected.items():
                if want != "FAILED" or node in c.renamed:
                    continue
                old, new = _swapped(_defs(KINDS)[f"test_{name}"][3], after[node.split("::")[-1]][3])
                value, was = ast.literal_eval(new), ast.literal_eval(old)
                assert value != was and (type(value) is type(was) or {value, was} <= {True, False, None}), new
                seen.setdefault(name, set()).add(value)
    assert seen["none"] == {True, False} and seen["true"] == {False, None} and seen["false"] == {True, None}
    assert seen["bool"] == {False} and all(isinstance(v, float) for v in seen["float"])
    assert all("," not in v for v in seen["joined"]) and seen["joined"] - {"1", "2"}


def test_a_number_or_text_the_file_has_no_other_of_moves_by_a_little():
    """With no other constant of its type in the file: a number moves by 1 to 3 (only up below 3, so a count
    stays a count), a text or bytes changes one character to a lowercase letter (an empty one gets one)."""
    rng = random.Random(0)

    def draws(value):
        return {canaries._other(value, [], rng) for _ in range(1000)}

    assert draws(10) == {7, 8, 9, 11, 12, 13} and draws(3) == {0, 1, 2, 4, 5, 6}
    assert draws(0) == {1, 2, 3} and draws(1) == {2, 3, 4} and draws(2.5) == {3.5, 4.5, 5.5}
    assert draws("") == set(string.ascii_lowercase)
    assert draws(b"") == {c.encode() for c in string.ascii_lowercase}
    for value in ("ab", b"ab", "a"):
        got = draws(value)
        assert value not in got and all(len(g) == len(value) for g in got)
        assert all(sum(x != y for x, y in zip(g, value)) == 1 for g in got)
        letters = string.ascii_lowercase if isinstance(value, str) else string.ascii_lowercase.encode()
        assert all(
            ch in letters for g in got for ch in (g if isinstance(g, str) else [bytes([b]) for b in g])
        )
        assert len(got) == 25 * len(value)  # every position, every other letter


NOTHING_BREAKABLE = """\
def test_a():
    for x in (5, 9):
        assert x
"""


def test_twins_that_compare_two_constants_take_the_files_own_and_keep_one_type():
    """Where nothing can be copied: two of the file's constants (it has exactly two here), different for a
    must-fail twin and equal for the must-pass one; a type with one constant in the file is paired with a
    stand-in value of its own type."""
    for source, allowed in ((NOTHING_BREAKABLE, {5, 9}), (NOTHING_BREAKABLE.replace("9", '"ab"'), None)):
        for seed in range(8):
            c = plant("t.py", source, ["t.py::test_a"], random.Random(seed), fail_to_pass=["t.py::test_a"])
            defs = _parses_with_each_twin_once(c)
            for node, want in c.expected.items():
                if node in c.renamed:
                    continue
                test = defs[node.split("::")[-1]].body[0].test
                left, right = test.left.value, test.comparators[0].value
                assert type(left) is type(right) and (left == right) == (want == "PASSED"), (
                    node,
                    left,
                    right,
                )
                if allowed:
                    assert {left, right} <= allowed, (left, right)


def test_a_compared_pair_is_written_in_the_files_own_quotes():
    """Stand-in twins comparing two texts quote them as most of the file's strings are quoted."""
    double = 'def test_a():\n    for x in ("ab", "cd"):\n        assert x  # \'\n'
    single = "def test_a():\n    for x in ('ab', 'cd'):\n        assert x  # \"\n"
    for source, quote in ((double, '"'), (single, "'")):
        for seed in range(4):
            c = plant("t.py", source, ["t.py::test_a"], random.Random(seed), fail_to_pass=["t.py::test_a"])
            for node in c.expected:
                if node in c.renamed:
                    continue
                body = _defs(c.text)[node.split("::")[-1]][3].splitlines()[1]
                assert body.strip()[len("assert ")] == quote and body.count(quote) == 4, (source, body)


def test_twins_go_first_to_the_tests_that_can_be_broken_and_spread_over_them():
    """Four breakable FAIL_TO_PASS tests: each gets one twin copied from it. Two breakable among five: each of the
    two gets two, and none is a stand-in (a copy of another test than the one beside it)."""
    src = "".join(f"def test_b{i}():\n    assert f({i}) == {i + 10}\n\n\n" for i in range(4))
    src += "".join(f"def test_u{i}():\n    for x in (1, 2):\n        assert x\n\n\n" for i in range(3))
    four = [f"t.py::test_b{i}" for i in range(4)]
    mixed = ["t.py::test_b0", "t.py::test_b1", *(f"t.py::test_u{i}" for i in range(3))]
    for seed in range(6):
        c = plant("t.py", src, four, random.Random(seed), fail_to_pass=four)
        twins = [k for k, v in c.expected.items() if v == "FAILED" and k not in c.renamed]
        assert sorted(c.original_ids([c.copies[k] for k in twins])) == four, seed
        c = plant("t.py", src, mixed, random.Random(seed), fail_to_pass=mixed)
        twins = [k for k, v in c.expected.items() if v == "FAILED" and k not in c.renamed]
        assert not set(twins) & c.stand_ins, seed
        assert sorted(c.original_ids([c.copies[k] for k in twins])) == sorted(mixed[:2] * 2), seed


UNLISTED = """\
class TestA:
    def test_in_class(self):
        assert f() == 1


def test_module():
    assert f() == 2
"""


def test_a_file_without_the_listed_tests_gets_test_named_twins_at_its_end():
    """The listed ids are not in this file (or it is empty): the twins go after its text, named like its tests
    (or test_...), compare two constants (different for must-fail, equal for must-pass) and are stand-ins."""
    for source in (UNLISTED, ""):
        for seed in range(6):
            c = plant("t.py", source, ["t.py::test_absent"], random.Random(seed))
            assert c.text.startswith(source)
            defs = _parses_with_each_twin_once(c)
            assert len(c.expected) == 5 and all(k.count("::") == 1 for k in c.expected)
            assert c.stand_ins == {k for k, v in c.expected.items() if v == "FAILED"}
            for node, want in c.expected.items():
                name = node.split("::")[-1]
                assert name.startswith("test_")
                assert not source or set(name.split("_")[1:]) <= {
                    "in",
                    "class",
                    "module",
                    *canaries._FALLBACK_WORDS,
                }
                test = defs[name].body[0].test
                assert (test.left.value == test.comparators[0].value) == (want == "PASSED"), (node, c.text)
    nothing = plant(
        "t.py", "", [], random.Random(0), must_fail=0, must_pass=0
    )  # decoys only, in a file with no test
    assert nothing.text == "" and not nothing.expected


FIRST_LINE = 'def test_b():\n    assert g() == 2\ndef test_a(): assert g("def test_a") == 1\n'


def test_a_test_on_the_first_line_and_one_line_tests_are_copied_whole_and_once():
    """Twins put before line 1 come first, once; a one-line test's copy and rename change its name only."""
    for seed in range(8):
        ids = ["t.py::test_a", "t.py::test_b"]
        c = plant("t.py", FIRST_LINE, ids, random.Random(seed), fail_to_pass=ids)
        _parses_with_each_twin_once(c)
        copies_of_a = sum(1 for k in c.copies.values() if k == c.task_id("t.py::test_a"))
        assert c.text.count('g("def test_a")') == 1 + copies_of_a  # the real test's and its copies' text kept
        for old, new in c.renamed.items():
            assert f"def {new.split('::')[-1]}()" in c.text and f"def {old.split('::')[-1]}()" in c.text


INDENTED = """\
class TestTwo:
  def test_loop(self):
    for x in (1, 2):
      assert x

  def test_short(self): assert self


@mock.patch("os.getcwd")
def test_patched(getcwd):
    for x in (3, 4):
        assert x
"""
INDENTED_IDS = ["t.py::TestTwo::test_loop", "t.py::TestTwo::test_short", "t.py::test_patched"]


def test_stand_ins_take_the_anchors_indentation_and_no_parameter_a_decorator_supplies():
    """A stand-in's body is indented like its anchor's (two-space classes, a one-line test), and it takes no
    parameter a decorator supplies (mock.patch's `getcwd`)."""
    plants = [
        plant("t.py", INDENTED, INDENTED_IDS, random.Random(s), fail_to_pass=INDENTED_IDS) for s in range(8)
    ]
    for c in plants:
        defs = _parses_with_each_twin_once(c)
        lines = c.text.splitlines()
        decoy = defs["test_loop"]  # the real test_loop is renamed: this is its stand-in decoy
        assert lines[decoy.body[0].lineno - 1].startswith("    assert "), c.text  # test_loop's body indent
        for node in c.expected:
            if node.count("::") == 1:  # beside test_patched, whose `getcwd` mock.patch supplies
                assert [a.arg for a in defs[node.split("::")[-1]].args.args] == [], node


def test_breakable_says_whether_the_file_defines_a_failing_test_a_copy_can_break():
    src = (
        "import pytest\n\n\n@pytest.mark.parametrize('n', [1, 2])\ndef test_p(n):\n    assert f(n) == 3\n\n\n"
        "def test_loop():\n    for x in (1, 2):\n        assert x\n\n\nclass TestC:\n"
        "    def test_m(self):\n        assert f() == 'x'\n"
    )
    assert breakable("t.py", src, ["t.py::test_p[1]"])
    assert breakable("t.py", src, ["t.py::test_loop", "t.py::TestC::test_m"])
    assert not breakable("t.py", src, ["t.py::test_loop"])
    assert not breakable("t.py", src, ["other.py::test_p", "other.py::TestC::test_m", "t.py"])
    assert not breakable("t.py", src, ["t.py::TestC::test_m::x"]) and not breakable("t.py", src, [])
    assert not breakable("t.py", "def test_p(:\n", ["t.py::test_p"])


def test_renames_skip_other_files_tests_and_names_used_elsewhere_and_survive_a_base_class_cycle():
    src = (
        "def test_used():\n    assert f() == 1\n\n\ndef test_fine():\n    assert f() == 2\n\n\n"
        "def test_caller():\n    test_used()\n\n\n"
        "class TestA(TestB):\n    pass\n\n\nclass TestB(TestA):\n    pass\n\n\n"
        "class TestBase:\n    def test_deep(self):\n        assert f() == 3\n\n\n"
        "class TestMid(TestBase):\n    pass\n\n\nclass TestLeaf(TestMid):\n    pass\n"
    )
    f2p = ["other.py::test_fine", "t.py::test_used", "t.py::TestA::test_gone", "t.py::test_fine",
           "t.py::TestLeaf::test_deep"]  # fmt: skip
    c = plant("t.py", src, ["t.py::test_fine"], random.Random(0), fail_to_pass=f2p)
    assert sorted(c.renamed) == [
        "t.py::TestBase::test_deep",
        "t.py::TestLeaf::test_deep",
        "t.py::TestMid::test_deep",
        "t.py::test_fine",
    ]


SITE_EDGES = {  # a test's body -> the literals a copy may swap
    "assert 'a' is None": [],  # a literal on both sides: nothing to break
    "assert None is f()": [None],  # the singleton on the left
    "assert f() is None\n    assert g() == 1": [1],  # the last assertion counts, after an `is` one too
    "assert f() != 2\n    assert g() == 3": [3],  # ... and after one that is not an equality
    "checks[0](f(), 1)": [],  # a call of neither a name nor an attribute
    "self.assertEqual(f(), 4, 'message')": [4],  # the message is not a side
}


def test_the_literal_a_copy_swaps_is_in_the_last_equality_only_where_one_side_is_not_literal():
    for body, want in SITE_EDGES.items():
        src = f"def test_x():\n    {body}\n"
        d = canaries._test_defs(ast.parse(src), src.splitlines(True))[(None, "test_x")]
        assert [site.value for site in d.sites] == want, body


def test_words_and_names():
    assert canaries._words({(None, "test_Merge_x1_2x_abcdefghijkl_abcdefghijklm_ok"): 0}) == sorted(
        ["x1", "abcdefghijkl", "ok"]
    )
    rng = random.Random(0)
    words = ["alpha", "beta", "gamma"]
    three, four = set(), set()
    for _ in range(40):
        name = canaries._fresh_name("test_merge_with", words, set(), rng)
        assert name.startswith("test_merge_") and name.split("_")[2] in words
        three.add(name)
        parts = canaries._fresh_name("test_merge_with_keys", words, set(), rng).split("_")
        four.add(2 if parts[3] == "keys" else 3)
        assert (
            canaries._fresh_name("test_a_b", ["a", "b"], set(), rng).split("_")[2] in canaries._FALLBACK_WORDS
        )
    assert four == {2, 3} and len(three) == 3


NESTED = """\
def test_merge():
    assert f(0) == 1


def test_merge_with():
    assert f(1) == 2


def test_merge_list():
    assert f(2) == 3


def test_merge_with_list_of_dicts():
    assert f(3) == 4


def test_merge_with_keys_sorted():
    assert f(4) == 5


def test_merge_with_items_sorted():
    assert f(5) == 6


def test_merge_dict_sorted():
    assert f(6) == 7


def test_join_lists_sorted():
    assert f(7) == 8


def test_join_sets_sorted():
    assert f(8) == 9


def test_join_maps_sorted():
    assert f(9) == 10


def test_other_case():
    assert f(10) == 11
"""


def test_a_new_name_nests_among_the_files_test_names_as_the_old_one_does():
    # the decoy keeps the old name: a renamed test that lost its place (prefix of another, another plus a word)
    # stood out (every-canary figure of test_canary_features 0.64-0.68, one item per test, before)
    names = frozenset(n for _, n in canaries._test_defs(ast.parse(NESTED), NESTED.splitlines(True)))
    assert canaries._nesting("test_merge_with", names) == (True, True)
    assert canaries._nesting("test_merge", names) == (True, False)
    assert canaries._nesting("test_merge_list", names) == (False, True)
    assert canaries._nesting("test_other_case", names) == (False, False)
    ids = [f"{FILE}::{n}" for n in ("test_merge", "test_merge_with", "test_merge_list", "test_other_case")]
    for seed in range(20):
        c = plant(FILE, NESTED, ids, random.Random(seed), fail_to_pass=ids)
        made = [(old, new) for old, new in c.renamed.items()]
        made += [(c.copies.get(k, k), k) for k in c.expected if k not in c.renamed]  # twins: as their anchor
        for old, new in made:
            old, new = old.rsplit("::", 1)[1], new.rsplit("::", 1)[1]
            assert canaries._nesting(new, names) == canaries._nesting(old, names), (old, new)
    rng = random.Random(0)
    # a free prefix of another name, of the old name's word count where there is one, else any
    got = {canaries._fresh_name("test_merge", ["x", "y"], set(names), rng, names) for _ in range(40)}
    assert got == {"test_join", "test_other"}
    fewer = set(names) | got
    got = {canaries._fresh_name("test_merge", ["x", "y"], fewer, rng, names) for _ in range(40)}
    assert got == {"test_join_lists", "test_join_sets", "test_join_maps", "test_merge_with_list_of"}
    got = {canaries._fresh_name("test_merge_with", ["x", "y"], set(names), rng, names) for _ in range(20)}
    assert got == {"test_merge_dict"}
    got = {canaries._fresh_name("test_merge_list", ["x", "y"], set(names), rng, names) for _ in range(20)}
    assert got == {"test_merge_x", "test_merge_y"}  # the last word replaced: still test_merge plus a word
    got = {canaries._fresh_name("test_other_case", ["x", "y"], set(names), rng, names) for _ in range(20)}
    assert got == {"test_other_x", "test_other_y"}


def test_constants_and_added_stand_ins():
    got = canaries._constants(ast.parse(f"x = ('{'a' * 16}', '{'b' * 17}')\n"))
    assert got == ["a" * 16]
    assert len(canaries._constants(ast.parse(f"x = {list(range(100))}\n"))) == 64
    c = Canaries(file="t.py", text="", stand_ins={"t.py::test_a"})
    c.add(Canaries(file="t.py", text="", stand_ins={"t.py::test_b"}))
    assert c.stand_ins == {"t.py::test_a", "t.py::test_b"}


def test_passing_must_fail_names_each_must_fail_canary_the_log_or_the_record_reports_passing():
    """Any case passing (PASSED or XPASS) in either source counts; a must-pass canary, a failing one, a test that
    only starts with a canary's name, and odd records do not."""
    c = Canaries(file="t.py", text="", expected={
        "t.py::test_a": "FAILED", "t.py::test_b": "FAILED", "t.py::test_c": "FAILED", "t.py::test_p": "PASSED",
    })  # fmt: skip
    log = {"t.py::test_a[1]": "FAILED", "t.py::test_a[2]": "XPASS", "t.py::test_p": "PASSED",
           "t.py::test_b": "FAILED", "t.py::test_cd": "PASSED"}  # fmt: skip
    record = {"tests": {"t.py::test_b": "PASSED", 7: "PASSED", "t.py::test_c": "ERROR"}}
    assert canaries.passing_must_fail(c, log, record) == {"t.py::test_a", "t.py::test_b"}
    assert canaries.passing_must_fail(c, log, None) == {"t.py::test_a"}
    assert canaries.passing_must_fail(c, {}, {"tests": ["t.py::test_b"]}) == set()
    assert c.ids() == {"t.py::test_a", "t.py::test_b", "t.py::test_c", "t.py::test_p"}


def test_breakable_reads_a_file_with_cr_line_ends():
    src = (
        "def test_loop():\r    for x in (1, 2):\r        assert x\r\r\rdef test_eq():\r    assert f() == 2\r"
    )
    assert breakable("t.py", src, ["t.py::test_eq"]) and not breakable("t.py", src, ["t.py::test_loop"])


def test_a_planted_file_has_only_the_files_own_line_end():
    """Twins, gaps and table copies end their lines as the file does: a bare "\\n" in a CRLF or CR file would pick
    out every line the harness added by its bytes."""
    for label, eol in (("crlf", "\r\n"), ("cr", "\r")):
        source = LAYOUT.replace("\n", eol)
        for seed in range(8):
            text = plant(FILE, source, LAYOUT_IDS, random.Random(seed)).text
            ends = re.findall(r"\r\n|\r|\n", text)
            assert set(ends) == {eol}, (label, seed, sorted(set(ends)))
