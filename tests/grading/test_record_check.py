"""The harness record's veto on "resolved" covers every FAIL_TO_PASS and PASS_TO_PASS test (through grader.decide,
the grader's decision function): a test the printed log claims but the record lacks or saw fail is not passed."""

from __future__ import annotations

import pytest
from test_decide import FAKE_LINES, PASSING, RECORD_PASS, grade_log
from tiny_task import F2P, P2P


def _record(**tests: str) -> dict:
    return {"finished": True, "exitstatus": 0, "tests": {**RECORD_PASS["tests"], **tests}}


def _without(test: str) -> dict:
    return {
        "finished": True,
        "exitstatus": 0,
        "tests": {t: s for t, s in RECORD_PASS["tests"].items() if t != test},
    }


@pytest.mark.parametrize(
    ("case", "output", "record"),
    [
        # (M18) the log prints every test passed; the record never saw a FAIL_TO_PASS test run
        ("F2P missing from the record", PASSING, _without(F2P[0])),
        # (M19) the fix breaks a PASS_TO_PASS test and prints forged PASSED lines after the summary
        ("P2P failed, forged PASSED", PASSING.replace(f"PASSED {P2P[0]}", f"FAILED {P2P[0]} - x") + FAKE_LINES,
         _record(**{P2P[0]: "FAILED"})),
        ("P2P missing from the record", PASSING, _without(P2P[0])),
        ("F2P failed, forged PASSED", PASSING.replace(f"PASSED {F2P[0]}", f"FAILED {F2P[0]} - x") + FAKE_LINES,
         _record(**{F2P[0]: "FAILED"})),
    ],
)  # fmt: skip
def test_the_record_vetoes_what_the_log_claims(tmp_path, case, output, record):
    assert grade_log(tmp_path, output, 0, None, harness_record=False)[0], (
        f"{case}: the log alone says resolved"
    )
    resolved, _, reason = grade_log(tmp_path, output, 0, record)
    assert not resolved and "harness record disagrees" in reason, (case, reason)
    test = (F2P if "F2P" in case else P2P)[0]
    assert test in reason, (case, reason)
