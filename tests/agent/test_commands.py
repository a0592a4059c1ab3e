import pytest

from swe_megatron.agent.commands import Submitted, interactive_program
from swe_megatron.agent.viewer import FileLines, apply_edit

REFUSED = ["vim", "less", "nano"]


def test_shell_output_exit_code_and_cwd(aci):
    assert aci.run("echo hi") == "hi"
    out = aci.run("ls nope")
    assert "No such file" in out and out.endswith("[exit code 2]")
    assert aci.run("cd pkg") == aci.prompts.no_output
    assert aci.cwd.endswith("/pkg")
    obs = aci.observation("x")
    assert obs.endswith(f"(Current directory: {aci.cwd}, current file: n/a) bash-$")


def test_interactive_programs_are_refused(aci):
    for cmd in ["vim pkg/calc.py", "git log | less", "FOO=1 nano x", "python", "echo a && python3"]:
        assert "interactive" in aci.run(cmd), cmd
    assert interactive_program("python -c 'print(1)'", REFUSED) is None
    assert interactive_program("grep -rn vim .", REFUSED) is None


def test_timeout_and_output_cap_are_visible(aci):
    aci.command_timeout_s = 0.5
    assert "timed out after 0.5 s" in aci.run("sleep 5")
    aci.command_timeout_s = 5
    out = aci.run("python3 -c 'print(\"x\" * 10000)'")
    assert "truncated" in out and len(out) < 2200


def test_non_utf8_output_and_files_survive(aci):
    assert aci.run("cat latin1.txt").splitlines()[0] == "caf\\xe9"
    assert "1:caf\\xe9" in aci.run("open latin1.txt")
    aci.run("edit 2:2\nchanged\nend_of_edit")
    assert aci.sandbox.read_file("latin1.txt") == b"caf\xe9\nchanged\n"


def test_open_goto_scroll_window(aci):
    out = aci.run("open pkg/calc.py 25")
    assert out.splitlines()[0] == f"[File: {aci.workdir}/pkg/calc.py (32 lines total)]"
    assert "(21 more lines above)" in out and "25:# line 25" in out and "(1 more lines below)" in out
    assert aci.current_file.endswith("pkg/calc.py")
    up = aci.run("scroll_up")
    assert "12:# line 12" in up and "21:# line 21" in up
    assert "1:# line 1" in aci.run("goto 1")
    assert "11:# line 11" in aci.run("scroll_down")
    assert "30:# line 30" in aci.run("scroll_down")
    last = aci.run("scroll_down")  # clamped: the window never runs past the end
    assert "(22 more lines above)" in last and last.endswith("32:    return a - b")
    assert aci.run("open missing.py") == f"Error: File {aci.workdir}/missing.py not found"
    assert "is a directory" in aci.run("open pkg")


def test_edit_is_inclusive_exact_and_answers_with_window(aci):
    aci.run("open pkg/calc.py")
    out = aci.run("edit 32:32\n    return a + b\n        # deep\nend_of_edit")
    assert "32:    return a + b" in out and "33:        # deep" in out
    assert aci.sandbox.read_file("pkg/calc.py").endswith(
        b"def add(a, b):\n    return a + b\n        # deep\n"
    )
    aci.run("edit 1:3\nend_of_edit")  # delete three lines
    assert aci.sandbox.read_file("pkg/calc.py").startswith(b"# line 4\n")
    aci.run("edit 1:0\nfirst\nend_of_edit")  # insert
    assert aci.sandbox.read_file("pkg/calc.py").startswith(b"first\n# line 4\n")
    assert aci.run("edit 5:2\nx").startswith("Error: END must be")
    assert aci.run("edit 99:99\nx").startswith("Error: START must be")


def test_edit_needs_an_open_file(tmp_path, aci):
    assert aci.run("edit 1:1\nx\nend_of_edit") == "Error: No file open. Use the `open` command first."


def test_create_search_replace(aci):
    out = aci.run("create new/mod.py")
    assert "(0 lines total)" in out and aci.current_file.endswith("new/mod.py")
    aci.run("edit 1:0\nx = 1\ny = 1\nend_of_edit")
    assert aci.sandbox.read_file("new/mod.py") == b"x = 1\ny = 1\n"
    assert "already exists" in aci.run("create new/mod.py")
    found = aci.run("search_file '= 1'")
    assert "Found 2 matches" in found and "Line 2: y = 1" in found
    assert "Found 1 matches" in aci.run("search_file 'def add' pkg/calc.py")
    assert "No matches" in aci.run("search_file zzz")
    assert "occurs 2 times" in aci.run("replace '= 1' '= 2'")
    assert "Replaced 2 occurrences" in aci.run("replace '= 1' '= 2' --replace-all")
    aci.run("replace 'x = 2' 'x = \"multi\\nline\"'")
    assert aci.sandbox.read_file("new/mod.py") == b'x = "multi\\nline"\ny = 2\n'
    assert "not found" in aci.run("replace nothing-here x")


def test_submit_and_patch_include_new_files(aci):
    aci.run("open pkg/calc.py")
    aci.run("replace 'a - b' 'a + b'")
    aci.run("create added.py")
    aci.run("python3 -c 'import compileall' && mkdir -p pkg/__pycache__ && echo x > pkg/__pycache__/c.pyc")
    with pytest.raises(Submitted):
        aci.run("submit")
    assert aci.run("submit now").startswith("Error:")
    patch = aci.patch()
    assert "-    return a - b\n+    return a + b" in patch
    assert "added.py" in patch and "__pycache__" not in patch


def test_apply_edit_keeps_trailing_newline_state():
    f = FileLines.from_bytes(b"a\nb")
    assert apply_edit(f, 2, 2, ["c"]).to_bytes() == b"a\nc"
    assert FileLines.from_bytes(b"").to_bytes() == b""
