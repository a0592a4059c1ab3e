"""Grading: sanitise a model patch, run the task's tests on it in a fresh sandbox, decide with swebench.

    from swe_megatron.grading import grade_one
    result = grade_one(task, patch, lambda spec: make_sandbox(spec, cfg.sandbox), log_dir=...)
    result.reward  # 1.0 resolved, 0.0 unresolved/empty, None for an infrastructure error (excluded)

grader.py says what counts as what; sanitize.py what is stripped from patches; report.py and command.py
are `swe-megatron grade`.
"""

from __future__ import annotations

from swe_megatron.grading.grader import GradeResult, grade_many, grade_one
from swe_megatron.grading.sanitize import SanitizedPatch, sanitize_patch

__all__ = ["GradeResult", "SanitizedPatch", "grade_many", "grade_one", "sanitize_patch"]
