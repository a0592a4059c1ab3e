"""The sanitiser drops every edit that could change how a patch is graded, and keeps ordinary ones intact."""

from __future__ import annotations

import subprocess

import pytest
from tiny_task import GOLD_PATCH, TEST_PATCH, diff, git

from swe_megatron.grading.sanitize import sanitize_patch, task_test_paths

SRC = "def f():\n    return 1\n"
SRC2 = "def f():\n    return 2\n"


def edit(path: str, old: str | None = SRC, new: str | None = SRC2) -> str:
    return diff((path, old, new))


def test_ordinary_edit_is_kept_byte_for_byte():
    clean = sanitize_patch(GOLD_PATCH)
    assert clean.patch == GOLD_PATCH
    assert clean.kept == ["calc/ops.py"] and not clean.dropped and clean.parse_error is None
    assert not clean.suspicious  # only added lines that reach into the runner are reported


@pytest.mark.parametrize(
    "path, reason",
    [
        ("tests/test_x.py", "test file"),
        ("pkg/tests/helpers.py", "test file"),
        ("test/data/input.json", "test file"),
        ("testing/helpers.py", "test file"),
        ("pkg/test_util.py", "test file"),
        ("pkg/util_test.py", "test file"),
        ("conftest.py", "conftest.py"),
        ("src/pkg/conftest.py", "conftest.py"),
        ("pytest.ini", "test runner config"),
        (".pytest.ini", "test runner config"),
        ("tox.ini", "test runner config"),
        ("setup.cfg", "test runner config"),
        ("pyproject.toml", "test runner config"),
        ("sub/pyproject.toml", "test runner config"),
        ("noxfile.py", "test runner config"),
        ("evil.pth", "interpreter start-up hook"),
        ("sitecustomize.py", "interpreter start-up hook"),
        ("lib/usercustomize.py", "interpreter start-up hook"),
        ("pkg.egg-info/entry_points.txt", "package metadata"),
        ("pkg-1.0.dist-info/METADATA", "package metadata"),
        ("pkg.egg-info/PKG-INFO", "package metadata"),
        ("lib/entry_points.txt", "package metadata"),
        ("pkg.egg-link", "package metadata"),
        ("pkg/mod.pyc", "git or cache internals"),
        ("pkg/mod.pyo", "git or cache internals"),
        ("pkg\\mod.py", "outside the repository"),
        (".git/hooks/pre-commit", "git or cache internals"),
        (".gitattributes", "git or cache internals"),
        ("pkg/__pycache__/mod.cpython-311.pyc", "git or cache internals"),
        ("pytest.py", "shadows the test runner or standard library"),
        ("_pytest/runner.py", "shadows the test runner or standard library"),
        ("json.py", "shadows the test runner or standard library"),
        ("_swe_megatron_grade_record.py", "shadows the test runner or standard library"),
        # Each a path only one entry of the policy reaches (no other rule would drop it):
        (".pytest_cache/v/cache/lastfailed", "git or cache internals"),
        ("pkg/__pycache__/notes.txt", "git or cache internals"),
        (".gitmodules", "git or cache internals"),
        ("pkg/.git/config", "git or cache internals"),
        ("pytest.toml", "test runner config"),
        (".pytest.toml", "test runner config"),
        ("lib/sitecustomize.py", "interpreter start-up hook"),
        ("lib/dist/entry_points.txt", "package metadata"),
        ("pluggy/_hooks.py", "shadows the test runner or standard library"),
        ("py.py", "shadows the test runner or standard library"),
        ("iniconfig/__init__.py", "shadows the test runner or standard library"),
        ("xdist/plugin.py", "shadows the test runner or standard library"),
        ("lib/testing/data.txt", "test file"),
        ("lib/test/data.txt", "test file"),
        ("lib/tests/data.txt", "test file"),
    ],
)
def test_protected_paths_are_dropped(path, reason):
    clean = sanitize_patch(edit("pkg/mod.py") + edit(path))
    assert [(d.path, d.reason) for d in clean.dropped] == [(path, reason)]
    assert clean.kept == ["pkg/mod.py"]
    assert path not in clean.patch and "pkg/mod.py" in clean.patch


def test_root_modules_that_shadow_nothing_and_mode_changes_that_drop_exec_are_kept():
    """Only stdlib/runner names are refused at the root; only a change that ADDS an exec bit is dropped."""
    assert sanitize_patch(edit("mylib.py")).kept == ["mylib.py"]
    assert sanitize_patch(edit("pkg/json.py")).kept == ["pkg/json.py"]  # not at the root: shadows nothing
    unexec = "diff --git a/run.sh b/run.sh\nold mode 100755\nnew mode 100644\n"
    assert sanitize_patch(unexec).kept == ["run.sh"]
    other_x = "diff --git a/run.sh b/run.sh\nold mode 100644\nnew mode 100645\n"  # o+x alone
    assert [d.reason for d in sanitize_patch(other_x).dropped] == ["makes a file executable"]


def test_quoted_file_names_are_checked_without_their_quotes():
    """git quotes names with unusual bytes ("a/conftest.py"); the rule must see the name inside."""
    patch = 'diff --git "a/conftest.py" "b/conftest.py"\n--- "a/conftest.py"\n+++ "b/conftest.py"\n@@ -1 +1 @@\n-a\n+b\n'
    clean = sanitize_patch(patch)
    assert clean.is_empty and [d.reason for d in clean.dropped] == ["conftest.py"]


def test_task_test_paths_take_the_file_of_a_class_test_id():
    assert task_test_paths("", ["pkg/t.py::TestC::test_x", "other.py::test_y", "no_separator"]) == {
        "pkg/t.py",
        "other.py",
    }


def test_library_modules_with_test_like_names_elsewhere_are_kept():
    clean = sanitize_patch(edit("pkg/testing_utils.py") + edit("pkg/json.py") + edit("pkg/contest.py"))
    assert not clean.dropped


@pytest.mark.parametrize("kind", ["new", "deleted"])
def test_creating_or_deleting_protected_files_is_dropped(kind):
    old, new = (None, "x = 1\n") if kind == "new" else ("x = 1\n", None)
    clean = sanitize_patch(diff(("conftest.py", old, new), ("tests/test_a.py", old, new)))
    assert clean.is_empty and {d.reason for d in clean.dropped} == {"conftest.py", "test file"}


def test_task_test_files_and_their_folders_are_protected():
    protected = task_test_paths(TEST_PATCH, ["checks/check_api.py::test_one"], ["spec/run_spec.py"])
    assert {"tests/test_clamp.py", "checks/check_api.py", "spec/run_spec.py"} <= protected
    for path in ("checks/check_api.py", "spec/run_spec.py", "checks"):
        clean = sanitize_patch(edit(path, None, "x\n"), protected)
        assert [d.reason for d in clean.dropped] == ["task test file"], path


def test_paths_below_a_task_test_file_are_protected():
    """Issue 24 attack 4: `check_api.py/keep.txt` makes the test file a folder, so restoring it fails."""
    protected = task_test_paths("", ["checks/check_api.py::test_one"])
    for path in ("checks/check_api.py/keep.txt", "checks/check_api.py/a/b.txt"):
        clean = sanitize_patch(edit(path, None, "x\n"), protected)
        assert [d.reason for d in clean.dropped] == ["task test file"], path
    assert not sanitize_patch(edit("checks/check_api.pyx", None, "x\n"), protected).dropped


@pytest.mark.parametrize("path", ["/etc/passwd", "../outside.py", "pkg/../../outside.py", "~/x.py"])
def test_paths_outside_the_repository_are_dropped(path):
    patch = f"--- a/{path}\n+++ b/{path}\n@@ -1 +1 @@\n-a\n+b\n".replace("a//", "/").replace("b//", "/")
    if path.startswith("~"):  # `~/x.py` as the diff's file name (no a/ b/ prefix to strip)
        patch = f"--- {path}\n+++ {path}\n@@ -1 +1 @@\n-a\n+b\n"
    clean = sanitize_patch(patch)
    assert clean.is_empty and [d.reason for d in clean.dropped] == ["outside the repository"]


def test_rename_into_a_protected_path_is_dropped():
    patch = "diff --git a/pkg/x.py b/conftest.py\nsimilarity index 100%\nrename from pkg/x.py\nrename to conftest.py\n"
    clean = sanitize_patch(patch)
    assert clean.is_empty and clean.dropped[0].reason == "conftest.py"


@pytest.mark.parametrize("target", ["tests/helpers.py", "test/data/input.json", "testing/fixtures.py"])
@pytest.mark.parametrize("how", ["rename", "copy"])
def test_rename_or_copy_into_a_top_level_test_folder_is_dropped(how, target):
    """rename/copy lines carry no a/ b/ prefix: the test folder is the path's FIRST part there."""
    patch = (
        f"diff --git a/pkg/x.py b/pkg/x.py\nsimilarity index 100%\n{how} from pkg/x.py\n{how} to {target}\n"
    )
    clean = sanitize_patch(patch)
    assert clean.is_empty and [d.reason for d in clean.dropped] == ["test file"], clean.dropped


def test_header_rename_lines_that_disagree_with_the_file_names_are_checked():
    patch = (
        "diff --git a/pkg/x.py b/pkg/x.py\nsimilarity index 90%\nrename from pkg/x.py\nrename to conftest.py\n"
        "--- a/pkg/x.py\n+++ b/pkg/x.py\n@@ -1 +1 @@\n-a\n+b\n"
    )
    assert sanitize_patch(patch).dropped[0].reason == "conftest.py"


def test_unknown_header_lines_are_not_passed_to_git():
    patch = "diff --git a/pkg/x.py b/pkg/x.py\nIndex: conftest.py\n--- a/pkg/x.py\n+++ b/pkg/x.py\n@@ -1 +1 @@\n-a\n+b\n"
    clean = sanitize_patch(patch)
    assert clean.kept == ["pkg/x.py"] and "Index:" not in clean.patch


def test_binary_symlink_and_executable_changes_are_dropped():
    binary = "diff --git a/img.png b/img.png\nnew file mode 100644\nindex 0000000..1111111\nBinary files /dev/null and b/img.png differ\n"
    symlink = "diff --git a/link.py b/link.py\nnew file mode 120000\n--- /dev/null\n+++ b/link.py\n@@ -0,0 +1 @@\n+/etc/passwd\n\\ No newline at end of file\n"
    exe = "diff --git a/run.sh b/run.sh\nold mode 100644\nnew mode 100755\n"
    new_exe = "diff --git a/go.sh b/go.sh\nnew file mode 100755\n--- /dev/null\n+++ b/go.sh\n@@ -0,0 +1 @@\n+echo hi\n"
    clean = sanitize_patch(binary + symlink + exe + new_exe)
    assert [d.reason for d in clean.dropped] == [
        "binary patch",
        "symlink",
        "makes a file executable",
        "makes a file executable",
    ]
    assert clean.is_empty


@pytest.mark.parametrize(
    "patch",
    ["this is not a diff\n", "@@ -1 +1 @@\n-a\n+b\n", "--- a/x.py\n+++ b/x.py\n@@ -1,3 +1,3 @@\n-a\n"],
)
def test_unparseable_patch_is_empty_with_a_reason(patch):
    clean = sanitize_patch(patch)
    assert clean.is_empty and clean.parse_error


@pytest.mark.parametrize("patch", [None, "", "  \n"])
def test_no_patch_is_empty_without_error(patch):
    clean = sanitize_patch(patch)
    assert clean.is_empty and clean.parse_error is None and not clean.dropped


def test_runner_references_are_reported_as_suspicious_but_kept():
    clean = sanitize_patch(edit("pkg/mod.py", SRC, "import os, pytest\nos._exit(0)\n"))
    assert clean.kept == ["pkg/mod.py"] and len(clean.suspicious) == 2


def test_rebuilt_patch_applies_with_git(tmp_path):
    """What the sanitiser keeps is still a patch git applies (the rebuild is not lossy)."""
    repo = tmp_path / "r"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "mod.py").write_text(SRC)
    (repo / "pkg" / "keep.txt").write_text("no newline")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "x")
    patch = (
        edit("pkg/mod.py")
        + edit("conftest.py", None, "x = 1\n")
        + diff(("pkg/keep.txt", "no newline", "still none"))
    )
    patch += diff(("pkg/new.py", None, "y = 2\n"))
    clean = sanitize_patch(patch)
    (tmp_path / "p.diff").write_text(clean.patch)
    subprocess.run(
        ["git", "apply", "--verbose", str(tmp_path / "p.diff")], cwd=repo, check=True, capture_output=True
    )
    assert (repo / "pkg" / "mod.py").read_text() == SRC2
    assert (repo / "pkg" / "keep.txt").read_text() == "still none"
    assert (repo / "pkg" / "new.py").exists() and not (repo / "conftest.py").exists()


# --- edges mutation testing found (tools/mutate.py) ---------------------------------------------------


def test_quoted_rename_targets_are_checked_without_their_quotes():
    patch = 'diff --git a/pkg/x.py b/pkg/x.py\nsimilarity index 100%\nrename from pkg/x.py\nrename to "conftest.py"\n'
    assert [d.reason for d in sanitize_patch(patch).dropped] == ["conftest.py"]


def test_a_name_with_one_quote_is_checked_as_written():
    # An opening quote without its closing one is part of the name: "a/conftest.py is still a conftest.py.
    patch = '--- "a/conftest.py\n+++ "b/conftest.py\n@@ -1 +1 @@\n-a\n+b\n'
    assert [d.reason for d in sanitize_patch(patch).dropped] == ["conftest.py"]


def test_names_without_a_prefix_or_without_a_name_are_checked():
    assert sanitize_patch("--- tox.ini\n+++ tox.ini\n@@ -1 +1 @@\n-a\n+b\n").dropped[0].reason == (
        "test runner config"
    )
    assert sanitize_patch("--- mod.py\n+++ mod.py\n@@ -1 +1 @@\n-a\n+b\n").kept == ["mod.py"]
    # "" is a quoted empty name: nothing to check, so nothing to keep.
    clean = sanitize_patch('--- ""\n+++ ""\n@@ -1 +1 @@\n-a\n+b\n')
    assert clean.is_empty and [d.reason for d in clean.dropped] == ["no file name"]


def test_a_tab_in_a_path_is_outside_the_repository():
    patch = "diff --git a/pkg/x.py b/pkg/x.py\nsimilarity index 100%\nrename from pkg/x.py\nrename to pkg/a\tb.py\n"
    assert [d.reason for d in sanitize_patch(patch).dropped] == ["outside the repository"]


def test_a_symlink_turned_into_a_file_and_a_submodule_are_dropped():
    unlink = "diff --git a/link b/link\nold mode 120000\nnew mode 100644\n"
    sub = (
        "diff --git a/sub b/sub\nindex 1111111..2222222 160000\n--- a/sub\n+++ b/sub\n@@ -1 +1 @@\n"
        f"-Subproject commit {'1' * 40}\n+Subproject commit {'2' * 40}\n"
    )
    assert [d.reason for d in sanitize_patch(unlink + sub).dropped] == ["symlink", "submodule"]


def test_modes_are_read_in_octal():
    # 100600 has no exec bit (read as decimal it would have 0o110's bits set).
    chmod = "diff --git a/run.sh b/run.sh\nold mode 100644\nnew mode 100600\n"
    assert sanitize_patch(chmod).kept == ["run.sh"]


def test_a_patch_without_its_last_newline_is_kept():
    patch = edit("pkg/mod.py")
    clean = sanitize_patch(patch.rstrip("\n"))
    assert clean.parse_error is None and clean.kept == ["pkg/mod.py"]
    assert clean.patch == sanitize_patch(patch).patch and clean.patch.endswith("+    return 2\n")


def test_kept_edits_are_joined_as_they_were():
    patch = edit("pkg/a.py") + edit("pkg/b.py")
    assert sanitize_patch(patch).patch == patch


def test_what_the_parser_trips_on_is_the_model_s_parse_error(monkeypatch):
    from swe_megatron.grading import sanitize

    def trips(text):
        raise IndexError("list index out of range")

    monkeypatch.setattr(sanitize, "PatchSet", trips)
    clean = sanitize_patch(edit("pkg/mod.py"))
    assert clean.patch == "" and clean.is_empty and not clean.kept
    assert clean.parse_error == "unparseable patch: IndexError: list index out of range"


def test_text_without_a_file_diff_says_so():
    assert sanitize_patch("this is not a diff\n").parse_error == "no file diffs found in the patch"


def test_suspicious_lines_name_the_file_and_are_cut_at_160_characters():
    long = "import pytest  # " + "x" * 300
    clean = sanitize_patch(edit("pkg/mod.py", SRC, long + "\n"))
    assert clean.suspicious == [f"pkg/mod.py: {long[:160]}"]


def test_empty_test_ids_and_files_protect_nothing():
    assert task_test_paths("", ["::test_x"], ["", "  "]) == set()
    assert task_test_paths("  \n") == set()


def test_a_test_patch_without_its_last_newline_gives_the_same_paths():
    assert task_test_paths(TEST_PATCH.rstrip("\n")) == task_test_paths(TEST_PATCH) != set()


def test_only_quotes_are_stripped_from_rename_lines():
    patch = "diff --git a/pkg/x.py b/pkg/x.py\nsimilarity index 100%\nrename from pkg/x.py\nrename to Xconftest.py\n"
    assert sanitize_patch(patch).kept == ["pkg/x.py"]  # Xconftest.py is not a conftest.py
