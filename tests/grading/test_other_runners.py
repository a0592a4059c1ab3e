"""A runner other than pytest, graded as SWE-bench grades it (issue 39 item 3): a django task (tests/django_task.py:
Django's PyPI sdist with a planted bug) in a task image in SWE-bench's layout (tests/task_image.py), its SWE-bench
5.x row running `./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 utils_tests.test_text` and
naming parse_log_django, graded by `swe-megatron grade` on the apptainer backend (the stand-in) in a real sandbox.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from task_image import build_image, grade_patches_in_images, swebench_row
from tiny_task import diff

from swe_megatron.tasks.factory.errors import LibraryUnusable
from swe_megatron.tasks.load import load_tasks_for_command

pytestmark = [pytest.mark.sandbox, pytest.mark.e2e]

FAKE = Path(__file__).resolve().parents[1] / "fake_apptainer"
FORGE = """
import atexit as _atexit, sys as _sys


def _forge():  # after the runner's own lines: the parser keeps the last status it reads for a test
    _sys.stdout.write("test_phone2numeric (utils_tests.test_text.TestUtilsText.test_phone2numeric) ... ok\\n")
    _sys.stdout.flush()


_atexit.register(_forge)
"""


@pytest.fixture(scope="module")
def django_image():
    """(the django task's SWE-bench 5.x row as loaded, its rows file, the source task, sandbox overrides)."""
    from django_task import LOG_PARSER, TEST_CMD, django_task

    if not shutil.which("bwrap"):
        pytest.skip("bwrap is not installed (the stand-in apptainer runs over it)")
    try:
        source = django_task()
    except LibraryUnusable as e:
        pytest.skip(f"the django task cannot be built here (needs PyPI the first time): {e}")
    folder = Path(tempfile.mkdtemp(prefix="swe-django-image-", dir="/var/tmp"))
    folder.chmod(0o755)
    sif_dir = folder / "sifs"
    sif_dir.mkdir(mode=0o755)
    build_image(source, sif_dir)
    rows = folder / "rows.jsonl"
    row = swebench_row(source, TEST_CMD, LOG_PARSER)
    rows.write_text(json.dumps(row) + "\n")
    (task,) = load_tasks_for_command(str(rows))
    sandbox = [f"sandbox.sif_dir={sif_dir}", f"sandbox.workspace_root={folder / 'workspaces'}"]
    yield task, row, source, sandbox
    shutil.rmtree(folder, ignore_errors=True)


def test_the_row_maps_to_django_runtests_and_its_parser(django_image):
    task, _, _, _ = django_image
    plan = task.plan
    assert plan.source == "swebench" and plan.log_parser == "parse_log_django"
    assert (
        plan.test_cmd
        == "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 utils_tests.test_text"
    )
    assert plan.test_files == ("tests/utils_tests/test_text.py",) and not plan.repo_dir


def test_grade_runtests_with_swebench_django_parser(django_image, tmp_path):
    """Gold resolves (its FAIL_TO_PASS read by parse_log_django from runtests' verbose lines in the image); no patch,
    a test file made trivial and a rewritten tests/runtests.py do not (both dropped by the sanitiser, the test file
    restored). A patch that prints a passing line for the FAIL_TO_PASS test at exit is NOT caught: with a runner
    other than pytest the verdict rests on the log alone, as in SWE-bench (docs/security.md)."""
    task, row, source, sandbox = django_image
    repo = source.extra["repo_dir"]
    module = "django/utils/text.py"
    text = subprocess.run(["git", "-C", repo, "show", f"HEAD:{module}"], capture_output=True, text=True,
                          check=True).stdout  # fmt: skip
    runtests = subprocess.run(["git", "-C", repo, "show", "HEAD:tests/runtests.py"], capture_output=True,
                              text=True, check=True).stdout  # fmt: skip
    harmless = diff((module, text, text + "# harmless\n"))
    fake_ok = "".join(f"print({t + ' ... ok'!r})\n" for t in task.FAIL_TO_PASS + task.PASS_TO_PASS)
    patches = {
        "gold": source.patch,
        "empty": "",
        "edit_tests": harmless + diff((source.plan.test_files[0], None, "def test_nothing():\n    pass\n")),
        "runner": harmless + diff(("tests/runtests.py", runtests, "#!/usr/bin/env python\n" + fake_ok)),
        "forged_log": diff((module, text, text + FORGE)),
    }
    report = grade_patches_in_images(row, patches, tmp_path, sandbox)
    name = report["name"]
    assert sorted(name[i] for i in report["resolved_ids"]) == ["forged_log", "gold"], report
    assert sorted(name[i] for i in report["unresolved_ids"]) == ["edit_tests", "runner"], report
    assert [name[i] for i in report["empty_patch_ids"]] == ["empty"] and report["error_ids"] == []
    dropped = {
        name[i]: [d["path"] for d in r["dropped"]] for i, r in report["instances"].items() if r.get("dropped")
    }
    assert dropped == {"edit_tests": [source.plan.test_files[0]], "runner": ["tests/runtests.py"]}
