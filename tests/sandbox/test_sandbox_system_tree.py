"""No copy of a task's library is reachable in the sandbox (issue 14, item 2): the bwrap sandbox binds a
minimal system tree instead of all of /usr, and the task factory refuses a library that has a copy in it."""

from __future__ import annotations

import os

import pytest

from swe_megatron.sandbox.bwrap import system_copies, system_tree
from swe_megatron.tasks.factory.build import refuse_sandbox_copies
from swe_megatron.tasks.factory.errors import LibraryUnusable
from swe_megatron.tasks.factory.suite import find_layout

pytestmark = pytest.mark.sandbox

# Python packages of the host that are no part of the sandbox's runtime (Debian's, pip's, vendored ones).
HOST_PACKAGES = (
    "/usr/lib/python3/dist-packages",
    "/usr/local/lib",
    "/usr/lib/google-cloud-sdk",
    "/usr/share",
)


def test_the_host_copy_of_a_task_library_is_not_readable(sandbox):
    """This machine's /usr holds a cloud SDK's vendored, unmutated copy of inflection (a factory library):
    a patch that ran it resolved two tasks. Inside the sandbox it is gone, as is every host package folder."""
    copies = system_copies(["inflection"], roots=["/usr"])
    paths = [copies["inflection"]] if copies else []
    paths += [p for p in HOST_PACKAGES if os.path.isdir(p) and p != "/usr/share"]
    if not paths:
        pytest.skip("no host Python packages outside the sandbox's tree on this machine")
    for path in paths:
        res = sandbox.exec(f"ls {path}")
        assert res.exit_code != 0 and b"No such file" in res.output, (path, res.output)
    if copies:
        module = os.path.join(copies["inflection"], "inflection.py")
        res = sandbox.exec(f"python -c \"exec(open('{module}').read())\"")
        assert b"No such file" in res.output, res.output


def test_the_minimal_tree_still_runs_what_the_agent_needs(sandbox):
    script = (
        "set -e; git init -q t && cd t && echo a > f && git add f && git -c user.name=a -c user.email=a@b "
        "commit -qm m && echo b >> f && git diff --stat | grep -c f; grep -n b f; sed -n 1p f; "
        "find . -name f | wc -l; ls /usr/share/git-core/templates >/dev/null; "
        "python -c 'import json, sqlite3, ssl, ctypes, decimal, zoneinfo; print(sqlite3.sqlite_version > \"3\")'; "
        "/usr/bin/python3 -c 'import sys; print(sys.prefix)'; date -u +%Z; printf 'x\\n' | head -1 | tail -1 | wc -c; "
        "awk 'END {print NR}' f; diff <(echo a) <(echo a) && patch --version | head -1 | cut -d' ' -f1-2"
    )
    res = sandbox.exec(script)
    assert res.exit_code == 0, res.output
    lines = res.output.decode().split("\n")
    assert lines[:10] == ["2", "2:b", "a", "1", "True", "/usr", "UTC", "2", "2", "GNU patch"], res.output


def test_the_factory_refuses_a_library_with_a_copy_in_the_sandbox(tmp_path):
    """Defence in depth: a library whose module is importable from the system tree gives no tasks."""
    found = system_copies(["json", "inflection", "swe_megatron"])
    assert set(found) == {"json"} and found["json"].startswith("/usr/lib/python3.")  # the stdlib's json
    tree = system_tree()
    assert "/usr" not in tree and not any(p.startswith(("/usr/local", "/usr/lib/python3/")) for p in tree)
    lib = tmp_path / "lib"
    for rel in ("json/__init__.py", "tests/test_json.py", "src_free.py"):
        (lib / rel).parent.mkdir(parents=True, exist_ok=True)
        (lib / rel).write_text("")
    with pytest.raises(LibraryUnusable, match=r"sandbox: a copy of 'json' is readable inside the sandbox"):
        refuse_sandbox_copies(find_layout(lib))
    (lib / "json").rename(lib / "jsonish")
    (lib / "tests" / "test_json.py").rename(lib / "tests" / "test_jsonish.py")
    refuse_sandbox_copies(find_layout(lib))  # no copy: accepted
    if os.path.isdir("/usr/lib/google-cloud-sdk"):  # this machine: the host copy that resolved two tasks
        assert "inflection" in system_copies(["inflection"], roots=["/usr"])
