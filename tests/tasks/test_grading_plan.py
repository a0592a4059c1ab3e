"""Grading plans from rows as the datasets publish them: SWE-bench 5.x (image, eval_script, log_parser, eval_type),
SWE-rebench (docker_image, install_config), the old SWE-bench format (version only), as JSONL and parquet.

The rows follow the datasets' own sources: swebench 5.0.2's make_test_spec and task repo layout
(tests/test_task_publish.py of SWE-bench/SWE-bench), the eval script shape of its make_eval_script_list_py, and the
SWE-rebench rows and fork harness (install_config with None for unset keys, docker_image without a tag).
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from swe_megatron.errors import UsageError
from swe_megatron.grading.grader import TaskGradingError, task_grading
from swe_megatron.tasks.load import load_tasks, load_tasks_for_command, write_tasks
from swe_megatron.tasks.plan import make_eval_script, read_eval_script, sif_name

DJANGO_BASE = "d26b2424437dabeeca94d7900b37d2df4410da0c"
DJANGO_TEST_PATCH = """diff --git a/tests/auth_tests/test_validators.py b/tests/auth_tests/test_validators.py
--- a/tests/auth_tests/test_validators.py
+++ b/tests/auth_tests/test_validators.py
@@ -237,7 +237,7 @@ def test_unicode_validator(self):
         invalid_usernames = [
             "o'connell", "عبد ال",
             "zerowidth\\u200Bspace", "nonbreaking\\u00A0space",
-            "en\\u2013dash",
+            "en\\u2013dash", 'trailingnewline\\u000A',
         ]
         v = validators.UnicodeUsernameValidator()
         for valid in valid_usernames:
"""
DJANGO_PATCH = """diff --git a/django/contrib/auth/validators.py b/django/contrib/auth/validators.py
--- a/django/contrib/auth/validators.py
+++ b/django/contrib/auth/validators.py
@@ -7,7 +7,7 @@
 @deconstructible
 class ASCIIUsernameValidator(validators.RegexValidator):
-    regex = r'^[\\w.@+-]+$'
+    regex = r'\\A[\\w.@+-]+\\Z'
"""
# The eval script SWE-bench's harness writes for django 3.0 (make_eval_script_list_py: activation, the repo's
# eval_commands, informational git, install, test-file reset, test patch heredoc, markers, reset).
DJANGO_EVAL = f"""#!/bin/bash
set -uxo pipefail
source /opt/miniconda3/bin/activate
conda activate testbed
cd /testbed
sed -i '/en_US.UTF-8/s/^# //g' /etc/locale.gen && locale-gen
export LANG=en_US.UTF-8
export LANGUAGE=en_US:en
export LC_ALL=en_US.UTF-8
git config --global --add safe.directory /testbed
cd /testbed
git status
git show
git -c core.fileMode=false diff {DJANGO_BASE}
source /opt/miniconda3/bin/activate
conda activate testbed
python -m pip install -e .
git checkout {DJANGO_BASE} tests/auth_tests/test_validators.py
git apply -v - <<'EOF_114329324912'
{DJANGO_TEST_PATCH}
EOF_114329324912
: '>>>>> Start Test Output'
./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 auth_tests.test_validators
: '>>>>> End Test Output'
git checkout {DJANGO_BASE} tests/auth_tests/test_validators.py
"""
DJANGO_F2P = [
    "test_ascii_validator (auth_tests.test_validators.UsernameValidatorsTests)",
    "test_unicode_validator (auth_tests.test_validators.UsernameValidatorsTests)",
    "test_help_text (auth_tests.test_validators.UserAttributeSimilarityValidatorTest)",
]


def verified_row(**over) -> dict:
    """django__django-11099 as SWE-bench Verified publishes it in the 5.x format (test lists as JSON strings)."""
    row = {
        "repo": "django/django",
        "instance_id": "django__django-11099",
        "base_commit": DJANGO_BASE,
        "patch": DJANGO_PATCH,
        "test_patch": DJANGO_TEST_PATCH,
        "problem_statement": "UsernameValidator allows trailing newline in usernames",
        "hints_text": "",
        "created_at": "2019-03-20T03:46:18Z",
        "version": "3.0",
        "FAIL_TO_PASS": json.dumps(DJANGO_F2P),
        "PASS_TO_PASS": json.dumps(["test_validate (auth_tests.test_validators.MinimumLengthValidatorTest)"]),
        "environment_setup_commit": "419a78300f7cd27611196e1e464d50fd0385ff27",
        "difficulty": "<15 min fix",
        "image": "swebench/sweb.eval.x86_64.django_1776_django-11099:latest",
        "eval_script": DJANGO_EVAL,
        "log_parser": "parse_log_django",
        "eval_type": "pass_and_fail",
    }
    row.update(over)
    return row


REBENCH_TEST_PATCH = """diff --git a/tests/common.json b/tests/common.json
new file mode 100644
--- /dev/null
+++ b/tests/common.json
@@ -0,0 +1 @@
+{}
diff --git a/tests/test_utils.py b/tests/test_utils.py
--- a/tests/test_utils.py
+++ b/tests/test_utils.py
@@ -1,2 +1,3 @@
 import pytest
+from spectree.utils import parse_params
 from spectree.utils import parse_code
"""
REBENCH_TEST_CMD = (
    "pytest --no-header -rA --tb=line --color=no -p no:cacheprovider -W ignore::DeprecationWarning"
)


def rebench_row(**over) -> dict:
    """0b01001001__spectree-64 as nebius/SWE-rebench publishes it (install_config's unset keys are None)."""
    row = {
        "instance_id": "0b01001001__spectree-64",
        "repo": "0b01001001/spectree",
        "base_commit": "a091fab020ac26548250c907bae0855273a98778",
        "patch": "diff --git a/spectree/utils.py b/spectree/utils.py\n--- a/spectree/utils.py\n+++ "
        "b/spectree/utils.py\n@@ -1 +1 @@\n-a = 1\n+a = 2\n",
        "test_patch": REBENCH_TEST_PATCH,
        "problem_statement": "[BUG]description for query paramters can not show in swagger ui",
        "hints_text": "",
        "created_at": "2020-10-16 12:23:27",
        "version": "0.3",
        "environment_setup_commit": "a091fab020ac26548250c907bae0855273a98778",
        "meta": {
            "commit_name": "head_commit",
            "failed_lite_validators": ["has_hyperlinks", "has_media"],
            "has_test_patch": True,
            "is_lite": False,
            "llm_score": {"difficulty_score": 1, "issue_text_score": 2, "test_score": 0},
            "num_modified_files": 1,
        },
        "install_config": {
            "env_vars": None,
            "env_yml_path": None,
            "install": "pip install -e .[flask,falcon,starlette]",
            "log_parser": "parse_log_pytest",
            "no_use_env": None,
            "packages": "requirements.txt",
            "pip_packages": ["pytest"],
            "pre_install": None,
            "python": "3.9",
            "reqs_path": ["requirements.txt"],
            "test_cmd": REBENCH_TEST_CMD,
        },
        "requirements": "pytest==8.3.5",
        "environment": "name: spectree",
        "FAIL_TO_PASS": ["tests/test_utils.py::test_parse_params"],
        "FAIL_TO_FAIL": [],
        "PASS_TO_PASS": ["tests/test_utils.py::test_comments", "tests/test_utils.py::test_parse_code"],
        "PASS_TO_FAIL": [],
        "license_name": "Apache License 2.0",
        "docker_image": "swerebench/sweb.eval.x86_64.0b01001001_1776_spectree-64",
        "image_name": "swerebench/sweb.eval.x86_64.0b01001001_1776_spectree-64",
    }
    row.update(over)
    return row


def write_jsonl(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def write_parquet(path, rows) -> None:
    pq.write_table(pa.Table.from_pylist(rows), path)


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_a_swebench_verified_row_is_one_plan(tmp_path, fmt):
    (task,) = _loaded(tmp_path, [verified_row()], fmt)
    plan = task.plan
    assert (plan.source, plan.log_parser, plan.eval_type) == ("swebench", "parse_log_django", "pass_and_fail")
    assert plan.image == "swebench/sweb.eval.x86_64.django_1776_django-11099:latest"
    assert plan.sif == "swebench_sweb.eval.x86_64.django_1776_django-11099_latest.sif"
    assert (plan.repo_dir, plan.workdir) == ("", "/testbed")
    assert (
        plan.test_cmd
        == "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 auth_tests.test_validators"
    )
    assert plan.test_files == ("tests/auth_tests/test_validators.py",)
    # The image's environment, as the eval script activates it; the grader resets and applies the tests itself.
    assert plan.env_setup == (
        "source /opt/miniconda3/bin/activate",
        "conda activate testbed",
        "cd /testbed",
        "sed -i '/en_US.UTF-8/s/^# //g' /etc/locale.gen && locale-gen",
        "export LANG=en_US.UTF-8",
        "export LANGUAGE=en_US:en",
        "export LC_ALL=en_US.UTF-8",
        "cd /testbed",
        "source /opt/miniconda3/bin/activate",
        "conda activate testbed",
        "python -m pip install -e .",
    )
    # The agent's shell runs the activation part only (before the eval script's first git command: no install).
    assert plan.activate == plan.env_setup[:7]
    assert "trailingnewline" not in plan.command and "git apply" not in plan.command
    assert subprocess.run(["bash", "-n", "-c", plan.command]).returncode == 0
    tg = task_grading(task)  # the grader reads the plan: the SIF, the command, no pytest record for django
    assert (tg.spec.image, tg.spec.workdir, tg.test_cmd) == (plan.sif, "/testbed", plan.command)
    assert tg.spec.setup == plan.activate
    assert not tg.require_record and tg.canary_file is None
    assert "tests/auth_tests/test_validators.py" in tg.protected
    assert tg.existing_test_files == ["tests/auth_tests/test_validators.py"]


def test_a_swebench_row_without_an_image_runs_in_swebench_s_own(tmp_path):
    path = tmp_path / "lite.jsonl"
    write_jsonl(path, [{k: v for k, v in verified_row().items() if k != "image"}])
    (task,) = load_tasks(path)
    assert task.plan.image == "swebench/sweb.eval.x86_64.django_1776_django-11099:latest"


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_a_swe_rebench_row_is_one_plan(tmp_path, fmt):
    (task,) = _loaded(tmp_path, [rebench_row()], fmt)
    plan = task.plan
    assert (plan.source, plan.log_parser, plan.eval_type) == (
        "swe-rebench",
        "parse_log_pytest",
        "pass_and_fail",
    )
    assert plan.image == "swerebench/sweb.eval.x86_64.0b01001001_1776_spectree-64:latest"
    assert plan.sif == "swerebench_sweb.eval.x86_64.0b01001001_1776_spectree-64_latest.sif"
    # The fork's get_test_directives: files the test patch adds or changes, tests/common.json (.json) left out.
    assert plan.test_cmd == f"LANG=C.UTF-8 LC_ALL=C.UTF-8 {REBENCH_TEST_CMD} tests/test_utils.py"
    assert plan.env_setup == (
        "source /opt/miniconda3/bin/activate",
        "conda activate testbed",
        "cd /testbed",
        "LANG=C.UTF-8 LC_ALL=C.UTF-8 pip install -e .[flask,falcon,starlette]",
    )
    assert plan.activate == plan.env_setup[:3]  # the install is not the agent's to run
    assert set(plan.test_files) == {"tests/common.json", "tests/test_utils.py"}
    assert subprocess.run(["bash", "-n", "-c", plan.command]).returncode == 0
    tg = task_grading(task)
    assert tg.require_record and tg.canary_file == "tests/test_utils.py" and tg.spec.image == plan.sif


def test_install_config_as_a_json_string_reads_the_same(tmp_path):
    row = rebench_row()
    path = tmp_path / "r.jsonl"
    write_jsonl(
        path, [row, {**row, "instance_id": "x__y-1", "install_config": json.dumps(row["install_config"])}]
    )
    a, b = load_tasks(path)
    assert a.plan.test_cmd == b.plan.test_cmd and a.plan.env_setup == b.plan.env_setup


def test_django_directives_are_module_names(tmp_path):
    """The fork's rule for django/django (runtests.py takes dotted module names)."""
    cfg = {"test_cmd": "./tests/runtests.py --verbosity 2", "log_parser": "parse_log_django"}
    path = tmp_path / "d.jsonl"
    row = verified_row(
        install_config=cfg, docker_image="swerebench/sweb.eval.x86_64.django_1776_django-11099"
    )
    write_jsonl(path, [{k: v for k, v in row.items() if k not in ("eval_script", "image")}])
    (task,) = load_tasks(path)
    assert task.plan.test_cmd.endswith("./tests/runtests.py --verbosity 2 auth_tests.test_validators")


def test_the_pinned_swebench_has_no_specs_for_old_rows():
    """The premise of refusing a row that carries only `version`: swebench 5.x dropped the per-repo specs."""
    import swebench.harness.constants as constants

    assert not hasattr(constants, "MAP_REPO_VERSION_TO_SPECS")


@pytest.mark.parametrize(
    ("row", "why"),
    [
        (
            {
                k: v
                for k, v in verified_row().items()
                if k not in ("image", "eval_script", "log_parser", "eval_type")
            },
            "task django__django-11099 has nothing to grade with: no eval_script",
        ),
        (verified_row(log_parser="parse_log_nope"), "unknown log parser 'parse_log_nope'"),
        (verified_row(eval_script="#!/bin/bash\npytest\n"), "eval_script has no test command between"),
        (verified_row(log_parser=None), "log_parser is missing"),
        (
            rebench_row(install_config={"log_parser": "parse_log_pytest"}),
            "install_config.test_cmd is missing",
        ),
        (rebench_row(install_config={"test_cmd": ["a", "b"], "log_parser": "x"}), "SWE-rebench-V2's format"),
    ],
)
def test_a_row_that_cannot_be_graded_says_why_at_load_time(tmp_path, row, why):
    path = tmp_path / "t.jsonl"
    write_jsonl(path, [row])
    (task,) = load_tasks(path)  # loading keeps the row (build-sifs can still build its image) ...
    assert task.plan is None and why in task.plan_problem and "\n" not in task.plan_problem
    with pytest.raises(UsageError, match=f"1 of 1 tasks cannot be graded: .*{why[:20]}"):
        load_tasks_for_command(path)  # ... a command that grades refuses it before any work starts
    assert load_tasks_for_command(path, gradable=False) == [task]
    with pytest.raises(TaskGradingError, match=why[:20]):
        task_grading(task)


def test_written_tasks_read_back_with_the_same_plan(tmp_path):
    src = tmp_path / "a.jsonl"
    write_jsonl(src, [verified_row(), rebench_row()])
    tasks = load_tasks(src)
    write_tasks(tasks, tmp_path / "b.jsonl")
    assert "plan" not in (tmp_path / "b.jsonl").read_text().splitlines()[0]
    assert [t.plan for t in load_tasks(tmp_path / "b.jsonl")] == [t.plan for t in tasks]


def test_read_eval_script_keeps_a_multi_line_test_command():
    script = (
        "source x\ngit checkout abc t.py\n: '>>>>> Start Test Output'\npytest -rA a.py\npytest -rA b.py\n"
    )
    script += ": '>>>>> End Test Output'\nrm -rf /\n"
    assert read_eval_script(script, "abc") == (["source x"], "pytest -rA a.py\npytest -rA b.py", ["t.py"])


def test_make_eval_script_reads_back():
    """make_eval_script (make-tasks' eval scripts) writes what read_eval_script reads back; no test files or test
    patch leaves no reset or apply line (a bare `git checkout BASE` would otherwise be kept as a setup line)."""
    files = ["pkg/tests/test_a.py", "tests/odd name.py"]
    script = make_eval_script("abc", "python -m pytest -rA x", files, DJANGO_TEST_PATCH, ("source y",))
    assert read_eval_script(script, "abc") == (["source y"], "python -m pytest -rA x", files)
    assert DJANGO_TEST_PATCH.strip() in script and script.count("git checkout abc") == 2
    bare = make_eval_script("abc", "pytest", [], "")
    assert read_eval_script(bare, "abc") == ([], "pytest", []) and "git" not in bare


def test_the_factory_s_rows_are_swebench_rows_planned_by_the_same_function(tmp_path):
    """make-tasks' row (SWE-bench 5.x's eval_script, log_parser, eval_type; written top-level) and a row of the
    older form (extra.test_cmd, extra.test_files) of the same task give the same plan; only `source` differs."""
    repo = tmp_path / "repos" / "r"
    repo.mkdir(parents=True)
    common = {"instance_id": "lib__lib-0", "repo": "lib/lib", "base_commit": "abc", "patch": "",
              "test_patch": DJANGO_TEST_PATCH, "problem_statement": "p", "FAIL_TO_PASS": ["t::a"],
              "PASS_TO_PASS": []}  # fmt: skip
    cmd, files = (
        "python -m pytest -rA tests/auth_tests/test_validators.py",
        ["tests/auth_tests/test_validators.py"],
    )
    old = {**common, "extra": {"repo_dir": "repos/r", "test_cmd": cmd, "test_files": files}}
    new = {**common, "extra": {"repo_dir": "repos/r", "eval_script": make_eval_script("abc", cmd, files,
                                                                                       DJANGO_TEST_PATCH),
                               "log_parser": "parse_log_pytest", "eval_type": "pass_and_fail"}}  # fmt: skip
    write_jsonl(tmp_path / "t.jsonl", [old, {**new, "instance_id": "lib__lib-1"}])
    a, b = load_tasks(tmp_path / "t.jsonl")
    assert (a.plan.source, b.plan.source) == ("project", "swebench")
    assert replace(a.plan, source="swebench") == b.plan
    assert (
        b.plan.repo_dir == str(repo)
        and b.plan.image == b.plan.sif == ""
        and b.plan.test_files == tuple(files)
    )
    write_tasks([b], tmp_path / "w.jsonl")
    row = json.loads((tmp_path / "w.jsonl").read_text())
    assert {"eval_script", "log_parser", "eval_type"} <= set(row) and "eval_script" not in row["extra"]
    assert load_tasks(tmp_path / "w.jsonl")[0].plan == b.plan


def test_sif_names_agree_for_every_spelling_of_an_image():
    assert sif_name("r/i") == sif_name("r/i:latest") == sif_name("docker://r/i:latest") == "r_i_latest.sif"
    assert sif_name("reg:5000/r/i") == "reg_5000_r_i_latest.sif"  # a registry port is not a tag
    assert sif_name("r/i@sha256:ab") == "r_i_sha256_ab.sif"


def test_build_sifs_and_the_apptainer_backend_agree_for_both_datasets(tmp_path, capsys, monkeypatch):
    """Rows of SWE-bench 5.x (`image`), SWE-bench without an image (swebench's own instance image name) and
    SWE-rebench (`docker_image`, no tag): `build-sifs` builds each image once and the apptainer backend opens
    the SIF each task's grading plan names in sandbox.sif_dir."""
    from swe_megatron.cli import main
    from swe_megatron.config.schema import SandboxConfig
    from swe_megatron.sandbox.apptainer import ApptainerSandbox

    registry = tmp_path / "registry.json"  # the apptainer stand-in's registry: only these images exist
    monkeypatch.setenv(
        "PATH", f"{Path(__file__).parents[1] / 'fake_apptainer'}{os.pathsep}{os.environ['PATH']}"
    )
    monkeypatch.setenv("FAKE_APPTAINER_REGISTRY", str(registry))

    rows = [
        verified_row(),
        {k: v for k, v in verified_row(instance_id="django__django-11133").items() if k != "image"},
        rebench_row(),
        rebench_row(
            instance_id="0b01001001__spectree-65", docker_image=rebench_row()["docker_image"] + ":latest"
        ),
    ]
    images = {
        "swebench/sweb.eval.x86_64.django_1776_django-11099:latest": {},
        "swebench/sweb.eval.x86_64.django_1776_django-11133:latest": {},
        "swerebench/sweb.eval.x86_64.0b01001001_1776_spectree-64:latest": {},
    }
    registry.write_text(json.dumps(images))
    path, sif_dir = tmp_path / "rows.jsonl", tmp_path / "sifs"
    write_jsonl(path, rows)
    assert main(["build-sifs", str(path), "--sif-dir", str(sif_dir)]) == 0
    assert "3 image(s) for 4 task(s): 3 built" in capsys.readouterr().out
    cfg = SandboxConfig(sif_dir=str(sif_dir))
    for task in load_tasks(path):
        opened = ApptainerSandbox(task.plan.sandbox_spec(), cfg)._image()
        assert opened == str((sif_dir / task.plan.sif).resolve())
        assert json.loads(Path(opened).read_text())["source"] == task.plan.image


def test_an_image_task_never_copies_the_current_folder_as_its_repository(tmp_path, monkeypatch):
    """Its plan has no host repository (repo_dir ""): Path("") is the current folder, which a workspace must not
    copy in its place (the apptainer backend copies the image's /testbed instead; bwrap and local refuse)."""
    from swe_megatron.sandbox.base import SandboxError
    from swe_megatron.sandbox.workspace import Workspace

    (plan,) = [t.plan for t in _loaded(tmp_path, [verified_row()])]
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SandboxError, match="repo_dir is empty"):
        Workspace.create(plan.repo_dir, str(tmp_path / "ws"), os.getuid(), os.getgid(), plan.workdir)
    assert not (tmp_path / "ws").exists() or not any((tmp_path / "ws").iterdir())


def _loaded(tmp_path, rows, fmt="jsonl"):
    """The tasks of `rows` written as a .jsonl or .parquet file and loaded."""
    path = tmp_path / f"rows.{fmt}"
    (write_jsonl if fmt == "jsonl" else write_parquet)(path, rows)
    return load_tasks(path)
