"""Topology with cfg.cluster.rendezvous (a Slurm job's servers): it starts no process, connects to every
sandbox server and engine listed, has the engines reload the run's weights, and leaves all of them running
when it exits. Real sandbox-server processes (started by the test, as the job steps would); the vLLM servers
are HTTP stand-ins (vllm_stub.py)."""

import json

import psutil
import pytest
from omegaconf import OmegaConf
from sandbox_servers import SandboxServer, missing, token_file
from vllm_stub import VllmStub

from swe_megatron.atomic_write import write_atomic
from swe_megatron.config.load import load_config
from swe_megatron.launch import rendezvous
from swe_megatron.pipeline.topology import Topology
from swe_megatron.rollout.routing import RoutedEngine, SandboxPool
from swe_megatron.sandbox.base import SandboxSpec

pytestmark = [pytest.mark.sandbox, pytest.mark.skipif(missing() is not None, reason=str(missing()))]


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def test_topology_with_rendezvous_starts_no_process(tmp_path):
    servers = [SandboxServer(tmp_path), SandboxServer(tmp_path)]
    engines = [VllmStub([7, 151645]), VllmStub([7, 151645])]
    try:
        job = tmp_path / "job"
        job.mkdir(mode=0o700)
        rv = rendezvous.Rendezvous(
            job_id="42",
            token_file=str(token_file(tmp_path)),
            engines=tuple(e.url for e in engines),
            sandbox_servers=tuple(s.url for s in servers),
        )
        write_atomic(job / rendezvous.MERGED, rv.to_json(), mode=0o600)
        cfg = load_config("embedded", [f"cluster.rendezvous={job / rendezvous.MERGED}"])
        before = _children()
        with Topology(cfg, tmp_path / "topology", tmp_path / "config.yaml") as topo:
            pool = topo.start_sandbox_server()
            engine = topo.start_engines(str(tmp_path / "hf"), 4096)
            assert isinstance(pool, SandboxPool) and isinstance(engine, RoutedEngine)
            assert pool.rotation.names == [s.url for s in servers] and pool.rotation.live == [0, 1]
            assert engine.urls == [e.url for e in engines]
            for e in engines:  # each engine serves the run's current weights
                assert e.paths == ["/collective_rpc", "/reset_prefix_cache"]
            assert _children() == before  # nothing started
            assert topo.sandbox_proc is None and topo.servers == []
            pids = tmp_path / "topology" / "pids.json"
            assert not pids.exists() or json.loads(pids.read_text()) == []
            repo = tmp_path / "repo"  # a sandbox on each server in turn
            repo.mkdir()
            (repo / "f.txt").write_text("hi\n")
            used = []
            for _ in range(2):
                with pool.sandbox(SandboxSpec(repo_dir=str(repo))) as sb:
                    assert sb.exec("cat f.txt").output == b"hi\n"
                    used.append([s.workspaces() != [] for s in servers].index(True))
            assert sorted(used) == [0, 1] and pool.rotation.load == [0, 0]
        for s in servers:  # the job's servers outlive the driver's topology
            assert s.proc.poll() is None
        for e in engines:
            e.paths.clear()
            RoutedEngine.vllm([e.url], "policy", cfg.sampling, [1]).generate([1], 4, "s")
            assert e.paths == ["/v1/completions"]
    finally:
        for e in engines:
            e.close()
        for s in servers:
            s.close()


def test_unreadable_rendezvous_is_one_clear_error(tmp_path):
    cfg = load_config("embedded", [f"cluster.rendezvous={tmp_path / 'missing.json'}"])
    with pytest.raises(rendezvous.RendezvousError, match="cannot read rendezvous file .*written by"):
        Topology(cfg, tmp_path / "topology", tmp_path / "config.yaml").__enter__()


def test_topology_without_rendezvous_starts_its_own_sandbox_server(tmp_path):
    """The server it starts is up once its token-guarded /v1/health answers; leaving the topology stops it."""
    cfg = load_config("embedded", [])
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    with Topology(cfg, tmp_path / "topology", tmp_path / "config.yaml") as topo:
        pool = topo.start_sandbox_server()
        proc = topo.sandbox_proc
        assert proc.poll() is None and pool.rotation.live == [0]
    assert proc.poll() is not None
