"""Predictions in, grade report out (SWE-bench's formats, plus what the sanitiser dropped per instance).

Predictions: JSONL, one {"instance_id", "model_name_or_path", "model_patch"} per line (model_patch may be
null or ""). A JSON list of such objects is accepted too. The report has every key of SWE-bench 5's run
report (schema_version 2: the *_instances counts, the *_ids lists, failure_reasons) with the same meaning,
and adds `instances`: per instance its model_name_or_path (a string), the status, reason,
FAIL_TO_PASS/PASS_TO_PASS success/failure lists, dropped files and log path; `model_name_or_path` (the one
model's name, "" when the predictions name several) and `model_names` (all of them, a list); and
`suspicious_ids` / `tampered_ids` / `harness_fault_ids` (grader.GradeResult.suspicious / .tampered /
.harness_fault: the harness failed on that patch, scored 0).

Where this differs from SWE-bench: a patch that does not apply is unresolved (it is the model's
failure; SWE-bench files it under errors), and error_ids holds infrastructure failures only (so they are
infra_failure_ids too, and ambiguous_failure_ids is empty).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from swe_megatron.atomic_write import write_atomic
from swe_megatron.grading.grader import EMPTY_PATCH, ERROR, RESOLVED, UNRESOLVED, GradeResult

SCHEMA = "swe_megatron.grade_report/2"
SWEBENCH_SCHEMA_VERSION = 2
"""The schema_version of SWE-bench 5's run report (swebench/harness/reporting.py), whose keys this report has."""


class PredictionsError(ValueError):
    """The predictions file is missing or malformed; the message names the file, line and fix."""


def load_predictions(path: str | Path) -> dict[str, dict[str, Any]]:
    """instance_id -> prediction, in file order; PredictionsError for any malformed row or duplicate id."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise PredictionsError(f"predictions file {path}: cannot read it ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise PredictionsError(f"predictions file {path}: not UTF-8 text") from None
    rows: list[tuple[int, Any]] = []
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise PredictionsError(f"predictions file {path}: not valid JSON ({e})") from None
        rows = [(i + 1, row) for i, row in enumerate(data)]
        where = "item"
    else:
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append((n, json.loads(line)))
            except json.JSONDecodeError as e:
                raise PredictionsError(
                    f"predictions file {path} line {n}: not valid JSON ({e.msg})"
                ) from None
        where = "line"
    if not rows:
        raise PredictionsError(f"predictions file {path}: no predictions in it")
    out: dict[str, dict[str, Any]] = {}
    for n, row in rows:
        at = f"predictions file {path} {where} {n}"
        if not isinstance(row, dict):
            raise PredictionsError(
                f"{at}: expected an object with instance_id, model_name_or_path, model_patch"
            )
        iid = row.get("instance_id")
        if not isinstance(iid, str) or not iid:
            raise PredictionsError(f"{at}: missing or empty instance_id")
        if "model_patch" not in row:
            raise PredictionsError(f'{at}: missing model_patch (use "" or null for no patch)')
        if row["model_patch"] is not None and not isinstance(row["model_patch"], str):
            raise PredictionsError(f"{at}: model_patch must be a string or null")
        if row.get("model_name_or_path") is not None and not isinstance(row["model_name_or_path"], str):
            raise PredictionsError(f"{at}: model_name_or_path must be a string or null")
        if row.get("model_name_or_path") and log_folder_name(row["model_name_or_path"]) in (".", ".."):
            raise PredictionsError(
                f"{at}: model_name_or_path {row['model_name_or_path']!r} cannot name a log folder"
            )
        if iid in out:
            raise PredictionsError(f"{at}: instance_id {iid!r} appears twice")
        out[iid] = {
            "instance_id": iid,
            "model_name_or_path": row.get("model_name_or_path") or "",
            "model_patch": row["model_patch"] or "",
        }
    return out


def log_folder_name(model_name_or_path: str) -> str:
    """The model's folder in SWE-bench's log layout (run_evaluation.py: "/" -> "__", "None" when unnamed)."""
    return (model_name_or_path or "None").replace("/", "__").replace("\0", "")


def build_report(
    results: Iterable[GradeResult], task_ids: Iterable[str], predictions: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """The run report: SWE-bench's id lists and counts, plus per-instance details."""
    results = sorted(results, key=lambda r: r.instance_id)
    by_status: dict[str, list[str]] = {s: [] for s in (RESOLVED, UNRESOLVED, EMPTY_PATCH, ERROR)}
    for r in results:
        by_status[r.status].append(r.instance_id)
    task_ids = sorted(set(task_ids))
    graded = {r.instance_id for r in results}
    completed = sorted(graded - set(by_status[ERROR]) - set(by_status[EMPTY_PATCH]))
    models = sorted({str(p.get("model_name_or_path", "")) for p in predictions.values()} - {""})
    instances = {}
    for r in results:
        d = {"model_name_or_path": str(predictions.get(r.instance_id, {}).get("model_name_or_path") or ""),
             **r.to_dict()}  # fmt: skip
        d.pop("instance_id")
        d["dropped"] = [{"path": x.path, "reason": x.reason} for x in r.dropped]
        ts = d.pop("tests_status") or {}
        d["FAIL_TO_PASS"] = ts.get("FAIL_TO_PASS")
        d["PASS_TO_PASS"] = ts.get("PASS_TO_PASS")
        instances[r.instance_id] = d
    return {
        "schema": SCHEMA,
        "model_name_or_path": models[0] if len(models) == 1 else "",
        "model_names": models,
        "total_instances": len(task_ids),
        "submitted_instances": len(predictions),
        "completed_instances": len(completed),
        "resolved_instances": len(by_status[RESOLVED]),
        "unresolved_instances": len(by_status[UNRESOLVED]),
        "infra_failure_instances": len(by_status[ERROR]),
        "ambiguous_failure_instances": 0,
        "empty_patch_instances": len(by_status[EMPTY_PATCH]),
        "error_instances": len(by_status[ERROR]),
        "completed_ids": completed,
        "incomplete_ids": sorted(set(task_ids) - graded),
        "empty_patch_ids": by_status[EMPTY_PATCH],
        "submitted_ids": sorted(predictions),
        "resolved_ids": by_status[RESOLVED],
        "unresolved_ids": by_status[UNRESOLVED],
        "infra_failure_ids": by_status[ERROR],
        "ambiguous_failure_ids": [],
        "failure_reasons": {r.instance_id: r.reason for r in results if r.status == ERROR},
        "error_ids": by_status[ERROR],
        "schema_version": SWEBENCH_SCHEMA_VERSION,
        "dropped_files": sum(len(r.dropped) for r in results),
        "suspicious_ids": [r.instance_id for r in results if r.suspicious],
        "tampered_ids": [r.instance_id for r in results if r.tampered],
        "harness_fault_ids": [r.instance_id for r in results if r.harness_fault],
        "instances": instances,
    }


def write_report(report: Mapping[str, Any], path: str | Path) -> Path:
    """Write the report as JSON atomically (a temporary file in the same folder, then rename)."""
    return write_atomic(path, json.dumps(report, indent=2, default=str) + "\n")
