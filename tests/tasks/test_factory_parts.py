"""Parts of the task factory that need no network: package specs, requirements, layouts, task repos,
problem statements, the make-tasks command line."""

from __future__ import annotations

import io
import subprocess
import tarfile

import pytest

from swe_megatron.cli import main
from swe_megatron.tasks.factory.env import library_requirements
from swe_megatron.tasks.factory.errors import LibraryUnusable
from swe_megatron.tasks.factory.pypi import DEFAULT_PACKAGES, PackageSpec, normalize, unpack
from swe_megatron.tasks.factory.repo import git, write_task_repo
from swe_megatron.tasks.factory.statement import problem_statement, scrub
from swe_megatron.tasks.factory.suite import find_layout


def test_package_specs():
    toolz = PackageSpec.parse("toolz==1.1.0")
    assert toolz in DEFAULT_PACKAGES and toolz.sha256
    other = PackageSpec.parse(" Foo_Bar == 2.0.1 ")
    assert (other.name, other.version, other.sha256, other.key) == ("Foo_Bar", "2.0.1", None, "foo-bar-2.0.1")
    with pytest.raises(ValueError, match="expected NAME==VERSION"):
        PackageSpec.parse("toolz>=1")
    assert normalize("More_Itertools.x") == "more-itertools-x"
    assert len(DEFAULT_PACKAGES) >= 4 and all(p.sha256 and len(p.sha256) == 64 for p in DEFAULT_PACKAGES)


def test_library_requirements_from_sdist_metadata(tmp_path):
    (tmp_path / "PKG-INFO").write_text(
        "Metadata-Version: 2.1\nName: lib\n"
        "Requires-Dist: attrs>=20\n"
        "Requires-Dist: oldthing; python_version < '3'\n"
        "Requires-Dist: freezegun; extra == 'tests'\n"
        "Requires-Dist: sphinx-theme; extra == 'docs'\n"
        "Requires-Dist: pytest>=9; extra == 'tests'\n"
        "Requires-Dist: lib[extra]; extra == 'tests'\n"
        "\nRequires-Dist: not-a-header\n"
    )
    egg = tmp_path / "lib.egg-info"
    egg.mkdir()
    (egg / "requires.txt").write_text("face>=20\n\n[testing]\nhypothesis\n\n[yaml]\npyyaml\n")
    (tmp_path / "requirements-test.txt").write_text(
        "# tests\n-r base.txt\nwhatever==0.7  # pinned\ncoverage\n"
    )
    (tmp_path / "pyproject.toml").write_text(
        '[dependency-groups]\ntest = ["pytest-benchmark"]\ndev = ["black"]\n'
    )
    reqs = library_requirements(tmp_path, "lib", extra=("sortedcontainers",))
    assert reqs == [
        "attrs>=20",
        "face>=20",
        "freezegun",
        "hypothesis",
        "pytest-benchmark",
        "sortedcontainers",
        "whatever==0.7",
    ]


def write(root, rel, text=""):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_layouts_flat_src_and_tests_inside_the_package(tmp_path):
    flat = tmp_path / "flat"
    for rel in (
        "pkg/__init__.py",
        "pkg/core.py",
        "pkg/tests/test_core.py",
        "pkg/tests/helpers.py",
        "setup.py",
    ):
        write(flat, rel)
    for rel in ("docs/conf.py", "tools/release.py", "single.py", "test_single.py", "conftest.py"):
        write(flat, rel)
    layout = find_layout(flat)
    assert layout.import_root == ""
    assert layout.test_files == ["pkg/tests/test_core.py", "test_single.py"]
    assert layout.source_files == ["pkg/__init__.py", "pkg/core.py", "single.py"]
    assert layout.test_cmd(["pkg/tests/test_core.py"]) == (
        "python -m pytest -rA -p no:cacheprovider -o addopts= --rootdir=. pkg/tests/test_core.py"
    )
    src = tmp_path / "srclayout"
    for rel in ("src/lib/__init__.py", "src/lib/a.py", "tests/test_a.py", "tests/conftest.py"):
        write(src, rel)
    layout = find_layout(src)
    assert (layout.import_root, layout.source_files) == ("src", ["src/lib/__init__.py", "src/lib/a.py"])
    assert layout.test_cmd(["tests/test_a.py"]).startswith(
        'PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}" python -m'
    )


def test_task_repo_single_commit_hidden_tests_and_patches(tmp_path):
    pristine = tmp_path / "pristine"
    write(pristine, "pkg/__init__.py")
    write(pristine, "pkg/core.py", "def add(a, b):\n    return a + b\n")
    write(
        pristine,
        "tests/test_core.py",
        "from pkg.core import add\n\ndef test_add():\n    assert add(1, 2) == 3\n",
    )
    write(pristine, "tests/test_other.py", "def test_other():\n    pass\n")
    write(pristine, "pkg.egg-info/SOURCES.txt", "tests/test_core.py\n")
    buggy = {"pkg/core.py": "def add(a, b):\n    return a - b\n"}
    made = [
        write_task_repo(pristine, tmp_path / f"repo{i}", buggy, ["tests/test_core.py"], message="lib 1.0")
        for i in range(2)
    ]
    assert made[0] == made[1]  # same inputs, same sha and patches
    repo = tmp_path / "repo0"
    assert git(repo, "rev-list", "--all").split() == [made[0].base_commit]
    assert not (repo / "tests/test_core.py").exists() and (repo / "tests/test_other.py").exists()
    assert not (repo / "pkg.egg-info").exists()  # its SOURCES.txt would name the hidden tests
    assert "return a + b" in made[0].patch and "tests/" not in made[0].patch
    for name, patch in (("test", made[0].test_patch), ("gold", made[0].patch)):
        (tmp_path / f"{name}.diff").write_text(patch)
        subprocess.run(["git", "apply", str(tmp_path / f"{name}.diff")], cwd=repo, check=True)
    assert "add(1, 2) == 3" in (repo / "tests/test_core.py").read_text()
    assert (repo / "pkg/core.py").read_text() == "def add(a, b):\n    return a + b\n"


def test_unpack_strips_the_top_folder_and_refuses_unsafe_paths(tmp_path):
    def tar_with(names):
        path = tmp_path / f"a{len(list(tmp_path.iterdir()))}.tar.gz"
        with tarfile.open(path, "w:gz") as t:
            for name in names:
                info = tarfile.TarInfo(name)
                info.size = 2
                t.addfile(info, io.BytesIO(b"x\n"))
        return path

    dest = unpack(tar_with(["lib-1.0/setup.py", "lib-1.0/lib/__init__.py"]), tmp_path / "out")
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*.py")) == [
        "lib/__init__.py",
        "setup.py",
    ]
    with pytest.raises(LibraryUnusable, match="unpack"):
        unpack(tar_with(["lib-1.0/../../evil.py"]), tmp_path / "out2")


def test_statement_scrubs_test_names_files_and_addresses():
    lines = scrub(
        "assert f(1) == 2\n  where 3 = <function test_thing.<locals>.g at 0x7f12ab34cd56>\n"
        "tests/test_mod.py:12: in helper\n  ^^^^^^\nplain line",
        forbidden=["test_thing", "test_mod.py"],
    )
    assert lines == ["assert f(1) == 2", "plain line"]
    kw = dict(
        library="lib 1.0",
        api="lib.f",
        exc_type="AssertionError",
        message="assert 3 == 2\n +  where 3 = f(1)",
        source=["assert f(1) == 2"],
        forbidden=["test_f"],
    )
    text = problem_statement(**kw, seed=3)
    assert text == problem_statement(**kw, seed=3)
    assert (
        "`lib.f`" in text and "assert f(1) == 2" in text and "assert 3 == 2" in text and "test_f" not in text
    )
    raised = problem_statement(
        **{**kw, "exc_type": "TypeError", "message": "unsupported operand", "source": []}, seed=1
    )
    assert "TypeError: unsupported operand" in raised and "lib.f" in raised


def test_statement_quotes_printed_output_when_the_message_is_short():
    kw = dict(library="lib 1.0", api="lib.table", exc_type="AssertionError", source=["check(expected, got)"])
    text = problem_statement(
        **kw, message="AssertionError", output=["Expected:", "a | b", "Got:", "a  b"], forbidden=[], seed=0
    )
    assert "What it printed:" in text and "    Got:" in text
    detailed = problem_statement(
        **kw,
        message="assert 'a long and detailed value' == 'another long and detailed value'",
        output=["noise"],
        forbidden=[],
        seed=0,
    )
    assert "noise" not in detailed


def test_make_tasks_rejects_a_bad_package_argument(tmp_path, capsys):
    assert main(["make-tasks", "--out", str(tmp_path), "--package", "toolz"]) == 2
    assert "expected NAME==VERSION" in capsys.readouterr().err
