#!/usr/bin/env bash
# Prepare a Linux machine for the bwrap sandbox backend (swe_megatron/sandbox/bwrap.py). Run as root.
#
# Idempotent; CI (.ci/run) calls it before the sandbox tests. It:
#   1. installs bubblewrap, util-linux (setpriv, prlimit) and libseccomp2 (the sandbox's seccomp filter,
#      built through the pyseccomp binding) with apt-get when they are missing;
#   2. creates the system user `swe-sandbox` (no login shell, no home) that agent commands run as;
#   3. reserves a range of subordinate uids for that user in /etc/subuid. Each live sandbox runs under
#      its own uid from this range, so RLIMIT_NPROC (counted per uid) caps every sandbox separately:
#      a fork bomb in one sandbox cannot starve another. Without the range all sandboxes share one uid.
#
# Usage: sudo tools/sandbox_setup.sh [USER]        (USER defaults to swe-sandbox = sandbox.user)
set -euo pipefail

user="${1:-swe-sandbox}"
# High and unusual so it cannot meet the 100000 + 65536*k ranges useradd hands to normal users.
subuid_start=2000000000
subuid_count=65536

if [[ $(id -u) -ne 0 ]]; then
  echo "sandbox_setup.sh: must run as root (it installs packages and creates the user $user)" >&2
  exit 1
fi

need=()
command -v bwrap >/dev/null || need+=(bubblewrap)
{ command -v setpriv >/dev/null && command -v prlimit >/dev/null; } || need+=(util-linux)
ldconfig -p | grep -q "libseccomp\.so\.2 " || need+=(libseccomp2)
if ((${#need[@]})); then
  echo "sandbox_setup.sh: installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

if ! id -u "$user" >/dev/null 2>&1; then
  echo "sandbox_setup.sh: creating system user $user"
  useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$user"
fi

touch /etc/subuid
if ! grep -q "^$user:" /etc/subuid; then
  echo "sandbox_setup.sh: reserving uids $subuid_start..$((subuid_start + subuid_count - 1)) for $user"
  echo "$user:$subuid_start:$subuid_count" >>/etc/subuid
fi

echo "sandbox_setup.sh: ok ($(bwrap --version), user $user uid $(id -u "$user"), $(grep "^$user:" /etc/subuid))"
