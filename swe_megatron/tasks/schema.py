"""One task in SWE-bench format (plus SWE-rebench extras)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from swe_megatron.tasks.plan import GradingPlan


@dataclass
class Task:
    """A SWE-bench instance. FAIL_TO_PASS / PASS_TO_PASS are lists of test ids (pytest node ids)."""

    instance_id: str
    """Unique id, e.g. "toolz__toolz-0007"."""
    repo: str
    """Repository name, "owner/name"."""
    base_commit: str
    """Commit the task's repository is checked out at."""
    patch: str
    """Gold patch (unified diff) that fixes the issue."""
    test_patch: str
    """Diff that adds/restores the tests which reveal the fix."""
    problem_statement: str
    """The issue text the agent sees."""
    FAIL_TO_PASS: list[str]
    """Tests that fail before the gold patch and pass after."""
    PASS_TO_PASS: list[str]
    """Tests that pass before and after."""
    hints_text: str = ""
    """Hints (issue comments); unused by the agent by default."""
    created_at: str = ""
    """Creation time (ISO 8601)."""
    version: str = ""
    """Environment version of the repository."""
    environment_setup_commit: str = ""
    """Commit the environment was built from."""
    docker_image: str = ""
    """SWE-rebench: image with the repo at /testbed (built into a SIF on clusters)."""
    meta: dict[str, Any] = field(default_factory=dict)
    """SWE-rebench metadata, e.g. {"llm_score": {"difficulty_score": ..., "issue_text_score": ..., "test_score": ...}}."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Fields of this project (e.g. the local repository path, test command) kept with the row."""
    plan: GradingPlan | None = field(default=None, init=False, repr=False, compare=False)
    """How the task is graded (tasks.plan), made once when its row is loaded; None for a row that cannot be
    graded (plan_problem says why) or a Task built in code (tasks.plan.make_plan makes one when needed)."""
    plan_problem: str = field(default="", init=False, repr=False, compare=False)
    """Why the row cannot be graded (one line), "" when it can."""
