#!/usr/bin/env bash
# The README's test command: everything that can run on a CPU machine.
# Installs the CPU world (idempotent), prepares bubblewrap + the sandbox user and the local 3-node
# Slurm test cluster (tools/slurm_up.sh --nodes 3) when run as root (both idempotent; the cluster is
# left running for the next test run: tools/slurm_down.sh stops it), then runs pytest over ALL markers
# (dist, slurm, sandbox, e2e; gpu tests skip without CUDA) on SWE_TEST_WORKERS pytest-xdist workers
# (default 2: a single e2e test keeps about one core busy, most of its time in imports and server starts),
# a test file per unit of work, the slow files first, the Slurm test files one unit together (tests/conftest.py).
# Extra arguments go to pytest (-n 0 runs in one process).
# Plain `pytest` (no -m) runs only the fast unit tests.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
tools/install_cpu.sh
if [[ $(id -u) == 0 ]]; then
  tools/sandbox_setup.sh
  tools/slurm_up.sh --nodes 3
else
  echo "test.sh: not root: sandbox and slurm tests will skip unless set up already (run tools/sandbox_setup.sh and tools/slurm_up.sh --nodes 3 as root)" >&2
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# pytest exits 5 when it collects nothing: that is a failure here too (set -e).
exec .venv/bin/python -m pytest -m "" -n "${SWE_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder "$@"
