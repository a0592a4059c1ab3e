"""The sandbox server under a start storm (every episode of a phase starting at once): starts are limited to
max_starting at a time and the server keeps answering meanwhile. In-process, with a stand-in sandbox whose start
only sleeps (labelled: the outer boundary; the real starts are tests/sandbox/test_sandbox_server.py's)."""

from __future__ import annotations

import asyncio
import threading
import time

from aiohttp.test_utils import TestClient, TestServer

from swe_megatron.config.schema import SandboxConfig
from swe_megatron.sandbox.server import SandboxServer

TOKEN = "t" * 32


class SlowStart:
    """Stand-in sandbox: start() takes 0.2 s and records how many starts run at once."""

    lock, running, most = threading.Lock(), 0, 0

    def __init__(self, spec, cfg):
        self.spec = spec

    def start(self) -> None:
        with SlowStart.lock:
            SlowStart.running += 1
            SlowStart.most = max(SlowStart.most, SlowStart.running)
        time.sleep(0.2)
        with SlowStart.lock:
            SlowStart.running -= 1

    def stop(self) -> None:
        pass


def test_a_start_storm_runs_max_starting_at_a_time_and_health_still_answers():
    async def storm() -> tuple[list[int], float]:
        server = SandboxServer(SandboxConfig(max_concurrent=64), TOKEN, factory=SlowStart, max_starting=2)
        async with TestClient(TestServer(server.app())) as client:
            auth = {"Authorization": f"Bearer {TOKEN}"}

            async def start() -> int:
                resp = await client.post("/v1/sandboxes", json={"spec": {"repo_dir": "/r"}}, headers=auth)
                return resp.status

            starts = [asyncio.create_task(start()) for _ in range(8)]
            await asyncio.sleep(0.1)
            t = time.monotonic()
            health = await client.get("/v1/health", headers=auth)
            waited = time.monotonic() - t
            assert health.status == 200
            return await asyncio.gather(*starts), waited

    statuses, health_s = asyncio.run(storm())
    assert statuses == [200] * 8
    assert SlowStart.most == 2  # 8 starts, 2 at a time: ~0.8 s in all
    assert health_s < 0.15  # answered while six starts still wait their turn
