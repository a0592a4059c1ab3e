#!/usr/bin/env bash
# The sync path's one-GPU checks and the GPU-marked tests (tests/engine/test_weight_sync_gpu.py,
# tests/train/test_gpu.py) on one GPU machine without network, in one command that ends within 10 minutes
# (install included).
#
# The machine's image brings Python >= 3.12 and a CUDA torch (e.g. torch 2.11); everything else comes
# from a folder of wheels carried along (~46 MB: megatron-core 0.19.2, transformers 5.19.0, omegaconf,
# safetensors, psutil, pytest and their dependencies). Transformer Engine and vLLM are too large to carry:
# without them the TE tests skip with "could not import 'transformer_engine'" and the rest run on the
# local layer spec. Wheels are never committed; fetch them on a machine with PyPI access:
#
#   tools/gpu_check.sh --fetch [DIR]     # downloads the wheels for CPython 3.12 linux x86_64 into DIR
#   tools/gpu_check.sh [DIR]             # on the GPU machine: installs from DIR offline, runs the checks
#   GPU_CHECK_TESTS=0 tools/gpu_check.sh [DIR]   # the sync path's checks only (~1-2 min after the install)
#   GPU_SYNC_TIMEOUT_S=150 tools/gpu_check.sh [DIR]   # each sync check may take 150 s, not 60
#
# DIR defaults to <repo>/.gpu-wheels. The install goes into <repo>/.gpu-venv (a venv that sees the image's
# torch through --system-site-packages). First the sync path's one-GPU checks (tools/gpu_sync_checks.py: the
# trainer's allocator settings against torch's defaults, empty_cache before a sync, an NCCL sync group given
# up while forming and aborted, the process going on), each in a child process with a 60 s limit, then the
# tests. Figures are printed as `gpu_sync:` lines and by the tests (-s); copy them to docs/benchmarks.md
# ("GPU checks"). Exit status: the tests', else the sync checks' (1 when one hung, failed or showed a problem).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
budget_s=${GPU_CHECK_BUDGET_S:-600}
start=$SECONDS
py=${PYTHON:-python3}

if [[ ${1:-} == --fetch ]]; then
  dir=${2:-$root/.gpu-wheels}
  mkdir -p "$dir"
  dl=("$py" -m pip download -q --disable-pip-version-check -d "$dir")
  bin=(--only-binary :all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
       --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
  # megatron-core and omegaconf without their dependencies: megatron-core's would pull torch (the image
  # has it); omegaconf's antlr4 runtime 4.9.3 exists only as an sdist (pure Python, built offline below).
  "${dl[@]}" "${bin[@]}" --no-deps megatron-core==0.19.2 omegaconf==2.3.0
  "${dl[@]}" --no-deps --no-binary :all: antlr4-python3-runtime==4.9.3
  "${dl[@]}" "${bin[@]}" transformers==5.19.0 safetensors numpy psutil pyyaml pytest pytest-timeout \
    setuptools wheel
  du -sh "$dir"
  exit 0
fi

dir=${1:-$root/.gpu-wheels}
[[ $# -gt 0 ]] && shift  # the rest goes to pytest
if [[ ! -d $dir ]] || ! compgen -G "$dir/megatron_core-0.19.2-*.whl" >/dev/null; then
  echo "gpu_check: no megatron-core 0.19.2 wheel in $dir: run 'tools/gpu_check.sh --fetch $dir' on a machine" \
       "with PyPI access and bring the folder along" >&2
  exit 1
fi
"$py" - <<'EOF' || exit 1
import sys
if sys.version_info[:2] < (3, 12):
    sys.exit(f"gpu_check: Python {sys.version.split()[0]}: megatron-core 0.19.2 needs >= 3.12 (set PYTHON)")
try:
    import torch
except ImportError:
    sys.exit("gpu_check: this Python has no torch: use the GPU image's Python (set PYTHON)")
if not torch.cuda.is_available():
    sys.exit(f"gpu_check: torch {torch.__version__} sees no CUDA device: run it on the GPU machine")
EOF

venv=$root/.gpu-venv
if [[ ! -x $venv/bin/python ]]; then
  "$py" -m venv --system-site-packages "$venv"
  # A venv made by a venv's Python (the image's is /opt/torch/.venv) sees only the base interpreter's packages:
  # a .pth file adds the maker's own site-packages (after the new venv's, so what is installed here wins).
  "$py" -c 'import site; print("\n".join(site.getsitepackages()))' \
    >"$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/_maker_site.pth"
fi
# Only what the image lacks is installed (pip keeps the image's torch, numpy, ... when they satisfy).
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-index --find-links "$dir" \
  megatron-core==0.19.2 "transformers>=5.16.1,<5.21" safetensors psutil "omegaconf==2.3.0" pytest pytest-timeout
"$venv/bin/python" - <<'EOF'
import importlib.util, platform, torch
have = {m: importlib.util.find_spec(m) is not None for m in ("megatron.core", "transformer_engine", "vllm", "transformers")}
gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
print(f"gpu_check: Python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
      f"{len(gpus)} GPU(s) {sorted(set(gpus))}; installed: {have}")
EOF
left=$((budget_s - (SECONDS - start) - 5))
echo "gpu_check: install took $((SECONDS - start)) s; tests get ${left} s"
export PYTHONPATH=$root${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
# As every swe-megatron process starts (swe_megatron/engine/sync_env.py): NCCL sync groups refuse to form without it.
export TORCH_NCCL_ASYNC_ERROR_HANDLING=2
# The sync checks first, so their figures come back even if the tests below run out of time.
sync_s=$((left < 300 ? left : 300))
sync_rc=0
timeout --kill-after=5 "$sync_s" "$venv/bin/python" tools/gpu_sync_checks.py --timeout "${GPU_SYNC_TIMEOUT_S:-60}" \
  || sync_rc=$?
echo "gpu_check: sync checks exit ${sync_rc} after $((SECONDS - start)) s"
[[ ${GPU_CHECK_TESTS:-1} == 0 ]] && exit "$sync_rc"
left=$((budget_s - (SECONDS - start) - 5))
echo "gpu_check: tests get ${left} s"
# -rs lists every skip with its reason (missing TE, fewer GPUs); the outer timeout keeps the 10 minutes.
rc=0
timeout --kill-after=5 "$left" "$venv/bin/python" -m pytest -m gpu tests/engine/test_weight_sync_gpu.py \
  tests/train/test_gpu.py -s -rs \
  -p no:cacheprovider --timeout "$left" "$@" || rc=$?
exit $((rc ? rc : sync_rc))
