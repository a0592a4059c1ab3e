"""One grading plan per task, made once where its row is read: this project's `TestSpec`.

    plan = make_plan(task)     # GradingPlan, or PlanError with one line saying why the row cannot be graded
    plan = plan_of(task)       # the plan made when the row was loaded (Task.plan), or a new one
    plan.sandbox_spec()        # where the agent works and the tests run
    plan.command               # what the eval script runs at plan.workdir: environment, then the tests
    plan.activate              # the environment activation the agent's shell runs first (SandboxSpec.setup)

SWE-bench's harness builds one `TestSpec` per row (swebench 5.0.2 `harness/utils.py` `make_test_spec`) and
every later step reads that object; here `tasks/load.py` calls `make_plan` for each row it reads and the
grader, the rollouts and `build-sifs` read the plan. Three kinds of row, told apart by what they carry:

  swebench     SWE-bench 5.x (Verified, Lite, full): `image`, `eval_script`, `log_parser`, `eval_type`. The
               eval script is read, not run (docs/security.md says what the grader adds to it): the lines that activate the image's environment (`source
               /opt/miniconda3/bin/activate`, `conda activate testbed`, `cd /testbed`, exports, the install
               step) and the test command between its ">>>>> Start/End Test Output" markers are kept; its
               own test-file reset, test-patch heredoc and informational git commands are dropped because
               the grader does those itself (grading/eval_script.py). The files its reset names are the
               test files.
               This project's rows (`swe-megatron make-tasks`) are SWE-bench 5.x rows as well: the same
               `eval_script` (written by `make_eval_script`, in swebench's shape, without activation lines),
               `log_parser`, `eval_type`, graded by the same function; what they add in place of an `image` is
               where the task is on the host: `extra.repo_dir` (the repository) and `extra.env_dir` (its
               environment, mounted by the bwrap/local backends); optionally `extra.harness_record: false`.
  swe-rebench  nebius/SWE-rebench: `docker_image` and `install_config` (`test_cmd`, `log_parser`, optional
               `install`, `eval_commands`), run as the SWE-rebench fork of SWE-bench's harness does
               (`swebench/harness/test_spec/python.py` `make_eval_script_list_py` and `harness/utils.py`
               `_clean_install_config` there): conda env `testbed`, the repository at /testbed, install and
               `test_cmd` under LANG=C.UTF-8, the test command followed by the test files the test patch
               adds or changes (swebench's NON_TEST_EXTS left out).
  project      rows this project wrote before that (`extra.test_cmd`, optional `extra.test_files`,
               `extra.log_parser`, `extra.eval_type`): read as the SWE-bench 5.x row they stand for (their eval
               script written from those fields), then planned by the same function; an old data/tasks cache
               keeps working.

A row with only `version` (SWE-bench before 5.x) cannot be graded here: swebench 5.0.2 no longer ships the
per-repository specs (MAP_REPO_VERSION_TO_SPECS) that turned a version into a test command.

Images: a row's `image`, else its `docker_image`, else (a SWE-bench row) swebench's own instance image name
(`swebench.task.checks.expected_image`). `sif_name` is the one mapping of an image to its SIF file name:
`build-sifs` writes `sandbox.sif_dir/<sif_name(image)>` and the apptainer backend opens that file.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swe_megatron.sandbox.base import SandboxSpec

WORKDIR = "/testbed"
"""Where SWE-bench and SWE-rebench images keep the repository."""
CONDA_ACTIVATE = ("source /opt/miniconda3/bin/activate", "conda activate testbed")
"""How SWE-bench's and SWE-rebench's images activate the task environment (their eval scripts' first lines)."""
UTF8 = "LANG=C.UTF-8 LC_ALL=C.UTF-8"
"""The locale SWE-rebench's harness runs a row's install and test commands under."""
DEFAULT_LOG_PARSER = "parse_log_pytest"
"""The parser of this project's rows that name none (they run pytest)."""


class PlanError(ValueError):
    """A row that cannot be graded; the message is one line saying why and what would fix it."""


@dataclass(frozen=True)
class GradingPlan:
    """How one task is set up and graded, made once from its row (see the module docstring)."""

    source: str
    """Which kind of row it came from: swebench, swe-rebench or project."""
    test_cmd: str
    """The test command, run at workdir after env_setup (it names the test files to run, where the row does)."""
    log_parser: str
    """swebench parser name (harness.log_parsers.PARSER_REGISTRY) that reads the test command's output."""
    eval_type: str
    """swebench EvalType value (pass_and_fail, fail_only)."""
    image: str = ""
    """Docker reference of the task image ("" for a task in a local repository)."""
    sif: str = ""
    """The image's SIF: a file name under sandbox.sif_dir (sif_name(image)), or a path given by the row."""
    repo_dir: str = ""
    """Host path of the task's repository (project rows; "" when the image holds it at workdir)."""
    env_dir: str | None = None
    """Host path of the task's Python environment (project rows on bwrap/local), else None."""
    workdir: str = WORKDIR
    """Where the repository is inside the sandbox."""
    env_setup: tuple[str, ...] = ()
    """Shell lines run before the tests, in the same shell: the image's environment activation and install."""
    activate: tuple[str, ...] = ()
    """The part of env_setup that activates the image's environment (no install step): what the agent's shell runs
    when it starts (SandboxSpec.setup), so the `python` it runs is the one the tests run with."""
    test_files: tuple[str, ...] = ()
    """Test files the row names (the eval script's test-file reset, or extra.test_files): protected from the
    model's patch and restored before the tests."""
    harness_record: bool = True
    """For pytest parsers: the harness's own record of outcomes must agree with the log (grading/grader.py)."""

    @property
    def command(self) -> str:
        """What the eval script runs at workdir: env_setup (its output discarded: the log parser reads only
        the tests' output, as SWE-bench's markers make it), then test_cmd."""
        if not self.env_setup:
            return self.test_cmd
        setup = "\n".join(self.env_setup)
        return f"{{\n{setup}\n}} >/dev/null 2>&1 </dev/null\n{self.test_cmd}"

    def sandbox_spec(self) -> SandboxSpec:
        """The sandbox this task is worked on and graded in."""
        return SandboxSpec(
            repo_dir=self.repo_dir,
            env_dir=self.env_dir,
            image=self.sif or None,
            workdir=self.workdir,
            setup=self.activate,
        )


def normal_image(image: str) -> str:
    """A docker reference as `apptainer build docker://` reads it: no docker:// prefix, ":latest" when it names
    neither a tag nor a digest (so "r/i" and "r/i:latest" are one image and one SIF)."""
    ref = image.strip().removeprefix("docker://")
    last = ref.rsplit("/", 1)[-1]
    return ref if (":" in last or "@" in last) else f"{ref}:latest"


def sif_name(image: str) -> str:
    """File name of an image's SIF in sandbox.sif_dir: the normal reference with '/', ':' and '@' made
    file-safe, plus .sif (what build-sifs writes and the apptainer backend opens)."""
    return re.sub(r"[/:@]", "_", normal_image(image)) + ".sif"


def swebench_image(instance_id: str) -> str:
    """SWE-bench's published image name for an instance (swebench.task.checks.expected_image)."""
    from swebench.task.checks import expected_image

    return expected_image(instance_id)


def task_image(task: Any) -> str:
    """The docker image a task runs in, normalised: the row's `image`, else `docker_image`, else SWE-bench's
    name for its instance id; "" for a task of this project in a local repository (nothing to build)."""
    extra = task.extra or {}
    given = _text_field(extra, "image") if not _is_sif_path(extra.get("image")) else ""
    given = given or task.docker_image
    if given:
        return normal_image(given)
    if extra.get("repo_dir") or extra.get("image"):
        return ""
    return normal_image(swebench_image(task.instance_id))


def make_plan(task: Any) -> GradingPlan:
    """The grading plan of a loaded task (tasks.schema.Task); PlanError (one line) when the row cannot be graded."""
    extra = task.extra or {}
    if extra.get("eval_script"):
        plan = _swebench_plan(task, extra)
    elif extra.get("install_config"):
        plan = _rebench_plan(task, extra)
    elif "test_cmd" in extra or extra.get("repo_dir"):
        plan = _swebench_plan(task, _as_swebench_row(task, extra), source="project")
    else:
        raise PlanError(
            f"task {task.instance_id} has nothing to grade with: no eval_script (SWE-bench 5.x rows), "
            "install_config (SWE-rebench rows) or extra.test_cmd (this project's rows); a row with only "
            f"`version` ({task.version or 'none here'}) needs swebench's per-repository specs, which swebench "
            "5.0.2 no longer ships: download the dataset again (its current rows carry eval_script)"
        )
    _check_names(task.instance_id, plan.log_parser, plan.eval_type)
    return plan


def plan_of(task: Any) -> GradingPlan:
    """The task's plan: the one made when its row was loaded (Task.plan), else (a Task built in code) a new one;
    PlanError when its row cannot be graded."""
    if task.plan is not None:
        return task.plan
    if task.plan_problem:
        raise PlanError(task.plan_problem)
    return make_plan(task)


# -- the three kinds of row -----------------------------------------------------------------------------


def _swebench_plan(task: Any, extra: dict, source: str = "swebench") -> GradingPlan:
    """The plan of a SWE-bench 5.x row. This project's rows are SWE-bench 5.x rows too (make-tasks writes their
    eval_script, log_parser and eval_type) with the task image replaced by two host paths, extra.repo_dir (the
    repository) and extra.env_dir (its environment, which bwrap and the stand-in mount where the image would keep
    it); extra.image may name a SIF file and extra.harness_record (false) turns the pytest record off."""
    where = f"task {task.instance_id}"
    script = _text_field(extra, "eval_script", where)
    setup, test_cmd, test_files = read_eval_script(script, task.base_commit, where)
    log_parser = _text_field(extra, "log_parser", where)
    if not log_parser:
        _missing(where, "log_parser", "SWE-bench 5.x rows")
    repo_dir, env_dir = _host_path(extra, "repo_dir", where), _host_path(extra, "env_dir", where)
    given = _text_field(extra, "image", where)
    image = task_image(task)
    sif = sif_name(image) if image else (given if _is_sif_path(given) else "")
    if not repo_dir and not sif:
        raise PlanError(f"{where} has no extra.repo_dir (or image) to grade in")
    return GradingPlan(
        source=source,
        test_cmd=test_cmd,
        log_parser=log_parser,
        eval_type=_text_field(extra, "eval_type", where) or "pass_and_fail",
        image=image,
        sif=sif,
        repo_dir=repo_dir,
        env_dir=env_dir or None,
        env_setup=tuple(setup),
        activate=tuple(eval_script_activation(script)),
        test_files=tuple(test_files),
        harness_record=extra.get("harness_record", True) is not False,
    )


def _rebench_plan(task: Any, extra: dict) -> GradingPlan:
    where = f"task {task.instance_id}"
    config = extra["install_config"]  # tasks.load has made a JSON string of one an object
    if not isinstance(config, dict):
        raise PlanError(f"{where}: install_config is {type(config).__name__}, not an object")
    test_cmd = config.get("test_cmd")
    if isinstance(test_cmd, list):
        raise PlanError(
            f"{where}: install_config.test_cmd is a list (SWE-rebench-V2's format, repository at /<repo>): "
            "only SWE-rebench rows (one test_cmd string, repository at /testbed) are supported"
        )
    if not isinstance(test_cmd, str) or not test_cmd.strip():
        _missing(where, "install_config.test_cmd", "SWE-rebench rows")
    parser = config.get("log_parser")
    if not isinstance(parser, str) or not parser:
        _missing(where, "install_config.log_parser", "SWE-rebench rows")
    image = task_image(task)
    # As the fork's load_swebench_dataset (_clean_install_config) runs them: under a UTF-8 locale.
    install = [f"{UTF8} {line}" for line in _lines(config.get("install"))]
    activate = [*CONDA_ACTIVATE, f"cd {WORKDIR}", *_lines(config.get("eval_commands"))]
    files = test_directives(task.repo, task.test_patch, where)
    return GradingPlan(
        source="swe-rebench",
        test_cmd=" ".join([f"{UTF8} {test_cmd.strip()}", *(shlex.quote(f) for f in files)]),
        log_parser=parser,
        eval_type="pass_and_fail",
        image=image,
        sif=sif_name(image),
        env_setup=(*activate, *install),
        activate=tuple(activate),
        test_files=tuple(_changed_files(task.test_patch, where)),
    )


def _as_swebench_row(task: Any, extra: dict) -> dict:
    """A row of this project written before make-tasks wrote SWE-bench 5.x fields (extra.test_cmd, optional
    extra.test_files, extra.log_parser, extra.eval_type), as the SWE-bench 5.x row it stands for: its eval script
    written from them (make_eval_script), so that one function (_swebench_plan) makes every such plan."""
    where = f"task {task.instance_id}"
    test_cmd = _text_field(extra, "test_cmd", where)
    if not test_cmd:
        raise PlanError(f"{where} has no extra.test_cmd")
    if not extra.get("repo_dir") and not extra.get("image") and not task.docker_image:
        raise PlanError(f"{where} has extra.test_cmd but no extra.repo_dir (or extra.image) to grade in")
    files = extra.get("test_files") or []
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        raise PlanError(f"{where}: extra.test_files must be a list of paths")
    script = make_eval_script(task.base_commit, test_cmd, files, task.test_patch)
    return {
        **extra,
        "eval_script": script,
        "log_parser": _text_field(extra, "log_parser", where) or DEFAULT_LOG_PARSER,
    }


# -- reading the rows' scripts --------------------------------------------------------------------------

_HEREDOC = re.compile(r"<<-?\s*(['\"]?)(\w+)\1\s*$")
_DROPPED = (
    re.compile(r"^#!"),
    re.compile(r"^set -[a-z]+( pipefail)?$"),
    re.compile(r"^git (status|show)$"),
    re.compile(r"^git -c core\.fileMode=false diff\b"),
    re.compile(r"^git config --global --add safe\.directory\b"),
)


HEREDOC = "EOF_114329324912"
"""The heredoc delimiter of swebench's eval scripts (harness/test_spec/python.py)."""


def make_eval_script(
    base_commit: str, test_cmd: str, test_files: list[str], test_patch: str, setup: tuple[str, ...] = ()
) -> str:
    """An eval script in the shape swebench's harness writes (make_eval_script_list_py): `setup` (the image's
    activation; none for a task whose environment the sandbox mounts), the test files reset to the base commit, the
    test patch applied from a heredoc, the test command between the ">>>>> Start/End Test Output" markers, the
    reset again. read_eval_script reads back (setup, test_cmd, test_files)."""
    start, end = _markers()
    reset = (
        [f"git checkout {base_commit} {' '.join(shlex.quote(f) for f in test_files)}"] if test_files else []
    )
    apply = [f"git apply -v - <<'{HEREDOC}'", test_patch.rstrip("\n"), HEREDOC] if test_patch.strip() else []
    lines = ["#!/bin/bash", "set -uxo pipefail", *setup, *reset, *apply]
    return "\n".join([*lines, f": '{start}'", test_cmd, f": '{end}'", *reset, ""])


def read_eval_script(script: str, base_commit: str, where: str = "row") -> tuple[list[str], str, list[str]]:
    """(environment lines, test command, test files) of a SWE-bench eval script (swebench's eval.sh shape:
    setup, `git checkout BASE FILES` reset, test patch as a heredoc, the test command between the
    ">>>>> Start/End Test Output" markers, the reset again). PlanError when it has no such markers."""
    start, end = _markers()
    setup: list[str] = []
    tests: list[str] | None = None
    files: list[str] = []
    heredoc = None
    reset = f"git checkout {base_commit} "
    for raw in script.splitlines():
        line = raw.strip()
        if heredoc is not None:
            heredoc = None if line == heredoc else heredoc
            continue
        if match := _HEREDOC.search(line):
            heredoc = match.group(2)  # the test patch: the grader applies it itself
            continue
        if start in line:
            tests = []
        elif end in line:
            break
        elif tests is not None:
            if line:
                tests.append(raw)
        elif line.startswith(reset):
            files += shlex.split(line[len(reset) :])
        elif line and not line.startswith("#") and not any(p.search(line) for p in _DROPPED):
            setup.append(line)
    if not tests:
        raise PlanError(
            f"{where}: eval_script has no test command between the '{start}' and '{end}' markers "
            "(swebench 5.x eval scripts have both)"
        )
    return setup, "\n".join(tests), files


def eval_script_activation(script: str) -> list[str]:
    """The lines of a SWE-bench eval script that activate the image's environment: those before its first git
    command (swebench's make_eval_script_list_py writes the activation, `cd /testbed` and the repository's
    eval_commands there; the informational git commands, the second activation and the install step come after)."""
    lines = []
    for raw in script.splitlines():
        line = raw.strip()
        if line.startswith("git ") or _markers()[0] in line or _HEREDOC.search(line):
            break
        if line and not line.startswith("#") and not any(p.search(line) for p in _DROPPED):
            lines.append(line)
    return lines


def test_directives(repo: str, test_patch: str, where: str = "row") -> list[str]:
    """The test files a SWE-rebench test command is followed by (the fork's get_test_directives): files the
    test patch adds or changes, without swebench's NON_TEST_EXTS; django's as dotted module names."""
    from swe_megatron.grading.swebench_light import import_swebench_grading

    non_test = tuple(import_swebench_grading()[2].NON_TEST_EXTS)
    files = [f for f in _changed_files(test_patch, where) if not f.endswith(non_test)]
    if repo == "django/django":
        files = [f.removesuffix(".py").removeprefix("tests/").replace("/", ".") for f in files]
    return files


def _changed_files(test_patch: str, where: str) -> list[str]:
    """Files a patch adds or changes (not the ones it deletes), in patch order."""
    from unidiff import PatchSet

    if not test_patch.strip():
        return []
    try:
        return [pf.path for pf in PatchSet(test_patch if test_patch.endswith("\n") else test_patch + "\n")
                if not pf.is_removed_file]  # fmt: skip
    except Exception as e:  # noqa: BLE001 - unidiff raises several types for a malformed diff
        raise PlanError(f"{where}: test_patch does not parse ({type(e).__name__}: {e})") from None


# -- fields ---------------------------------------------------------------------------------------------


def _markers() -> tuple[str, str]:
    from swe_megatron.grading.swebench_light import import_swebench_grading

    c = import_swebench_grading()[2]
    return c.START_TEST_OUTPUT, c.END_TEST_OUTPUT


def _check_names(instance_id: str, log_parser: str, eval_type: str) -> None:
    from swe_megatron.grading.swebench_light import import_swebench_grading

    _, parsers, constants = import_swebench_grading()
    if log_parser not in parsers.PARSER_REGISTRY:
        raise PlanError(
            f"task {instance_id}: unknown log parser {log_parser!r} (not one of the installed swebench's "
            f"{len(parsers.PARSER_REGISTRY)} parsers, harness.log_parsers.PARSER_REGISTRY)"
        )
    allowed = [e.value for e in constants.EvalType]
    if eval_type not in allowed:
        raise PlanError(f"task {instance_id}: unknown eval_type {eval_type!r}; allowed: {', '.join(allowed)}")


def _text_field(extra: dict, key: str, where: str = "row") -> str:
    value = extra.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise PlanError(f"{where}: {key} is {type(value).__name__}, not a string")
    return value


def _missing(where: str, key: str, kind: str) -> None:
    raise PlanError(f"{where}: {key} is missing (it is part of {kind})")


def _host_path(extra: dict, key: str, where: str) -> str:
    value = _text_field(extra, key, where)
    if value and not Path(value).is_absolute():
        raise PlanError(
            f"{where}: extra.{key} {value!r} is relative; load tasks with swe_megatron.tasks.load "
            "(it resolves paths against the tasks file's folder)"
        )
    return value


def _is_sif_path(value: Any) -> bool:
    """extra.image of this project's rows names a SIF file (a path or a .sif name), not a docker reference."""
    return isinstance(value, str) and (value.endswith(".sif") or value.startswith("/"))


def _lines(value: Any) -> list[str]:
    if not value:
        return []
    return [value] if isinstance(value, str) else [str(v) for v in value]
