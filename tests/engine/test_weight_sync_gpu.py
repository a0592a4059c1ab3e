"""Broadcast weight sync over real NCCL (gpu marker; `tools/gpu_check.sh` runs it on one GPU machine).

The CPU tests (test_weight_sync_protocol.py) run the same protocol over gloo. Here the members are on CUDA, so
`SyncGroup` makes real `ProcessGroupNCCL`s: the constructor and its options, polling `is_completed` on NCCL
work, abort and shutdown, as torch's CUDA build has them.

- One process, a group of one: the calls themselves (any GPU count).
- Trainer rank 0 (this process, GPU 0) and one receiver in a process of its own (the real `WeightReceiver`,
  its `reload_weights` a labelled fake that keeps what it reads), the receiver ending the sync or killed
  mid-bucket. On a single GPU both ranks share the device: NCCL refuses that ("Duplicate GPU detected") and
  the test skips, naming NCCL's error; with two GPUs the receiver takes GPU 1.
"""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import swe_megatron.engine.vllm as vllm_client
from swe_megatron.engine.base import EngineError
from swe_megatron.engine.weight_receiver import SyncGroup, WeightReceiver
from swe_megatron.train import weight_sync
from swe_megatron.train.weight_sync import BroadcastWeightSync

pytestmark = pytest.mark.gpu


def store() -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=60), wait_for_workers=False)


def test_a_cuda_member_makes_a_real_nccl_group_that_broadcasts_shuts_down_and_aborts():
    dev = torch.device("cuda", 0)
    s = store()
    done = SyncGroup(s, "ok", 0, 1, dev, 30.0)
    done.await_members()  # a group of one: nobody to wait for
    done.join()
    assert isinstance(done.group, dist.ProcessGroupNCCL)
    done.send_header('[["w", "float32", [4]]]')
    flat = torch.arange(4.0, device=dev)
    done.broadcast(flat)  # polled on the NCCL work's is_completed, then waited
    assert flat.tolist() == [0.0, 1.0, 2.0, 3.0]
    done.send_header("")
    done.close()

    failed = SyncGroup(s, "failed", 0, 1, dev, 30.0)
    failed.join()
    failed.broadcast(torch.ones(1 << 20, device=dev))
    start = time.monotonic()
    failed.abort("a test's reason")
    took = time.monotonic() - start
    print(f"NCCL group abort took {took * 1e3:.1f} ms")
    assert took < 10
    assert failed.aborted() == "rank 0: a test's reason"


class KeepingReceiver(WeightReceiver):
    """The real WeightReceiver in a labelled stand-in for a vLLM worker (rank 0 of its server): its reload keeps
    a CPU copy of each tensor; die_after: the process exits (as if killed) after reading that many tensors."""

    rank = 0

    def __init__(self, die_after: int | None):
        self.die_after, self.loaded = die_after, {}

    def reload_weights(self, weights_iterator) -> None:
        for name, t in weights_iterator:
            self.loaded[name] = t.cpu().clone()
            if self.die_after is not None and len(self.loaded) == self.die_after:
                os._exit(9)


def receiver_main(kwargs: dict, gpu: int, die_after: int | None, conn) -> None:
    """A receiver process: join the sync on `gpu`, send back ("ok", bytes, loaded) or ("error", text)."""
    torch.cuda.set_device(gpu)
    worker = KeepingReceiver(die_after)
    try:
        n = worker.swe_sync_weights(**kwargs)
        buf = io.BytesIO()  # bytes, not tensors: a tensor sent through a pipe lives in this process's memory
        torch.save(worker.loaded, buf)
        conn.send(("ok", n, buf.getvalue()))
    except BaseException as e:  # noqa: BLE001 - reported to the trainer as vLLM's RPC would
        conn.send(("error", f"{type(e).__name__}: {e}"))


def weights(dev) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        ("a", torch.randn(256, 64, generator=g).to(dev)),
        ("b", torch.randn(1000, generator=g).bfloat16().to(dev)),
        ("c", torch.randn(64, 64, generator=g).to(dev)),
        ("d", torch.arange(12, device=dev).view(3, 4)),
        ("e", torch.randn(4096, generator=g).to(dev)),
    ]


class OneServer:
    """The engine of one labelled stand-in server: its /collective_rpc starts a receiver process and answers
    what it sent, or a connection error when it died; its prefix-cache resets are counted."""

    url = "http://stand-in-server:8000"

    def __init__(self, gpu: int, die_after: int | None):
        self.gpu, self.die_after, self.resets = gpu, die_after, 0

    def reset_prefix_cache(self, url: str, timeout_s: float) -> None:
        self.resets += 1

    def post_json(self, url: str, body: dict, timeout_s: float):
        ctx = mp.get_context("spawn")
        here, there = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=receiver_main, args=(body["kwargs"], self.gpu, self.die_after, there))
        proc.start()
        there.close()
        try:
            got = here.recv() if here.poll(timeout_s) else None
        except EOFError:  # it died before answering
            got = None
        proc.join(timeout_s)
        if got is None:
            raise EngineError(f"{self.url}: Connection reset by peer (exit code {proc.exitcode})")
        if got[0] == "error":
            raise EngineError(f"{self.url}: HTTP 500: {got[1]}")
        self.result = got
        return [got[1]]


@pytest.mark.parametrize("die_after", [None, 2], ids=["completes", "receiver_killed_mid_bucket"])
def test_rank0_broadcasts_to_a_receiver_process_over_nccl(monkeypatch, die_after):
    gpu = 1 if torch.cuda.device_count() > 1 else 0
    server = OneServer(gpu, die_after)
    monkeypatch.setattr(vllm_client, "post_json", server.post_json)  # what weight_sync's collective_rpc uses
    monkeypatch.setattr(
        vllm_client, "http_health", lambda url, timeout_s, *a, **k: None
    )  # alive until it dies
    monkeypatch.setattr(weight_sync, "reset_prefix_cache", server.reset_prefix_cache)
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(0)
    sync = BroadcastWeightSync(1, "127.0.0.1", 0, timeout_s=60, bucket_bytes=64 << 10)
    start = time.monotonic()
    report, error = sync.send(iter(weights(dev)), server, dev)
    took = time.monotonic() - start
    print(
        f"NCCL sync ({'one GPU' if gpu == 0 else 'two GPUs'}, die_after={die_after}): {took:.2f} s, "
        f"{report.buckets} buckets, {report.bytes} bytes; error: {error}"
    )
    if error is not None and "Duplicate GPU" in error:
        pytest.skip(f"NCCL refuses two ranks on one GPU: {error[-300:]}")
    if die_after is None:
        assert error is None and server.resets == 1
        _, nbytes, saved = server.result
        loaded = torch.load(io.BytesIO(saved))
        want = {k: v.cpu() for k, v in weights(dev)}
        assert loaded.keys() == want.keys() and all(torch.equal(loaded[k], want[k]) for k in want)
        assert nbytes == report.bytes == sum(t.numel() * t.element_size() for t in want.values())
    else:
        assert error is not None and "Connection reset by peer" in error, error
        assert server.resets == 0
        assert took < 30, "rank 0 must stop at the receiver's death, not at its timeout"
