# shellcheck shell=bash
# Shared body of slurm/{rft,stage1,stage2,eval}.sbatch (sourced), and of `swe-megatron launch` jobs
# (run as `bash slurm/common.sh CONFIG [key=value ...]`: the config's whole schedule).
#
# Inside one allocation it starts, as srun job steps (design.md, "Process topology on a cluster"):
#   1. one sandbox server per node        `swe-megatron job-step sandbox-server`  (CPU only)
#   2. the vLLM servers on the engine nodes `swe-megatron job-step engine`        (when cluster.engine_nodes > 0)
#   3. waits until all of them published their URL: JOB_DIR/rendezvous.json (mode 0600, token in
#      JOB_DIR/sandbox.token; JOB_DIR = RUN_DIR/jobs/SLURM_JOB_ID, mode 0700)
#   4. the trainer ranks on the trainer nodes: `swe-megatron run CONFIG schedule=[STAGE] cluster.rendezvous=...`
#      (rank 0 drives the iteration); the job's exit status is the trainer's. With the rendezvous the run
#      starts no server of its own (vLLM only when cluster.engine_nodes=0); it spreads episodes over every
#      listed server and drops a dead one from rotation, retrying its episodes elsewhere; with none of a
#      kind left the iteration fails (rollout/routing.py). Server steps run with --kill-on-bad-exit=0, so one
#      dead server does not end the job.
# On USR2 (sbatch --signal=B:USR2@cluster.signal_delay_s before the time limit, or `scancel --signal=USR2`)
# the run stops after the iteration in flight (or is stopped by SIGTERM after the grace time), and the job
# requeues itself (`scontrol requeue`); the requeued job resumes from the last complete iteration. A trainer that
# has not stopped 30 s before the time limit (a rank blocked in a collective) is requeued then (_sm_arm_requeue).
#
# Environment (all optional except where the site needs them):
#   SWE_MEGATRON_REPO     checkout of this repository on the shared filesystem (default: the folder sbatch
#                         was called from, which must hold slurm/common.sh)
#   SWE_MEGATRON_CONFIG   run preset or YAML (default paper-72b); a first argument without '=' overrides it
#   SWE_MEGATRON_RUN_DIR  run directory on the shared filesystem (default: the config's run_dir, relative
#                         to SWE_MEGATRON_REPO)
#   SWE_MEGATRON_IMAGE    trainer Apptainer image (containers/trainer.def) for every step but the sandbox servers,
#                         which run on the host with SWE_MEGATRON_PYTHON (they start the host's apptainer);
#                         empty: every step runs from SWE_MEGATRON_PYTHON
#   SWE_MEGATRON_BINDS    extra comma-separated bind paths for the image (shared filesystems, data, SIF folder)
#   HF_HUB_CACHE, HF_HOME the Hugging Face cache holding model.hf_path when it is a hub id (filled beforehand:
#                         nodes are offline); bound into the image
#   SWE_MEGATRON_PYTHON   Python with this package installed (default REPO/.venv/bin/python, else python3); with
#                         SWE_MEGATRON_IMAGE only the sandbox servers use it (no GPU extra needed)
#   SWE_MEGATRON_REQUEUE  1 (default): requeue this job after a USR2 stop; 0: leave it to the caller (submitit)
#   SBATCH_PARTITION, SBATCH_ACCOUNT, SBATCH_QOS   sbatch's own variables (or -p/-A/-q on the command line)
#
# Interconnect (site settings, passed into every step's image with --env; unset: the library's own choice, which
# is what single-network clusters and the CPU test cluster need). Check them first: tools/check_interconnect.py.
#   NCCL_SOCKET_IFNAME    NCCL's bootstrap and socket interface, NCCL's syntax: ib0 | ^lo,docker | =eth0
#                         (unset: NCCL prefers ib* interfaces, never lo or docker*)
#   GLOO_SOCKET_IFNAME    interface the gloo groups bind (exact names, comma-separated); unset: the address the
#                         node's hostname resolves to
#   NCCL_IB_HCA           InfiniBand HCAs NCCL uses: mlx5_0,mlx5_1 or ^mlx5_4 (e.g. to skip a storage NIC);
#                         unset: every active one. The image carries the IB user space (containers/trainer.def).
#   NCCL_DEBUG            INFO logs the transport NCCL picked ("via NET/IB/0"; "via NET/Socket/0" is TCP)
#   PYTORCH_ALLOC_CONF    trainer ranks' CUDA allocator (default expandable_segments:True: launch/steps.py)
# Not a site setting: TORCH_NCCL_ASYNC_ERROR_HANDLING is 2 (CleanUpOnly) in every swe-megatron process and vLLM
# server (set at their start, before any thread: swe_megatron/engine/sync_env.py), so a peer's death in a weight
# sync fails the sync instead of ending the survivors; a value passed in here is overridden.

_sm_die() {
  echo "swe-megatron job: ERROR: $*" >&2
  exit 2
}
_sm_log() { echo "swe-megatron job: $(date +%H:%M:%S) $*"; }

_sm_setup() {
  [[ -n ${SLURM_JOB_ID:-} ]] || _sm_die "not inside a Slurm job: submit with sbatch slurm/stage2.sbatch"
  REPO=${SWE_MEGATRON_REPO:-${SLURM_SUBMIT_DIR:-$PWD}}
  [[ -f $REPO/slurm/common.sh ]] \
    || _sm_die "SWE_MEGATRON_REPO=$REPO is not a swe_megatron checkout (no slurm/common.sh); submit from the repository root or set SWE_MEGATRON_REPO"
  cd "$REPO" || _sm_die "cannot cd to $REPO"
  _sm_interconnect
  if [[ -n ${SWE_MEGATRON_IMAGE:-} ]]; then
    [[ -f $SWE_MEGATRON_IMAGE ]] || _sm_die "SWE_MEGATRON_IMAGE=$SWE_MEGATRON_IMAGE does not exist; build it with containers/trainer.def (see containers/README.md)"
    command -v apptainer >/dev/null || _sm_die "SWE_MEGATRON_IMAGE is set but apptainer is not on PATH (module load apptainer?)"
    local binds=$REPO${SWE_MEGATRON_BINDS:+,$SWE_MEGATRON_BINDS} d
    # The Hugging Face cache that a hub id in model.hf_path resolves in (offline; swe_megatron/model/hub.py).
    for d in ${HF_HUB_CACHE:-} ${HF_HOME:-}; do [[ -d $d ]] && binds+=,$d; done
    SM=(apptainer exec --nv --bind "$binds" --pwd "$REPO" --env "PYTHONPATH=$REPO" "${SM_ENV[@]}" "$SWE_MEGATRON_IMAGE" python -m swe_megatron.cli)
    # The sandbox servers run on the host, not in the image: they start the host's apptainer (as the site
    # installed and configured it) for every task SIF; nested in the image it would need unprivileged user
    # namespaces and FUSE on every node. They need no GPU stack: a small venv (pip install -e .) is enough.
    _sm_host_python "the sandbox servers run on the host (SWE_MEGATRON_IMAGE is for the trainer and engines): create REPO/.venv (python3 -m venv .venv && .venv/bin/pip install -e .) or set SWE_MEGATRON_PYTHON"
  else
    _sm_host_python "set SWE_MEGATRON_IMAGE (Apptainer) or SWE_MEGATRON_PYTHON, or run tools/install_cpu.sh"
    SM=("${SM_HOST[@]}")
  fi
}

SM_NET_VARS=(NCCL_SOCKET_IFNAME GLOO_SOCKET_IFNAME NCCL_IB_HCA NCCL_DEBUG PYTORCH_ALLOC_CONF)

# SM_ENV: --env VAR=VALUE for each of SM_NET_VARS the site set (the image's steps see exactly these, even where
# apptainer runs with a clean environment); unset ones are left to the libraries' defaults.
_sm_interconnect() {
  local v shown=""
  SM_ENV=()
  for v in "${SM_NET_VARS[@]}"; do
    [[ -n ${!v:-} ]] || continue
    SM_ENV+=(--env "$v=${!v}")
    shown+=" $v=${!v}"
  done
  _sm_log "interconnect:${shown:- library defaults (set NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME, NCCL_IB_HCA: slurm/common.sh)}"
}

# SM_HOST: this package's CLI from a Python on the host (SWE_MEGATRON_PYTHON, else REPO/.venv, else python3)
_sm_host_python() {
  local py=${SWE_MEGATRON_PYTHON:-}
  [[ -z $py && -x $REPO/.venv/bin/python ]] && py=$REPO/.venv/bin/python
  py=${py:-python3}
  "$py" -c 'import swe_megatron' 2>/dev/null || _sm_die "$py cannot import swe_megatron: $1"
  SM_HOST=("$py" -m swe_megatron.cli)
}

_sm_on_usr2() {
  _sm_log "USR2: stopping after the iteration in flight, then requeueing"
  STOP_REQUESTED=1
  [[ -n ${TRAINER_PID:-} ]] && kill -USR2 "$TRAINER_PID" 2>/dev/null
  _sm_arm_requeue
  return 0
}

SM_REQUEUE_MARGIN_S=30 # the backstop requeue comes this long before the job's time limit

# The backstop of a USR2 stop. A trainer rank blocked in a C++ call (an NCCL sync, a gloo receive with a day-long
# timeout) runs its Python signal handlers only when that call returns: if it still runs at the time limit, Slurm
# ends the job TIMEOUT and `scontrol requeue` after the trainer's exit never runs (the chain of stages stops). So
# the trap arms a timer that requeues the job itself SM_REQUEUE_MARGIN_S before the limit while the trainer still
# runs: Slurm ends its steps and queues it again, and it resumes from the last committed unit. The trainer's own
# exit disarms it (_sm_wait_trainer). No limit (or SWE_MEGATRON_REQUEUE=0): nothing to arm.
_sm_arm_requeue() {
  [[ ${SWE_MEGATRON_REQUEUE:-1} == 1 && -z ${REQUEUE_TIMER_PID:-} ]] || return 0
  local end=${SLURM_JOB_END_TIME:-} left
  if [[ -z $end ]]; then # Slurm < 23.02 does not export it
    end=$(squeue -h -j "$SLURM_JOB_ID" -o %e 2>/dev/null | head -n1)
    end=$(date -d "$end" +%s 2>/dev/null) || return 0 # Unknown / NONE: no time limit
  fi
  left=$((end - $(date +%s) - SM_REQUEUE_MARGIN_S))
  ((left < 0)) && left=0
  (
    sleep "$left"
    _sm_log "the trainer is still running ${SM_REQUEUE_MARGIN_S}s before the time limit (blocked in a collective?): requeueing job $SLURM_JOB_ID now; it resumes from the last committed unit"
    scontrol requeue "$SLURM_JOB_ID"
  ) &
  REQUEUE_TIMER_PID=$!
}

# Wait for the trainer step (TRAINER_PID), stop the servers, and requeue the job when the trainer stopped before the
# end of the schedule (EXIT_RESUMABLE); else exit with the trainer's status.
_sm_wait_trainer() {
  local rc
  while :; do
    wait "$TRAINER_PID"
    rc=$?
    kill -0 "$TRAINER_PID" 2>/dev/null || break # else: wait was interrupted by USR2
  done
  TRAINER_PID=""
  if [[ -n ${REQUEUE_TIMER_PID:-} ]]; then
    kill "$REQUEUE_TIMER_PID" 2>/dev/null
    REQUEUE_TIMER_PID=""
  fi
  _sm_cleanup
  if ((rc == 75)); then # EXIT_RESUMABLE: stopped before the end of the schedule
    if [[ ${SWE_MEGATRON_REQUEUE:-1} == 1 ]]; then
      _sm_log "requeueing job $SLURM_JOB_ID (restart count ${SLURM_RESTART_COUNT:-0}); it resumes from $RUN_DIR"
      scontrol requeue "$SLURM_JOB_ID" || _sm_die "scontrol requeue $SLURM_JOB_ID failed (is the job requeueable? sbatch --requeue)"
      exit 0
    fi
    _sm_log "stopped before the end of the schedule; the caller requeues"
    exit 75
  fi
  _sm_log "trainer finished with status $rc; TensorBoard: tensorboard --logdir $RUN_DIR/tensorboard"
  exit "$rc"
}

_sm_cleanup() {
  local pid
  for pid in ${SERVER_PIDS:-}; do kill -TERM "$pid" 2>/dev/null; done
  for pid in ${SERVER_PIDS:-}; do wait "$pid" 2>/dev/null; done
  SERVER_PIDS=""
}

# swe_megatron_job STAGE [CONFIG] [key=value ...]   (STAGE "" runs the config's whole schedule)
swe_megatron_job() {
  local stage=$1
  shift
  local config=${SWE_MEGATRON_CONFIG:-paper-72b}
  if [[ $# -gt 0 && $1 != *=* ]]; then
    config=$1
    shift
  fi
  local overrides=("$@")
  [[ -n $stage ]] && overrides+=("schedule=[$stage]")
  [[ -n ${SWE_MEGATRON_RUN_DIR:-} ]] && overrides+=("run_dir=$SWE_MEGATRON_RUN_DIR")
  _sm_setup
  STOP_REQUESTED=0 TRAINER_PID="" SERVER_PIDS="" REQUEUE_TIMER_PID=""
  trap _sm_on_usr2 USR2
  trap _sm_cleanup EXIT

  local layout
  layout=$("${SM[@]}" job-step init "$config" "${overrides[@]}") || _sm_die "job-step init failed (message above)"
  eval "$layout"
  _sm_log "job $SLURM_JOB_ID: ${stage:-schedule of $config} on $N_NODES node(s); trainer $TRAINER_NODES ($TRAINER_TASKS rank(s)), engines ${ENGINE_NODES:-started by the run}; run dir $RUN_DIR"

  local logs=$JOB_DIR/logs
  # Each step's placement (nodes, tasks, --cpus-per-task, GPUs, --overlap) comes from the layout: *_SRUN
  srun "${SANDBOX_SRUN[@]}" --kill-on-bad-exit=0 --output="$logs/sandbox-step-%t.out" \
    "${SM_HOST[@]}" job-step --job-dir "$JOB_DIR" sandbox-server "$config" "${overrides[@]}" &
  SERVER_PIDS+=" $!"
  if ((N_ENGINES > 0)); then
    srun "${ENGINE_SRUN[@]}" --kill-on-bad-exit=0 --output="$logs/engine-step-%t.out" \
      "${SM[@]}" job-step --job-dir "$JOB_DIR" --stage "$stage" engine "$config" "${overrides[@]}" &
    SERVER_PIDS+=" $!"
  fi
  # shellcheck disable=SC2086
  "${SM[@]}" job-step wait --job-dir "$JOB_DIR" --engines "$N_ENGINES" --sandboxes "$N_NODES" \
    --timeout "$STARTUP_TIMEOUT_S" --watch $SERVER_PIDS || _sm_die "servers did not come up (see $logs)"

  srun "${TRAINER_SRUN[@]}" --kill-on-bad-exit=1 \
    "${SM[@]}" job-step --run-dir "$RUN_DIR" --grace "$((SIGNAL_DELAY_S > 60 ? SIGNAL_DELAY_S - 60 : 0))" \
    trainer "$config" "${overrides[@]}" "cluster.rendezvous=$JOB_DIR/rendezvous.json" &
  TRAINER_PID=$!
  _sm_wait_trainer
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then # executed, not sourced: the config's whole schedule
  swe_megatron_job "" "$@"
fi
