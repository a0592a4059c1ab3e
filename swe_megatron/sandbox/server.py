"""The sandbox server: one process per node that owns the sandboxes on that node and serves them over HTTP.

    swe-megatron sandbox-server --host 10.0.0.5 --port 8760 --token-file JOB/sandbox.token --backend apptainer

Every request carries `Authorization: Bearer <per-job token>` (compared in constant time; else 401).
JSON API under /v1 (client.py is the Python side):

    GET    /v1/health                      -> {"running", "max_concurrent", "max_starting", "backend"}
    POST   /v1/sandboxes {"spec": {...}}   -> {"id"}; 429 when max_concurrent sandboxes are running
    POST   /v1/sandboxes/ID/exec {"command", "timeout_s"} -> {"output_b64", "exit_code", "timed_out", ...}
    POST   /v1/sandboxes/ID/read {"path", "max_bytes"?}  -> {"data_b64"} (max_bytes: only the file's tail)
    POST   /v1/sandboxes/ID/write {"path", "data_b64"}
    DELETE /v1/sandboxes/ID
    GET    /v1/sessions/SID/attach         -> a stream of keep-alive lines while the client lives
    POST   /v1/sessions/SID/heartbeat
    DELETE /v1/sessions/SID                -> stops every sandbox of the session

Requests name their client session in the `X-Sandbox-Session` header. Teardown: on SIGTERM/SIGINT
every sandbox is stopped before the server exits; when a session's attach stream breaks (the client
process died or closed) its sandboxes are stopped; and a sandbox with no request for sandbox.lease_timeout_s,
no command running and no attached session is reaped (a client that vanished without a TCP close).

Sandbox work is blocking (subprocess pipes), so it runs in a thread pool. Whoever holds the token
is trusted to name host paths (spec.repo_dir, env_dir, image): keep the token private to the job.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import dataclasses
import hmac
import logging
import math
import os
import secrets
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from aiohttp import web

from swe_megatron.sandbox import make_sandbox
from swe_megatron.sandbox.base import Sandbox, SandboxError, SandboxSpec
from swe_megatron.sandbox.client import SESSION_HEADER

log = logging.getLogger(__name__)

PING_S = 1.0  # attach stream keep-alive period (also how fast a dead client is noticed)
MAX_BODY = 256 << 20
FILE_ERRORS = {
    FileNotFoundError: 404,
    IsADirectoryError: 400,
    NotADirectoryError: 400,
    PermissionError: 403,
}


@dataclass
class _Entry:
    sandbox: Sandbox
    session: str
    last_seen: float = field(default_factory=time.monotonic)
    busy: int = 0


def _error(status: int, message: str, kind: str = "SandboxError") -> web.Response:
    return web.json_response({"error": message, "type": kind}, status=status)


class BadField(ValueError):
    """A malformed request field (answered 400 with the message, which names the field)."""


def text_field(data: dict, name: str, *, optional: bool = False) -> str | None:
    """data[name] as a string without NUL bytes (None allowed when optional); BadField otherwise."""
    value = data.get(name)
    if value is None and optional:
        return None
    if not isinstance(value, str) or "\0" in value:
        raise BadField(f"{name}={value!r} is invalid; allowed: a string without NUL bytes")
    return value


def seconds_field(data: dict, name: str) -> float | None:
    """data[name] as a finite number of seconds > 0, or None (the backend's default); BadField otherwise."""
    value = data.get(name)
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf
    ):
        raise BadField(f"{name}={value!r} is invalid; allowed: a finite number of seconds > 0, or null")
    return value


def spec_from_json(data: dict) -> SandboxSpec:
    """A SandboxSpec from request JSON; BadField naming an unknown, missing or malformed field."""
    if not isinstance(data, dict):
        raise BadField("spec must be a JSON object")
    names = {f.name for f in dataclasses.fields(SandboxSpec)}
    unknown = set(data) - names
    if unknown:
        raise BadField(f"unknown spec fields {sorted(unknown)}; allowed: {sorted(names)}")
    spec = SandboxSpec(**data)
    text_field(data, "repo_dir")
    if not text_field(vars(spec), "workdir").startswith("/"):
        raise BadField(f"workdir={spec.workdir!r} is invalid; allowed: an absolute path inside the sandbox")
    for name in ("env_dir", "image"):
        text_field(data, name, optional=True)
    setup = data.get("setup", ())
    if not isinstance(setup, (list, tuple)) or not all(isinstance(line, str) for line in setup):
        raise BadField(f"setup={setup!r} is invalid; allowed: a list of shell lines (strings)")
    spec.setup = tuple(setup)
    env = data.get("env")
    if env is not None:
        if not isinstance(env, dict):
            raise BadField(f"env={env!r} is invalid; allowed: an object of string values, or null")
        for key, value in env.items():
            text_field({"env": key}, "env")
            text_field({f"env.{key}": value}, f"env.{key}")
    return spec


class SandboxServer:
    """Owns this node's sandboxes; `app()` is the aiohttp application, `serve()` runs it until a signal."""

    def __init__(self, cfg, token: str, *, factory=make_sandbox, max_starting: int | None = None):
        if len(token) < 16:
            raise ValueError("the sandbox server token must be at least 16 characters")
        self.cfg = cfg
        """The SandboxConfig (backend, max_concurrent, lease_timeout_s, limits)."""
        self._token = token.encode()
        self._factory = factory
        self._sandboxes: dict[str, _Entry] = {}
        self._starting = 0
        self._attached: dict[str, int] = {}
        self._stopping = False
        self._pool = ThreadPoolExecutor(
            max_workers=max(8, 2 * cfg.max_concurrent + 4), thread_name_prefix="sandbox"
        )
        self._reaper: asyncio.Task | None = None
        self.max_starting = max_starting or max(2, os.cpu_count() or 2)
        """Sandboxes started at once (default: one per CPU); more wait their turn. A start is a repository copy,
        a bwrap and a shell, mostly CPU: a thousand at once (every episode of a phase starting together) left
        this server unable to answer its health probe for 30 s, and it was dropped (tools/sim_scale.py)."""
        self._start_slots = asyncio.Semaphore(self.max_starting)

    # -- plumbing ---------------------------------------------------------------------------------------------

    def app(self) -> web.Application:
        """The aiohttp application (routes, auth, lease reaper, teardown on cleanup)."""
        app = web.Application(middlewares=[self._auth, self._bad_fields], client_max_size=MAX_BODY)
        app.add_routes(
            [
                web.get("/v1/health", self._health),
                web.post("/v1/sandboxes", self._start),
                web.post("/v1/sandboxes/{id}/exec", self._exec),
                web.post("/v1/sandboxes/{id}/read", self._read),
                web.post("/v1/sandboxes/{id}/write", self._write),
                web.post("/v1/sandboxes/{id}/host_patch", self._host_patch),
                web.delete("/v1/sandboxes/{id}", self._stop),
                web.get("/v1/sessions/{sid}/attach", self._attach),
                web.post("/v1/sessions/{sid}/heartbeat", self._heartbeat),
                web.delete("/v1/sessions/{sid}", self._end_session),
            ]
        )
        app.on_startup.append(self._on_startup)
        app.on_shutdown.append(self._on_shutdown)
        return app

    async def _on_startup(self, app: web.Application) -> None:
        self._reaper = asyncio.create_task(self._reap_loop())

    async def _on_shutdown(self, app: web.Application) -> None:
        await self.shutdown()

    @web.middleware
    async def _auth(self, request: web.Request, handler):
        given = request.headers.get("Authorization", "")
        expected = b"Bearer " + self._token
        if not hmac.compare_digest(given.encode(), expected):
            return _error(
                401, "missing or wrong sandbox server token (Authorization: Bearer ...)", "AuthError"
            )
        return await handler(request)

    @web.middleware
    async def _bad_fields(self, request: web.Request, handler):
        try:
            return await handler(request)
        except BadField as e:
            return _error(400, f"bad request field: {e}", "ValueError")

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def _entry(self, request: web.Request) -> _Entry:
        entry = self._sandboxes.get(request.match_info["id"])
        if entry is None:
            raise web.HTTPNotFound(
                text='{"error": "no such sandbox (stopped, reaped or never started)", "type": "SandboxError"}',
                content_type="application/json",
            )
        entry.last_seen = time.monotonic()
        return entry

    async def _json(self, request: web.Request) -> dict:
        try:
            data = await request.json()
        except ValueError:
            raise web.HTTPBadRequest(
                text='{"error": "body is not JSON", "type": "ValueError"}', content_type="application/json"
            ) from None
        if not isinstance(data, dict):
            raise web.HTTPBadRequest(
                text='{"error": "body must be a JSON object", "type": "ValueError"}',
                content_type="application/json",
            )
        return data

    # -- handlers --------------------------------------------------------------------------------------------

    async def _health(self, request: web.Request) -> web.Response:
        backend = getattr(self.cfg.backend, "value", self.cfg.backend)
        return web.json_response(
            {
                "running": len(self._sandboxes),
                "max_concurrent": self.cfg.max_concurrent,
                "max_starting": self.max_starting,
                "backend": backend,
            }
        )

    async def _start(self, request: web.Request) -> web.Response:
        if self._stopping:
            return _error(503, "the sandbox server is shutting down")
        data = await self._json(request)
        spec = spec_from_json(data.get("spec"))
        used = len(self._sandboxes) + self._starting
        if used >= self.cfg.max_concurrent:
            return _error(
                429,
                f"sandbox server at capacity: {used} of {self.cfg.max_concurrent} sandboxes running or starting; "
                "stop one, retry later, or raise sandbox.max_concurrent",
                "CapacityError",
            )
        session = request.headers.get(SESSION_HEADER, "")
        self._starting += 1
        try:
            sandbox = self._factory(spec, self.cfg)
            async with self._start_slots:
                await self._run(sandbox.start)
        except SandboxError as e:
            return _error(500, f"sandbox did not start: {e}")
        except Exception as e:  # a config error (local refused) or a bug: say it, keep serving
            return _error(400, f"sandbox did not start: {e}", type(e).__name__)
        finally:
            self._starting -= 1
        if self._stopping:
            await self._run(sandbox.stop)
            return _error(503, "the sandbox server is shutting down")
        sid = secrets.token_hex(8)
        self._sandboxes[sid] = _Entry(sandbox, session)
        return web.json_response({"id": sid})

    async def _exec(self, request: web.Request) -> web.Response:
        entry = self._entry(request)
        data = await self._json(request)
        command, timeout_s = text_field(data, "command"), seconds_field(data, "timeout_s")
        entry.busy += 1
        try:
            res = await self._run(entry.sandbox.exec, command, timeout_s)
        except SandboxError as e:
            return _error(500, str(e))
        finally:
            entry.busy -= 1
            entry.last_seen = time.monotonic()
        body = dataclasses.asdict(res)
        body["output_b64"] = base64.b64encode(body.pop("output")).decode()
        return web.json_response(body)

    async def _file_op(self, fn, *args) -> web.Response | bytes | None:
        try:
            return await self._run(fn, *args)
        except tuple(FILE_ERRORS) as e:
            return _error(FILE_ERRORS[type(e)], str(e), type(e).__name__)
        except OSError as e:
            return _error(400, str(e), "OSError")
        except SandboxError as e:
            return _error(500, str(e))

    async def _read(self, request: web.Request) -> web.Response:
        entry = self._entry(request)
        data = await self._json(request)
        path, max_bytes = text_field(data, "path"), data.get("max_bytes")
        if max_bytes is not None and (type(max_bytes) is not int or max_bytes < 0):
            raise BadField(f"max_bytes={max_bytes!r} is invalid; allowed: an integer >= 0, or absent")
        result = await self._file_op(entry.sandbox.read_file, path, max_bytes)
        if isinstance(result, web.Response):
            return result
        return web.json_response({"data_b64": base64.b64encode(result).decode()})

    async def _write(self, request: web.Request) -> web.Response:
        entry = self._entry(request)
        data = await self._json(request)
        path = text_field(data, "path")
        try:
            raw = base64.b64decode(text_field(data, "data_b64"), validate=True)
        except binascii.Error as e:
            raise BadField(f"data_b64 is not base64 ({e})") from None
        result = await self._file_op(entry.sandbox.write_file, path, raw)
        return result if isinstance(result, web.Response) else web.json_response({"ok": True})

    async def _host_patch(self, request: web.Request) -> web.Response:
        entry = self._entry(request)
        max_bytes = (await self._json(request)).get("max_bytes")
        if type(max_bytes) is not int or max_bytes < 0:
            raise BadField(f"max_bytes={max_bytes!r} is invalid; allowed: an integer >= 0")
        result = await self._file_op(entry.sandbox.host_patch, max_bytes)
        return result if isinstance(result, web.Response) else web.json_response({"patch": result})

    async def _stop(self, request: web.Request) -> web.Response:
        entry = self._sandboxes.pop(request.match_info["id"], None)
        if entry is not None:
            await self._run(entry.sandbox.stop)
        return web.json_response({"stopped": entry is not None})

    async def _heartbeat(self, request: web.Request) -> web.Response:
        sid, now = request.match_info["sid"], time.monotonic()
        for entry in self._sandboxes.values():
            if entry.session == sid:
                entry.last_seen = now
        return web.json_response({"ok": True})

    async def _end_session(self, request: web.Request) -> web.Response:
        stopped = await self.stop_session(request.match_info["sid"])
        return web.json_response({"stopped": stopped})

    async def _attach(self, request: web.Request) -> web.StreamResponse:
        """Held open by the client for its lifetime; when it breaks, the session's sandboxes are stopped."""
        sid = request.match_info["sid"]
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        self._attached[sid] = self._attached.get(sid, 0) + 1
        try:
            while not self._stopping:
                transport = request.transport
                if transport is None or transport.is_closing():
                    break
                await response.write(b".\n")
                await asyncio.sleep(PING_S)
        except (ConnectionError, asyncio.CancelledError, RuntimeError):
            pass
        finally:
            self._attached[sid] -= 1
            if self._attached[sid] == 0:
                del self._attached[sid]
                if not self._stopping:
                    stopped = await asyncio.shield(self.stop_session(sid))
                    if stopped:
                        log.info("session %s went away: stopped its %d sandboxes", sid, stopped)
        return response

    # -- teardown --------------------------------------------------------------------------------------------

    async def stop_session(self, sid: str) -> int:
        """Stop every sandbox of a client session; returns how many."""
        ids = [k for k, e in self._sandboxes.items() if e.session == sid]
        entries = [self._sandboxes.pop(k) for k in ids]
        await asyncio.gather(*(self._run(e.sandbox.stop) for e in entries))
        return len(entries)

    async def _reap_loop(self) -> None:
        period = max(0.2, min(5.0, self.cfg.lease_timeout_s / 4))
        while not self._stopping:
            await asyncio.sleep(period)
            now = time.monotonic()
            stale = [
                k
                for k, e in self._sandboxes.items()
                if e.busy == 0
                and e.session not in self._attached
                and now - e.last_seen > self.cfg.lease_timeout_s
            ]
            entries = [self._sandboxes.pop(k) for k in stale]
            if entries:
                log.info("lease expired: stopping %d idle sandboxes", len(entries))
                await asyncio.gather(*(self._run(e.sandbox.stop) for e in entries))

    async def shutdown(self) -> None:
        """Stop every sandbox (idempotent); the server answers 503 to new starts from here on."""
        self._stopping = True
        if self._reaper is not None:
            self._reaper.cancel()
        entries = list(self._sandboxes.values())
        self._sandboxes.clear()
        await asyncio.gather(*(self._run(e.sandbox.stop) for e in entries), return_exceptions=True)

    async def serve(self, host: str, port: int, ready=None) -> None:
        """Serve until SIGTERM/SIGINT, then stop every sandbox; `ready(port)` is called once listening."""
        runner = web.AppRunner(self.app(), handle_signals=False, shutdown_timeout=5.0, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0][1] if runner.addresses else port
        done = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, done.set)
        if ready is not None:
            ready(bound)
        try:
            await done.wait()
        finally:
            await self.shutdown()
            with contextlib.suppress(Exception):
                await runner.cleanup()
            self._pool.shutdown(wait=False)
