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


def _serve_in_thread(server: SandboxServer):
    """Run server's app on a loop of its own in a daemon thread; its URL and a stop function."""
    import asyncio as aio

    from aiohttp import web

    loop, ready = aio.new_event_loop(), threading.Event()
    box = {}

    async def up():
        runner = web.AppRunner(server.app(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        box["runner"], box["port"] = runner, runner.addresses[0][1]
        ready.set()

    threading.Thread(target=lambda: (loop.run_until_complete(up()), loop.run_forever()), daemon=True).start()
    assert ready.wait(10)

    def stop():
        aio.run_coroutine_threadsafe(box["runner"].cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)

    return f"http://127.0.0.1:{box['port']}", stop


def test_the_client_paces_its_starts_so_a_queued_start_does_not_time_out():
    """Eight starts at once on a server that starts one at a time (0.2 s each) with a 0.5 s request timeout:
    queued at the server, the later ones would time out (1.6 s); paced by the client, each request waits only
    for its own start."""
    from swe_megatron.sandbox.base import SandboxSpec
    from swe_megatron.sandbox.client import SandboxClient

    SlowStart.running = SlowStart.most = 0
    server = SandboxServer(SandboxConfig(max_concurrent=64), TOKEN, factory=SlowStart, max_starting=1)
    url, stop = _serve_in_thread(server)
    client = SandboxClient(url, TOKEN, timeout_s=0.5, attach=False)
    try:
        assert client.health(5)["max_starting"] == 1 and client.start_slots is not None
        errors = []

        def start():
            try:
                client.sandbox(SandboxSpec(repo_dir="/r")).start()
            except Exception as e:  # noqa: BLE001 - collected for the assertion
                errors.append(e)

        threads = [threading.Thread(target=start) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert errors == [] and SlowStart.most == 1
    finally:
        client.close()
        stop()
