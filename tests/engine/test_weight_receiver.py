"""engine/weight_receiver.py's parts alone, without a group: the wait loop (`SyncGroup._poll`) on a fake clock, the
abort key, the group a CUDA member makes (NCCL faked: this host has none), and the unpacking of buckets from a
scripted sender. The whole protocol over real gloo groups: tests/engine/test_weight_sync_protocol.py.
"""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from swe_megatron.engine import weight_receiver
from swe_megatron.engine.sync_env import SyncEnvError
from swe_megatron.engine.weight_receiver import (
    POLL_S,
    SyncAborted,
    SyncGroup,
    WeightReceiver,
    receive_buckets,
    unpack,
)

CPU = torch.device("cpu")


class Clock:
    """time.monotonic and time.sleep of weight_receiver: sleeping advances the clock, nothing waits."""

    def __init__(self):
        self.t, self.sleeps = 1000.0, []

    def monotonic(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.t += s


@pytest.fixture
def clock(monkeypatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(weight_receiver, "time", c)
    return c


def _group(timeout_s=0.05, check=lambda: None, rank=0, store=None) -> SyncGroup:
    return SyncGroup(store or dist.HashStore(), "sync-1", rank, 3, CPU, timeout_s, check)


def test_poll_backs_off_to_poll_s_and_gives_up_after_the_timeout(clock):
    checks = []
    g = _group(0.05, lambda: checks.append(clock.t))
    with pytest.raises(SyncAborted, match=r"^weight sync: joining took longer than 0.05 s$"):
        g._poll(lambda: False, "joining")
    # Sleeps double from 0.1 ms up to POLL_S.
    assert clock.sleeps[:7] == pytest.approx([1e-4, 2e-4, 4e-4, 8e-4, 1.6e-3, 3.2e-3, POLL_S])
    assert max(clock.sleeps) == POLL_S and clock.sleeps[-1] == POLL_S
    # `check` (and the store) at once, then about every POLL_S, never more often.
    assert checks[0] == 1000.0
    gaps = [b - a for a, b in zip(checks, checks[1:])]
    assert all(POLL_S - 1e-9 <= gap < 2 * POLL_S for gap in gaps), gaps
    # It gives up at the first check past the deadline: not before, not much after.
    assert 0.05 < clock.t - 1000.0 <= 0.05 + 2 * POLL_S
    assert checks[-1] - 1000.0 > 0.05 and checks[-2] - 1000.0 <= 0.05


def test_poll_returns_as_soon_as_done_without_sleeping_or_checking(clock):
    calls = iter([False, False, True])
    checks = []
    _group(check=lambda: checks.append(1))._poll(lambda: next(calls), "a broadcast")
    assert clock.sleeps == [1e-4, 2e-4] and checks == [1]


def test_poll_stops_at_the_abort_key_with_the_first_failed_member_s_reason(clock):
    store = dist.HashStore()
    _group(store=store, rank=2).abort("reload failed")
    _group(store=store, rank=1).abort("a later reason")  # the first reason is kept
    g = _group(10.0, store=store)
    assert g.aborted() == "rank 2: reload failed"
    with pytest.raises(SyncAborted, match=r"^weight sync aborted during a broadcast: rank 2: reload failed$"):
        g._poll(lambda: False, "a broadcast")
    assert clock.t == 1000.0  # at the first look, no wait


def test_poll_raises_what_check_raises(clock):
    def check():
        if clock.t > 1000.02:
            raise SyncAborted("http://engine-0 left the sync")

    with pytest.raises(SyncAborted, match="engine-0 left"):
        _group(10.0, check)._poll(lambda: False, "joining")
    assert clock.t < 1000.02 + 2 * POLL_S


def test_no_abort_key_means_no_reason():
    assert _group().aborted() is None


class FakeGroup:
    def __init__(self):
        self.calls = []

    def abort(self):
        self.calls.append("abort")

    def shutdown(self):
        self.calls.append("shutdown")


def test_abort_aborts_the_group_and_keeps_it_and_close_shuts_it_down(monkeypatch):
    kept = []
    monkeypatch.setattr(weight_receiver, "_ABORTED", kept)
    g = _group()
    g.group = FakeGroup()
    g.abort("x")
    assert g.group.calls == ["abort"] and kept == [g.group]
    g2 = _group()
    g2.group = FakeGroup()
    g2.close()
    assert g2.group.calls == ["shutdown"]
    _group().close()  # never joined: nothing to leave
    _group().abort("before joining")
    assert kept == [g.group]


def test_abort_with_the_store_gone_still_aborts_the_group(monkeypatch):
    monkeypatch.setattr(weight_receiver, "_ABORTED", [])

    class GoneStore:
        def compare_set(self, *a):
            raise RuntimeError("Connection reset by peer")

    g = SyncGroup(GoneStore(), "p", 1, 2, CPU, 1.0)
    g.group = FakeGroup()
    g.abort("x")
    assert g.group.calls == ["abort"]


def test_join_forms_the_group_by_the_deadline_gives_its_operations_twice_it_and_runs_its_first_collective(
    monkeypatch,
):
    made = []
    group = RecordingGroup()
    monkeypatch.setattr(weight_receiver, "new_group", lambda *a: made.append(a) or group)
    store = dist.HashStore()
    g = SyncGroup(store, "sync-7", 2, 5, CPU, 30.0)
    g.join()
    assert g.group is group and made == [(store, "sync-7", 2, 5, CPU, timedelta(seconds=30))]
    assert group.timeouts == [timedelta(seconds=60)]
    # NCCL creates its communicator there: inside join, which waits for it like any broadcast.
    assert [(t.tolist(), root) for t, root in group.sent] == [([0.0], 0)]


def test_the_rendezvous_uses_a_store_connection_of_its_own():
    """A TCPStore client sends one request at a time: a rendezvous waiting in the polling thread's own client held
    its abort checks until the group's timeout (issue 41: 126 s for a 60 s deadline)."""
    from datetime import timedelta as td

    master = dist.TCPStore("127.0.0.1", 0, None, True, td(seconds=5), wait_for_workers=False)
    other = weight_receiver.own_connection(master, 5.0)
    assert isinstance(other, dist.TCPStore) and other is not master and other.port == master.port
    other.set("k", "v")
    assert master.get("k") == b"v"
    hash_store = dist.HashStore()
    assert weight_receiver.own_connection(hash_store, 5.0) is hash_store


def test_join_gives_up_at_the_deadline_while_the_group_forms_and_aborts_it_once_formed(monkeypatch):
    """A rendezvous that waits for a member that never comes: join raises at the deadline (not the group's own
    timeout), and the group, once the constructor returns, is aborted (nobody else holds it)."""
    import threading

    release, aborted = threading.Event(), threading.Event()

    class Late(RecordingGroup):
        def abort(self):
            aborted.set()

    def slow_group(*a):
        release.wait(10)
        return Late()

    monkeypatch.setattr(weight_receiver, "new_group", slow_group)
    monkeypatch.setattr(weight_receiver, "_ABORTED", [])
    g = SyncGroup(dist.HashStore(), "s", 1, 3, CPU, 0.3)
    with pytest.raises(SyncAborted, match=r"^weight sync: joining the group took longer than 0.3 s$"):
        g.join()
    assert g.group is None
    release.set()
    assert aborted.wait(5) and len(weight_receiver._ABORTED) == 1


def _fake_nccl(monkeypatch, made: dict):
    """dist.ProcessGroupNCCL replaced (no NCCL on this host): records its arguments and the environment it reads."""

    class Config:
        blocking = 1  # NCCL's default

    class Options:
        _timeout = None

        def __init__(self):
            self.config = Config()

    class FakeNCCL:
        def __init__(self, store, rank, world, opts):
            made.update(store=store, rank=rank, world=world, timeout=opts._timeout, blocking=opts.config.blocking,
                        handling=os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING"))  # fmt: skip

    FakeNCCL.Options = Options
    monkeypatch.setattr(weight_receiver.dist, "ProcessGroupNCCL", FakeNCCL, raising=False)
    return FakeNCCL


def test_a_cuda_member_makes_an_nccl_group_with_the_timeout_under_the_prefix(monkeypatch):
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")  # as swe-megatron's processes start (SYNC_ENV)
    made = {}
    fake = _fake_nccl(monkeypatch, made)
    changes = []  # os.environ writes reach the C environment through these: none may happen while threads run
    monkeypatch.setattr(os, "putenv", lambda *a: changes.append(a))
    monkeypatch.setattr(os, "unsetenv", lambda *a: changes.append(a))
    store = dist.HashStore()
    group = weight_receiver.new_group(store, "sync-3", 2, 5, torch.device("cuda", 0), timedelta(seconds=7))
    assert isinstance(group, fake)
    assert (made["rank"], made["world"], made["timeout"]) == (2, 5, timedelta(seconds=7))
    made["store"].set("k", "v")
    assert store.get("sync-3/k") == b"v"
    # Issue 41: a nonblocking communicator (its creation can be aborted and has a deadline), and CleanUpOnly (2)
    # read by the constructor: a dead peer aborts the group instead of ending this process (torch's default, 3).
    assert made["blocking"] == 0 and made["handling"] == "2"
    # ... taken from the environment the process started with: setting it around the constructor raced other
    # threads' getenv (glibc), so nothing is written.
    assert changes == []


@pytest.mark.parametrize("value", [None, "3"])
def test_a_cuda_member_started_without_cleanup_only_refuses_to_make_an_nccl_group(monkeypatch, value):
    if value is None:
        monkeypatch.delenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", raising=False)
    else:
        monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", value)
    made = {}
    _fake_nccl(monkeypatch, made)
    with pytest.raises(SyncEnvError, match=r"start it with TORCH_NCCL_ASYNC_ERROR_HANDLING=2 "):
        weight_receiver.new_group(dist.HashStore(), "s", 1, 2, torch.device("cuda", 0), timedelta(seconds=7))
    assert made == {}


def test_unpack_gives_views_in_the_header_s_order_and_shapes():
    flat = torch.arange(10.0)
    parts = unpack(flat, [["a", "float32", [2, 3]], ["b", "float32", [4]]])
    assert [(n, t.shape) for n, t in parts] == [("a", (2, 3)), ("b", (4,))]
    assert parts[1][1].tolist() == [6.0, 7.0, 8.0, 9.0]
    parts[0][1][0, 0] = 99.0  # views: vLLM's loader reads the received buffer itself
    assert flat[0] == 99.0


class ScriptedSender:
    """A member's view of rank 0 sending these buckets: headers and flat buffers as rank 0 would send them."""

    device = CPU

    def __init__(self, buckets: list[list[tuple[str, torch.Tensor]]]):
        self.headers = [
            json.dumps([(n, str(t.dtype).split(".")[-1], list(t.shape)) for n, t in b]) for b in buckets
        ]
        self.headers.append("")
        self.flats = [torch.cat([t.reshape(-1) for _, t in b]) for b in buckets]

    def receive_header(self) -> str:
        return self.headers.pop(0)

    def broadcast(self, tensor: torch.Tensor) -> None:
        src = self.flats.pop(0)
        assert tensor.dtype == src.dtype and tensor.shape == src.shape
        tensor.copy_(src)


def test_receive_buckets_yields_every_tensor_and_counts_bytes_until_the_end_header():
    a, b, c = torch.randn(2, 3), torch.randn(4), torch.ones(3, dtype=torch.bfloat16)
    counts = {"bytes": 0, "ended": False}
    got = list(receive_buckets(ScriptedSender([[("a", a), ("b", b)], [("c", c)]]), counts))
    assert [n for n, _ in got] == ["a", "b", "c"]
    assert all(torch.equal(t, want) for (_, t), want in zip(got, (a, b, c)))
    assert got[2][1].dtype == torch.bfloat16
    assert counts == {"bytes": 10 * 4 + 3 * 2, "ended": True}


def test_a_reader_that_stops_early_never_sees_the_end():
    counts = {"bytes": 0, "ended": False}
    it = receive_buckets(ScriptedSender([[("a", torch.ones(2))], [("b", torch.ones(2))]]), counts)
    next(it)
    assert counts == {"bytes": 8, "ended": False}


def test_a_bucket_mixing_dtypes_is_refused():
    class Mixed(ScriptedSender):
        def receive_header(self):
            return json.dumps([["a", "float32", [2]], ["b", "bfloat16", [2]]])

    with pytest.raises(RuntimeError, match=r"a bucket mixes dtypes \['bfloat16', 'float32'\]"):
        list(receive_buckets(Mixed([]), {"bytes": 0, "ended": False}))


def test_a_worker_announces_itself_then_waits_for_the_go(clock):
    store = dist.HashStore()
    g = SyncGroup(store, "s", 2, 3, CPU, 0.05)
    with pytest.raises(SyncAborted, match=r"^weight sync: joining took longer than 0.05 s$"):
        g.announce()
    assert store.check(["s/joined/2"])
    store.set("s/go", "1")
    g.announce()  # the go is there: at once


def test_the_trainer_waits_for_every_worker_then_gives_the_go(clock):
    store = dist.HashStore()
    g = SyncGroup(store, "s", 0, 3, CPU, 0.05)
    store.set("s/joined/2", "1")
    with pytest.raises(SyncAborted, match=r"^weight sync: joining took longer than 0.05 s$"):
        g.await_members()  # worker 1 never announced
    assert not store.check(["s/go"])
    store.set("s/joined/1", "1")
    g.await_members()
    assert store.check(["s/go"])


@pytest.mark.parametrize("missing", [1, 2, 3])
def test_no_go_while_any_worker_has_not_announced_itself(clock, missing):
    """Every rank 1..world-1 counts, the first and the last too: a go before one of them would let the others
    enter a rendezvous that one may never reach."""
    store = dist.HashStore()
    g = SyncGroup(store, "s", 0, 4, CPU, 0.05)
    for r in {1, 2, 3} - {missing}:
        store.set(f"s/joined/{r}", "1")
    with pytest.raises(SyncAborted, match="joining took longer"):
        g.await_members()
    assert not store.check(["s/go"])


class Done:
    def is_completed(self) -> bool:
        return True

    def wait(self) -> None:
        pass


class RecordingGroup:
    """A process group whose broadcasts complete at once: what rank 0 sends, or what a member is sent."""

    def __init__(self, incoming=()):
        self.sent, self.incoming, self.timeouts = [], list(incoming), []

    def _set_default_timeout(self, timeout):
        self.timeouts.append(timeout)

    def broadcast(self, tensors, opts):
        self.sent.append((tensors[0], opts.rootRank))
        if self.incoming:
            tensors[0].copy_(self.incoming.pop(0))
        return Done()


def test_a_header_is_its_utf8_length_then_its_bytes_from_rank_0():
    g = _group()
    g.group = RecordingGroup()
    g.send_header("hé")
    (n, root_n), (data, root_d) = g.group.sent
    assert (root_n, root_d) == (0, 0)
    assert n.dtype == torch.int64 and n.tolist() == [3]
    assert data.dtype == torch.uint8 and bytes(data.tolist()) == "hé".encode()
    g.group = RecordingGroup()
    g.send_header("")  # the end: a length of 0 and no bytes
    assert [t.tolist() for t, _ in g.group.sent] == [[0]]


def test_a_member_reads_the_length_then_the_bytes():
    g = _group(rank=1)
    g.group = RecordingGroup([torch.tensor([3]), torch.tensor(list("hé".encode()), dtype=torch.uint8)])
    assert g.receive_header() == "hé"
    assert [t.dtype for t, _ in g.group.sent] == [torch.int64, torch.uint8]
    g.group = RecordingGroup([torch.tensor([0])])
    assert g.receive_header() == "" and len(g.group.sent) == 1


def test_headers_are_made_on_the_group_s_device():
    # "meta" stands for the worker's GPU: NCCL broadcasts only tensors on it.
    g = SyncGroup(dist.HashStore(), "s", 0, 2, torch.device("meta"), 1.0)
    g.group = RecordingGroup()
    g.send_header("abc")
    assert [t.device.type for t, _ in g.group.sent] == ["meta", "meta"]
    g.group = RecordingGroup()
    with pytest.raises(Exception):  # noqa: B017 - a meta length cannot be read back; its device is the point
        g.receive_header()
    assert g.group.sent[0][0].device.type == "meta"


def test_a_worker_joins_on_its_cuda_device_with_the_default_timeout(monkeypatch):
    made = {}

    class FakeStore:  # the trainer's TCPStore, at the network boundary
        def __init__(self, host, port, world, is_master, timeout):
            made["store"] = (host, port, world, is_master, timeout)

    class StopAtAnnounce(SyncGroup):
        def __init__(self, store, prefix, rank, world, device, timeout_s, check=lambda: None):
            made["group"] = (prefix, rank, world, device, timeout_s)
            super().__init__(store, prefix, rank, world, device, timeout_s, check)

        def announce(self):
            raise RuntimeError("stop here")

        def abort(self, why):
            made["abort"] = why

    monkeypatch.setattr(weight_receiver.dist, "TCPStore", FakeStore)
    monkeypatch.setattr(weight_receiver, "SyncGroup", StopAtAnnounce)
    monkeypatch.setattr(weight_receiver.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(weight_receiver.torch.cuda, "current_device", lambda: 3)
    worker = WeightReceiver()
    worker.rank = 1  # vLLM's worker rank within its server
    with pytest.raises(RuntimeError, match="stop here"):
        worker.swe_sync_weights("10.0.0.1", "29600", "sync-4-ab", "5", "9")
    assert made["store"] == ("10.0.0.1", 29600, None, False, timedelta(seconds=600))
    assert made["group"] == ("sync-4-ab", 6, 9, torch.device("cuda", 3), 600.0)
    assert made["abort"] == "RuntimeError: stop here"


def test_buffers_are_received_on_the_group_s_device():
    sender = ScriptedSender([[("a", torch.ones(2)), ("b", torch.ones(3))]])
    sender.device = torch.device("meta")  # stands for the worker's GPU
    got = list(receive_buckets(sender, {"bytes": 0, "ended": False}))
    assert [(n, t.device.type) for n, t in got] == [("a", "meta"), ("b", "meta")]


def _scripted_worker(monkeypatch, buckets, reads: int | None = None):
    """A WeightReceiver whose sync group plays `buckets` from rank 0 (store and group at the boundary, faked)
    and whose reload reads `reads` tensors (None: all)."""
    seen = {"aborted": None, "closed": False}
    sender = ScriptedSender(buckets)

    class ScriptedGroup(SyncGroup):
        def announce(self):
            pass

        def join(self):
            pass

        def receive_header(self):
            return sender.receive_header()

        def broadcast(self, tensor):
            sender.broadcast(tensor)

        def abort(self, why):
            seen["aborted"] = why

        def close(self):
            seen["closed"] = True

    monkeypatch.setattr(weight_receiver.dist, "TCPStore", lambda *a: dist.HashStore())
    monkeypatch.setattr(weight_receiver, "SyncGroup", ScriptedGroup)

    class Worker(WeightReceiver):
        rank = 0
        loaded: list = []

        def reload_weights(self, weights_iterator):
            for name, _ in weights_iterator:
                self.loaded.append(name)
                if reads is not None and len(self.loaded) == reads:
                    return

    return Worker(), seen


def test_a_worker_returns_the_bytes_it_received_and_leaves(monkeypatch):
    worker, seen = _scripted_worker(
        monkeypatch, [[("a", torch.ones(4))], [("b", torch.ones(2, dtype=torch.bfloat16))]]
    )
    assert worker.swe_sync_weights("h", "1", "p", "1", "2", "5") == 4 * 4 + 2 * 2
    assert worker.loaded == ["a", "b"] and seen == {"aborted": None, "closed": True}


def test_a_reload_that_stops_early_aborts_the_sync_with_a_clear_error(monkeypatch):
    worker, seen = _scripted_worker(monkeypatch, [[("a", torch.ones(4))], [("b", torch.ones(2))]], reads=1)
    message = "weight sync: vLLM's reload stopped reading before the trainer's last bucket"
    with pytest.raises(RuntimeError, match=f"^{message}$"):
        worker.swe_sync_weights("h", "1", "p", "1", "2", "5")
    assert seen == {"aborted": f"RuntimeError: {message}", "closed": False}


def test_a_broadcast_that_never_completes_ends_at_the_deadline_naming_it(clock):
    class Pending:
        def is_completed(self) -> bool:
            return False

    class StuckGroup:
        def broadcast(self, tensors, opts):
            return Pending()

    g = _group(0.05)
    g.group = StuckGroup()
    with pytest.raises(SyncAborted, match=r"^weight sync: a broadcast took longer than 0.05 s$"):
        g.broadcast(torch.zeros(1))


def test_join_raises_the_error_the_group_could_not_form_with(monkeypatch):
    """A rendezvous that fails (a refused connection) ends join with that error, not with a KeyError about the
    collective that never ran."""

    def refused(*a):
        raise RuntimeError("Connection refused by 10.0.0.2:29500")

    monkeypatch.setattr(weight_receiver, "new_group", refused)
    with pytest.raises(RuntimeError, match=r"^Connection refused by 10.0.0.2:29500$"):
        SyncGroup(dist.HashStore(), "s", 1, 3, CPU, 5.0).join()


def test_a_first_collective_that_never_completes_gives_up_at_the_deadline_naming_it(monkeypatch):
    """The group formed but its first collective (NCCL's communicator) hangs: SyncAborted at the deadline, named;
    the collective runs on the group's device ("meta" stands for the worker's GPU)."""

    class Hung(RecordingGroup):
        def broadcast(self, tensors, opts):
            self.sent.append((tensors[0], opts.rootRank))
            return type("Never", (), {"is_completed": lambda self: False})()

    group = Hung()
    monkeypatch.setattr(weight_receiver, "new_group", lambda *a: group)
    g = SyncGroup(dist.HashStore(), "s", 1, 3, torch.device("meta"), 0.2)
    with pytest.raises(SyncAborted, match=r"^weight sync: the group's first collective took longer than 0.2 s$"):
        g.join()
    assert g.group is group and [t.device.type for t, _ in group.sent] == ["meta"]


def test_a_group_given_up_on_is_kept_after_its_abort(monkeypatch):
    """Destroying a gloo group whose operation is pending blocks the destroying thread: the aborted group that
    formed after join gave up is kept alive in _ABORTED, itself; the helper still forming it is a daemon."""
    import threading

    release, kept = threading.Event(), []
    late = RecordingGroup()
    late.abort = lambda: None

    def slow_group(*a):
        release.wait(10)
        return late

    monkeypatch.setattr(weight_receiver, "new_group", slow_group)
    monkeypatch.setattr(weight_receiver, "_ABORTED", kept)
    with pytest.raises(SyncAborted):
        SyncGroup(dist.HashStore(), "s", 1, 3, CPU, 0.2).join()
    helper = [t for t in threading.enumerate() if t.name == "s-join"]  # named for stack dumps
    assert helper and all(t.daemon for t in helper)  # it never holds the process's exit
    release.set()
    deadline = time.monotonic() + 5
    while not kept and time.monotonic() < deadline:
        time.sleep(0.01)
    assert kept == [late]


def test_the_groups_and_the_rendezvous_store_take_the_deadline_given():
    """gloo's group and the rendezvous' own store connection time out when told (not at torch's defaults,
    30 min and 5 min), so a helper thread given up on ends by then."""
    store = dist.HashStore()
    group = weight_receiver.new_group(store, "p", 0, 1, CPU, timedelta(seconds=7))
    assert group.options._timeout == timedelta(seconds=7)
    master = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=5), wait_for_workers=False)
    assert weight_receiver.own_connection(master, 3.0).timeout == timedelta(seconds=3)


def test_the_worker_extension_names_the_receiver_by_its_import_path():
    """vLLM imports --worker-extension-cls by its dotted path."""
    import importlib

    module, _, name = weight_receiver.WORKER_EXTENSION.rpartition(".")
    assert getattr(importlib.import_module(module), name) is WeightReceiver
