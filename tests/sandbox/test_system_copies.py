"""What counts as a copy of a task library in the sandbox's system tree (issue 27 item 8): only a module that
imports under the library's top-level name. The stdlib's urllib/parse.py is not a copy of the library `parse`."""

from __future__ import annotations

from swe_megatron.sandbox.bwrap import system_copies
from swe_megatron.tasks.factory.build import refuse_sandbox_copies
from swe_megatron.tasks.factory.suite import find_layout


def _touch(root, *rels):
    for rel in rels:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("")


def test_a_submodule_of_a_package_is_not_a_copy(tmp_path):
    _touch(
        tmp_path, "lib/urllib/__init__.py", "lib/urllib/parse.py", "lib/pkg/__init__.py", "lib/pkg/parse/x.py"
    )
    _touch(tmp_path, "share/parse/README")  # a folder of that name without Python files
    assert system_copies(["parse"], roots=[str(tmp_path)]) == {}


def test_top_level_modules_and_packages_are_copies(tmp_path):
    _touch(tmp_path, "a/parse.py")
    assert system_copies(["parse"], roots=[str(tmp_path)]) == {"parse": str(tmp_path / "a/parse.py")}
    # a vendored folder without __init__.py is a sys.path root a patch could add, even inside a package
    _touch(tmp_path, "b/pkg/__init__.py", "b/pkg/third_party/toolz/__init__.py")
    assert system_copies(["toolz"], roots=[str(tmp_path)]) == {
        "toolz": str(tmp_path / "b/pkg/third_party/toolz")
    }


def test_the_library_parse_is_usable_with_the_real_system_tree(tmp_path):
    """The system tree holds the stdlib's urllib/parse.py (and json/): `parse` is accepted, `json` refused."""
    assert "parse" not in system_copies(["parse"]) and "json" in system_copies(["json"])
    _touch(tmp_path, "lib/parse.py", "lib/tests/test_parse.py")
    refuse_sandbox_copies(find_layout(tmp_path / "lib"))  # no LibraryUnusable
