"""launch/slurm_env.py read from fake environments (plain dicts): Slurm's compressed counts and host lists, each
variable's default, array jobs, the task's own node and the port derived from the job id. The step placement
built on it: tests/launch/test_step_placement.py; a real job: tests/test_slurm.py."""

from __future__ import annotations

import os

import pytest

from swe_megatron.launch.slurm_env import LaunchError, SlurmEnv, expand_counts, expand_nodelist

JOB = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "n[1-3]"}


@pytest.mark.parametrize(
    "counts, expanded",
    [("2(x3),1", [2, 2, 2, 1]), ("8", [8]), ("12(x1),4(x2)", [12, 4, 4]), ("", []), ("10(x10)", [10] * 10)],
)
def test_expand_counts(counts, expanded):
    assert expand_counts(counts) == expanded


@pytest.mark.parametrize(
    "nodelist, hosts",
    [
        ("gpu[008-011]", ["gpu008", "gpu009", "gpu010", "gpu011"]),  # the width of the low end is kept
        ("n[9-10]", ["n9", "n10"]),
        ("rack1-n[1,3]-ib", ["rack1-n1-ib", "rack1-n3-ib"]),
        ("a[1],b", ["a1", "b"]),
        ("x[5-5]", ["x5"]),
        ("login1,gpu[1-2]", ["login1", "gpu1", "gpu2"]),  # a plain host first
    ],
)
def test_expand_nodelist_edges(nodelist, hosts):
    assert expand_nodelist(nodelist) == hosts


def test_every_default_outside_a_step(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    env = SlurmEnv.from_environ(JOB)
    assert env == SlurmEnv(
        job_id="77",
        hostnames=("n1", "n2", "n3"),
        node_id=0,
        node_name="",
        rank=0,
        world_size=1,
        local_rank=0,
        local_world_size=1,
        step_hostnames=("n1", "n2", "n3"),
        restart_count=0,
        submit_dir=str(tmp_path),
        partition="",
        cpus_on_node=1,
        job_cpus_per_node=(),
    )


def test_every_variable_is_read():
    env = SlurmEnv.from_environ(
        {
            **JOB,
            "SLURM_STEP_NODELIST": "n[2-3]",
            "SLURM_NODEID": "1",
            "SLURMD_NODENAME": "n3",
            "SLURM_PROCID": "5",
            "SLURM_NTASKS": "6",
            "SLURM_LOCALID": "2",
            "SLURM_STEP_TASKS_PER_NODE": "2,4",
            "SLURM_TASKS_PER_NODE": "3(x3)",  # the job's: the step's win
            "SLURM_RESTART_COUNT": "2",
            "SLURM_SUBMIT_DIR": "/home/u/run",
            "SLURM_JOB_PARTITION": "gpu",
            "SLURM_CPUS_ON_NODE": "32",
            "SLURM_JOB_CPUS_PER_NODE": "32(x2),16",
        }
    )
    assert (env.node_id, env.node_name, env.rank, env.world_size, env.local_rank) == (1, "n3", 5, 6, 2)
    assert env.local_world_size == 4 and env.step_hostnames == ("n2", "n3")
    assert (env.restart_count, env.submit_dir, env.partition, env.cpus_on_node) == (
        2,
        "/home/u/run",
        "gpu",
        32,
    )
    assert env.job_cpus_per_node == (32, 32, 16)


def test_the_job_s_tasks_per_node_without_a_step_and_a_node_past_them():
    assert (
        SlurmEnv.from_environ({**JOB, "SLURM_TASKS_PER_NODE": "3,5", "SLURM_NODEID": "1"}).local_world_size
        == 5
    )
    # A node index past the counts (a malformed environment): one task.
    assert (
        SlurmEnv.from_environ({**JOB, "SLURM_TASKS_PER_NODE": "3,5", "SLURM_NODEID": "2"}).local_world_size
        == 1
    )


def test_an_array_task_is_named_job_underscore_task():
    env = {**JOB, "SLURM_ARRAY_JOB_ID": "70", "SLURM_ARRAY_TASK_ID": "3"}
    assert SlurmEnv.from_environ(env).job_id == "70_3"
    assert SlurmEnv.from_environ({**JOB, "SLURM_ARRAY_JOB_ID": "70"}).job_id == "77"
    assert SlurmEnv.from_environ({**JOB, "SLURM_ARRAY_TASK_ID": "3"}).job_id == "77"


@pytest.mark.parametrize("missing", ["SLURM_JOB_ID", "SLURM_JOB_NODELIST"])
def test_either_job_variable_missing_is_outside_a_job(missing):
    env = {k: v for k, v in JOB.items() if k != missing}
    with pytest.raises(LaunchError) as e:
        SlurmEnv.from_environ(env)
    assert str(e.value) == (
        "not inside a Slurm job (SLURM_JOB_ID / SLURM_JOB_NODELIST unset): submit with "
        "`sbatch slurm/stage2.sbatch` or `swe-megatron launch CONFIG --cluster slurm`"
    )
    assert SlurmEnv.detect({**JOB, missing: ""}) is None


def test_the_process_environment_is_read_by_default(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "91")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "solo")
    assert SlurmEnv.from_environ().job_id == "91" and SlurmEnv.detect().hostnames == ("solo",)


def test_hostname_falls_back_to_the_step_list_then_this_machine():
    assert SlurmEnv.from_environ({**JOB, "SLURM_NODEID": "2"}).hostname == "n3"
    assert SlurmEnv.from_environ({**JOB, "SLURM_NODEID": "3"}).hostname == os.uname().nodename


def test_master_port_from_the_job_id_digits():
    port = lambda job_id, **kw: SlurmEnv.from_environ({**JOB, "SLURM_JOB_ID": job_id}).master_port(**kw)  # noqa: E731
    assert port("77") == 20077 and port("20001") == 20001 and port("40003") == 20003
    assert port("70_3") == 20703 and port("abc") == 20000
    assert port("77", base=30000) == 30077


def test_torch_env_uses_the_derived_port_when_none_is_given():
    env = SlurmEnv.from_environ({**JOB, "SLURM_STEP_NODELIST": "n2"})
    assert env.torch_env()["MASTER_PORT"] == "20077" and env.torch_env()["MASTER_ADDR"] == "n2"


def test_detect_reads_the_environment_it_is_given(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert SlurmEnv.detect(JOB).job_id == "77"
