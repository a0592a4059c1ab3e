"""Task rows shared by tests of the commands' input checks (no repository behind them)."""

MINIMAL_ROW = {
    "instance_id": "lib__x-1",
    "repo": "lib/x",
    "base_commit": "0" * 40,
    "patch": "",
    "problem_statement": "p",
    "FAIL_TO_PASS": ["t::a"],
    "PASS_TO_PASS": [],
}
"""The fields every SWE-bench row has; tests add repo_dir, test_cmd or env_dir as they need them."""
