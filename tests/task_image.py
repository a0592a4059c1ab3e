"""A task image in SWE-bench's layout, built here without Docker or a hub, and rows for it in each dataset's format.

    image = build_image(task, sif_dir)      # a folder image for tests/fake_apptainer, named as plan.sif_name says
    swebench_row(task), rebench_row(task)   # the task as SWE-bench 5.x and as SWE-rebench publish theirs

The image is made from a task of this project's factory (a PyPI sdist of a pure-Python library with its tests,
swe_megatron/tasks/factory), laid out as SWE-bench's and SWE-rebench's images keep their tasks:

    /testbed                        the repository, a git repository at the task's base commit
    /opt/miniconda3/envs/testbed    its Python environment: the factory's venv of Debian's Python (pytest and the
                                    library's requirements), its scripts' paths made the image's, and the repository
                                    on its path (a .pth file, as SWE-bench's `pip install -e .` leaves one)
    /opt/miniconda3/bin/activate    enough of conda for the eval scripts' `source /opt/miniconda3/bin/activate` and
                                    `conda activate testbed` (no conda package is installable offline): it puts the
                                    environment's bin first on PATH and sets CONDA_PREFIX/CONDA_DEFAULT_ENV

A folder image (apptainer's sandbox format) runs on the stand-in apptainer over the host's system folders
(tests/fake_apptainer/apptainer); a real apptainer would need the operating system in it too.

The rows follow the datasets' own sources: SWE-bench 5.x rows (swebench 5.0.2 `harness/utils.py make_test_spec`:
image, eval_script, log_parser, eval_type; FAIL_TO_PASS/PASS_TO_PASS as JSON strings) with the eval script in the
shape swebench's harness writes it (make_eval_script_list_py: activation, `cd /testbed`, informational git,
activation again, test-file reset, the test patch as a heredoc, the test command between the markers, the reset
again); SWE-rebench rows (nebius/SWE-rebench: docker_image without a tag, install_config with the test command and
log parser, its unset keys None; lists as lists).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from swe_megatron.tasks.plan import sif_name

FAKE_APPTAINER = Path(__file__).resolve().parent / "fake_apptainer"
"""The stand-in apptainer (tests/fake_apptainer): first on PATH, `apptainer` runs folder images."""

ENV = "/opt/miniconda3/envs/testbed"
ACTIVATE = """\
# conda's activate, as far as SWE-bench's eval scripts use it (a test image: no conda package is installable here)
conda() {
  if [ "$1" = activate ] && [ -d "/opt/miniconda3/envs/$2" ]; then
    export CONDA_PREFIX="/opt/miniconda3/envs/$2" CONDA_DEFAULT_ENV="$2"
    export PATH="$CONDA_PREFIX/bin:$PATH"
  else
    echo "conda: unsupported: $*" >&2; return 1
  fi
}
export CONDA_PREFIX=/opt/miniconda3 CONDA_DEFAULT_ENV=base
"""
HEREDOC = "EOF_114329324912"
"""The heredoc delimiter of swebench's eval scripts (harness/test_spec/python.py in swebench 4.x)."""
PYTEST_CMD = "pytest -rA -p no:cacheprovider -o addopts="
"""The image's console script, as SWE-bench's and SWE-rebench's pytest tasks run it (addopts off: a library's
coverage options need plugins the environment lacks)."""


def image_name(task, dataset: str) -> str:
    """The docker reference the dataset would publish for the task (swebench's instance image naming)."""
    owner = "swebench" if dataset == "swebench" else "swerebench"
    return f"{owner}/sweb.eval.x86_64.{task.instance_id.replace('__', '_1776_')}"


def build_image(task, sif_dir: Path, dataset: str = "swebench") -> Path:
    """The folder image of a factory task at sif_dir/sif_name(its reference); world-readable, like a SIF on disk."""
    extra = task.extra
    image = Path(sif_dir) / sif_name(image_name(task, dataset))
    if image.exists():
        return image
    part = image.with_name(image.name + ".part")
    shutil.rmtree(part, ignore_errors=True)
    shutil.copytree(extra["repo_dir"], part / "testbed", symlinks=True)
    env = part / ENV.lstrip("/")
    shutil.copytree(extra["env_dir"], env, symlinks=True)
    # Console scripts and activate name the folder the venv was made in (the factory's base venv): the image's.
    scripts = [p for p in (env / "bin").iterdir() if p.is_file() and not p.is_symlink()]
    made_in = {str(Path(extra["env_dir"]).resolve()).encode()}
    made_in |= {m.group(1) for p in scripts if (m := re.match(rb"#!(/\S+)/bin/python", p.read_bytes()))}
    for script in scripts:
        text = script.read_bytes()
        for prefix in made_in:
            text = text.replace(prefix, ENV.encode())
        script.write_bytes(text)
    (site,) = (env / "lib").glob("python3*/site-packages")
    (site / "__editable__testbed.pth").write_text("/testbed\n")
    activate = part / "opt" / "miniconda3" / "bin" / "activate"
    activate.parent.mkdir(parents=True)
    activate.write_text(ACTIVATE)
    for path in [part, *part.rglob("*")]:
        if not path.is_symlink():
            path.chmod(path.stat().st_mode | 0o444 | (0o111 if path.is_dir() else 0))
    part.rename(image)
    return image


def _test_files(task) -> list[str]:
    return list(task.plan.test_files)


def swebench_eval_script(task, test_cmd: str) -> str:
    """The eval script SWE-bench's harness writes for a task (see the module docstring)."""
    base, files = task.base_commit, " ".join(_test_files(task))
    return "\n".join(
        [
            "#!/bin/bash",
            "set -uxo pipefail",
            "source /opt/miniconda3/bin/activate",
            "conda activate testbed",
            "cd /testbed",
            "git config --global --add safe.directory /testbed",
            "cd /testbed",
            "git status",
            "git show",
            f"git -c core.fileMode=false diff {base}",
            "source /opt/miniconda3/bin/activate",
            "conda activate testbed",
            f"git checkout {base} {files}",
            f"git apply -v - <<'{HEREDOC}'",
            task.test_patch.rstrip("\n"),
            HEREDOC,
            ": '>>>>> Start Test Output'",
            test_cmd,
            ": '>>>>> End Test Output'",
            f"git checkout {base} {files}",
            "",
        ]
    )


def _common(task) -> dict:
    return {
        "repo": task.repo,
        "instance_id": task.instance_id,
        "base_commit": task.base_commit,
        "patch": task.patch,
        "test_patch": task.test_patch,
        "problem_statement": task.problem_statement,
        "hints_text": "",
        "created_at": task.created_at,
        "version": task.version,
        "environment_setup_commit": task.base_commit,
    }


def swebench_row(task, test_cmd: str = "", log_parser: str = "parse_log_pytest") -> dict:
    """The task as a SWE-bench 5.x row (Verified's columns); test_cmd (default: pytest on the task's test files)
    and log_parser as swebench's spec for its repository gives them."""
    test_cmd = test_cmd or f"{PYTEST_CMD} {' '.join(_test_files(task))}"
    return {
        **_common(task),
        "FAIL_TO_PASS": json.dumps(task.FAIL_TO_PASS),
        "PASS_TO_PASS": json.dumps(task.PASS_TO_PASS),
        "difficulty": "<15 min fix",
        "image": image_name(task, "swebench") + ":latest",
        "eval_script": swebench_eval_script(task, test_cmd),
        "log_parser": log_parser,
        "eval_type": "pass_and_fail",
    }


def rebench_row(task) -> dict:
    """The task as a nebius/SWE-rebench row."""
    return {
        **_common(task),
        "meta": {"has_test_patch": True, "is_lite": False, "num_modified_files": 1},
        "install_config": {
            "env_vars": None,
            "env_yml_path": None,
            "install": None,
            "log_parser": "parse_log_pytest",
            "no_use_env": None,
            "packages": None,
            "pip_packages": ["pytest"],
            "pre_install": None,
            "python": "3.11",
            "reqs_path": None,
            "test_cmd": PYTEST_CMD,
        },
        "requirements": "",
        "environment": "",
        "FAIL_TO_PASS": list(task.FAIL_TO_PASS),
        "FAIL_TO_FAIL": [],
        "PASS_TO_PASS": list(task.PASS_TO_PASS),
        "PASS_TO_FAIL": [],
        "license_name": "MIT",
        "docker_image": image_name(task, "swe-rebench"),
        "image_name": image_name(task, "swe-rebench"),
    }


def grade_patches_in_images(row: dict, patches: dict[str, str], tmp_path: Path, sandbox: list[str]) -> dict:
    """`swe-megatron grade --sandbox apptainer` (the stand-in apptainer first on PATH) on one row per named patch
    (instance ids ROW-NAME); returns the report with `name`, instance id -> patch name."""
    import os

    import pytest

    from swe_megatron.cli import main

    rows, preds, out = tmp_path / "rows.jsonl", tmp_path / "preds.jsonl", tmp_path / "report.json"
    ids = {n: f"{row['instance_id']}-{n}" for n in patches}
    rows.write_text("".join(json.dumps({**row, "instance_id": ids[n]}) + "\n" for n in patches))
    preds.write_text("".join(json.dumps({"instance_id": ids[n], "model_name_or_path": "m", "model_patch": p}) + "\n"
                             for n, p in patches.items()))  # fmt: skip
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", f"{FAKE_APPTAINER}{os.pathsep}{os.environ['PATH']}")
        argv = [
            "grade",
            "--tasks",
            str(rows),
            "--predictions",
            str(preds),
            "--out",
            str(out),
            "--workers",
            "2",
        ]
        assert main([*argv, "--sandbox", "apptainer", *sandbox]) == 0
    report = json.loads(out.read_text())
    report["name"] = {i: n for n, i in ids.items()}
    return report
