"""Cluster launch: Slurm roles, the rendezvous of a job's servers, submitit with requeue, task-image SIFs.

slurm_env.py   SlurmEnv: the only reader of SLURM_* variables
layout.py      which node runs the trainer, the vLLM servers, the sandbox servers
rendezvous.py  JOB_DIR/rendezvous.json: server URLs + the per-job token file (atomic, private)
steps.py       `swe-megatron job-step ROLE`: the srun steps of slurm/common.sh
submit.py      `swe-megatron launch`: a submitit Checkpointable that requeues on USR2
sifs.py        `swe-megatron build-sifs`: task environment SIFs with a manifest
"""
