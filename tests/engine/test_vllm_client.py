"""The vLLM client: exact request body (unbiased sampling spelled out), response parsing, sticky routing,
reload routes, and the server command line (model generation_config ignored). A stub HTTP server stands in
for vLLM (the real one runs in test_vllm_e2e.py)."""

import json
import os
import threading
import time
from array import array
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from swe_megatron.config.schema import EngineConfig, SamplingConfig
from swe_megatron.engine.base import EngineError
from swe_megatron.engine.vllm import VllmEngine, completion_body, completion_parts, parse_completion
from swe_megatron.engine.vllm_server import server_command, server_env


def test_request_body_is_exact():
    body = completion_body("policy", [1, 2, 3], 64, SamplingConfig(), [151645])
    assert body == {
        "model": "policy",
        "prompt": [1, 2, 3],
        "max_tokens": 64,
        "n": 1,
        "stream": False,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": 0,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "logprobs": 0,
        "return_tokens_as_token_ids": True,
        "return_token_ids": True,
        "skip_special_tokens": False,
        "spaces_between_special_tokens": False,
        "stop_token_ids": [151645],
        "ignore_eos": False,
        "echo": False,
    }


def response(ids, lps, finish="stop"):
    return {
        "choices": [
            {
                "text": "",
                "finish_reason": finish,
                "token_ids": ids,
                "logprobs": {"tokens": [f"token_id:{i}" for i in ids], "token_logprobs": lps},
            }
        ]
    }


def test_parse_completion():
    g = parse_completion(response([5, 151645], [-1.5, -0.25]))
    assert (g.token_ids, g.logprobs, g.finish_reason) == ([5, 151645], [-1.5, -0.25], "stop")
    assert parse_completion(response([5], [-1.0], "length")).finish_reason == "length"
    with pytest.raises(EngineError):
        parse_completion({"choices": []})
    bad = response([5], [-1.0])
    bad["choices"][0]["token_ids"] = [6]
    with pytest.raises(EngineError):
        parse_completion(bad)


class Stub:
    """An HTTP server that records requests and answers like vLLM's /v1/completions."""

    def __init__(self, resets=None, root="/runs/other/engine/model", keep_alive=False, hang_up=False):
        self.requests = []
        self.peers = []  # the client's (host, port) of each request: one per connection it used
        self.resets = list(resets or [])  # /reset_prefix_cache answers in turn ({"success": ...}), then true
        stub = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1" if keep_alive else "HTTP/1.0"

            def do_GET(self):  # /health, and /v1/models naming the folder the server was started from
                data = (
                    b""
                    if self.path == "/health"
                    else json.dumps({"data": [{"id": "policy", "root": root}]}).encode()
                )
                self.send_response(200 if self.path in ("/health", "/v1/models") else 404)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                stub.requests.append((self.path, body))
                stub.peers.append(self.client_address)
                self.close_connection = hang_up  # closes a connection it said it would keep (idle timeout)
                data = b""
                if self.path == "/v1/completions":
                    data = json.dumps(response([7, 151645], [-0.5, -0.1])).encode()
                elif self.path == "/reset_prefix_cache":  # vLLM >= 0.1x answers {"success": bool}
                    data = json.dumps({"success": stub.resets.pop(0) if stub.resets else True}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


def test_one_server_client_sends_the_exact_body_and_reload_routes():
    """VllmEngine talks to one server; spreading sessions over many is RoutedEngine's (test_routing.py)."""
    a = Stub()
    eng = VllmEngine(a.url + "/", "policy", SamplingConfig(), [151645], timeout_s=5)
    gen = eng.generate([1, 2], 8, session="ep1")
    eng.end_session("ep1")
    assert gen.token_ids == [7, 151645] and gen.finish_reason == "stop"
    assert a.requests == [
        ("/v1/completions", completion_body("policy", [1, 2], 8, SamplingConfig(), [151645]))
    ]
    eng.reload_weights("/ckpt/iter1")
    assert a.requests[-2] == (
        "/collective_rpc",
        {"method": "reload_weights", "kwargs": {"weights_path": "/ckpt/iter1"}, "timeout": 5},
    )
    assert a.requests[-1][0] == "/reset_prefix_cache"
    with pytest.raises(TypeError, match="one server URL.*RoutedEngine"):
        VllmEngine([a.url], "policy", SamplingConfig(), [1])
    a.httpd.shutdown()
    with pytest.raises(EngineError, match="is the vLLM server running"):
        VllmEngine(a.url, "policy", SamplingConfig(), [1], timeout_s=2).generate([1], 4)


def test_completions_reuse_one_kept_connection_and_send_each_prompt_exactly():
    a = Stub(keep_alive=True)
    eng = VllmEngine(a.url, "policy", SamplingConfig(), [151645], timeout_s=5)
    prompts = [
        [1, 2],
        [1, 2, 7, 151645, 30],
        [1, 2, 7, 151645, 30, 7, 151645, 31],
        [5, 2, 7, 151645, 30, 7, 9, 9, 9],
    ]
    for p in prompts[:3]:
        eng.generate(p, 8, session="ep1")
    eng.generate(prompts[3], 8, session="ep1")  # not an extension of the last prompt: formatted afresh
    assert [body["prompt"] for _, body in a.requests] == prompts
    assert [body for _, body in a.requests][1] == completion_body(
        "policy", prompts[1], 8, SamplingConfig(), [151645]
    )
    assert len(set(a.peers)) == 1  # one connection for all four
    eng.end_session("ep1")
    assert eng.prompts.text("ep1", [3]) == b"3"


def test_a_session_keeps_its_prompt_as_json_text_only_not_a_copy_of_the_ids(monkeypatch):
    """At a thousand episodes of 131k tokens each byte a token matters: a session keeps its prompt's JSON
    (~7 bytes a token) and a digest, not a second copy of the ids (4 bytes a token) beside the ledger's."""
    import tracemalloc

    from swe_megatron.engine import vllm
    from swe_megatron.engine.vllm import PromptJson

    formatted = []  # how many ids each call formats: an extension formats only its new ones
    json_ids = vllm._json_ids
    monkeypatch.setattr(vllm, "_json_ids", lambda ids: formatted.append(len(ids)) or json_ids(ids))

    prompts, ids = PromptJson(), array("i", range(100_000, 200_000))
    tracemalloc.start()
    try:
        text = prompts.text("s", ids)
        kept, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert text == ",".join(map(str, ids)).encode()
    assert len(text) <= kept < len(text) + 100_000  # the ids' copy would be 400,000 bytes more
    ids.extend([7, 8])
    assert prompts.text("s", ids) == ",".join(map(str, ids)).encode()  # extended by ",7,8"
    ids.append(9)
    assert prompts.text("s", ids) == ",".join(map(str, ids)).encode()
    assert formatted == [100_000, 2, 1]
    ids[0] = 5
    fresh = prompts.text("s", ids)
    assert fresh.startswith(b"5,100001,")  # not an extension: formatted afresh
    body = completion_parts({"model": "policy", "prompt": [], "max_tokens": 8}, fresh)
    assert body[1] is fresh  # sent as it is kept: no copy of the prompt for the request
    assert json.loads(b"".join(body))["prompt"] == list(ids)


def test_a_kept_connection_the_server_closed_is_retried_once_on_a_new_one():
    a = Stub(keep_alive=True, hang_up=True)
    eng = VllmEngine(a.url, "policy", SamplingConfig(), [151645], timeout_s=5)
    for n in range(3):
        assert eng.generate([1] * (n + 1), 8, session="s").token_ids == [7, 151645]
    assert len(a.requests) == 3 and len(set(a.peers)) == 3


def test_reload_retries_a_refused_prefix_cache_reset_and_fails_clearly_when_it_stays_stale():
    # vLLM answers {"success": false} (HTTP 200) while KV blocks are held; the old weights' cache then stays.
    flaky, stale = Stub(resets=[False, False]), Stub(resets=[False] * 100)
    VllmEngine(flaky.url, "policy", SamplingConfig(), [1], timeout_s=5).reload_weights("/ckpt/1")
    assert [p for p, _ in flaky.requests] == ["/collective_rpc"] + ["/reset_prefix_cache"] * 3
    with pytest.raises(EngineError, match="prefix cache.*not reset"):
        VllmEngine(stale.url, "policy", SamplingConfig(), [1], timeout_s=5).reload_weights("/ckpt/1")
    for s in (flaky, stale):
        s.httpd.shutdown()


def test_a_server_that_dies_during_a_collective_rpc_fails_it_at_once_not_at_its_timeout(monkeypatch):
    """What vLLM's API server does when the engine core dies under a weight load (the uni executor: the model in
    the engine core): it shuts down waiting for the open /collective_rpc connection, whose reply never comes, and
    refuses new connections. The call must fail on the failed /health probes, not after timeout_s."""
    import swe_megatron.engine.vllm as vllm_client

    monkeypatch.setattr(vllm_client, "RPC_PROBE_S", 0.2)
    held, dead = threading.Event(), threading.Event()

    class H(BaseHTTPRequestHandler):
        def do_GET(self):  # /health: 200 while alive, 503 once the engine died (vLLM's own answer then)
            self.send_response(503 if dead.is_set() else 200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_POST(self):  # /collective_rpc: held open, never answered
            self.rfile.read(int(self.headers["Content-Length"]))
            held.set()
            dead.wait(60)
            time.sleep(60)

        def log_message(self, *a):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    # Alive but slow (a weight load takes long): the call keeps waiting through healthy probes.
    threading.Timer(1.5, dead.set).start()
    start = time.monotonic()
    with pytest.raises(
        EngineError, match="stopped answering .*HTTP 503.* during /collective_rpc reload_weights"
    ):
        VllmEngine(url, "policy", SamplingConfig(), [1], timeout_s=600).reload_weights("/ckpt/1")
    took = time.monotonic() - start
    assert held.is_set() and 1.5 < took < 10, took
    httpd.shutdown()


def test_server_ignores_generation_config_and_keeps_caches_out_of_outputs(tmp_path):
    cmd = server_command("/m", 8100, EngineConfig(), 8192, "policy")
    assert cmd[cmd.index("--generation-config") + 1] == "vllm"
    assert cmd[cmd.index("--logprobs-mode") + 1] == "raw_logprobs" and "--enforce-eager" in cmd
    env = server_env(EngineConfig(cpu_kvcache_gib=1, cache_dir=str(tmp_path / "cache")), tmp_path)
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1" and env["VLLM_SERVER_DEV_MODE"] == "1"
    assert Path(env["TMPDIR"]).is_relative_to(tmp_path)
    # compile caches (148 MB in a rollout's --out, issue 27): engine.cache_dir, shared by runs, not the work dir
    cache_vars = ("VLLM_CACHE_ROOT", "XDG_CACHE_HOME", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")
    assert all(Path(env[k]).is_relative_to(tmp_path / "cache") for k in cache_vars)
    # IPC sockets: under the work dir when its path is short, else a short private folder (107-byte limit).
    rpc = Path(env["VLLM_RPC_BASE_PATH"])
    assert rpc.is_dir() and len(str(rpc)) <= 60
    assert rpc.is_relative_to(tmp_path) == (len(str((tmp_path / "rpc").resolve())) <= 60)
    assert "--worker-extension-cls" not in cmd
    bc = server_command("/m", 8100, EngineConfig(weight_sync="broadcast"), 8192, "policy")
    assert bc[bc.index("--worker-extension-cls") + 1] == "swe_megatron.engine.weight_receiver.WeightReceiver"


def test_on_cpu_one_worker_runs_in_the_engine_core_and_tensor_parallel_keeps_its_workers(
    tmp_path, monkeypatch
):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cmd, env = (
        server_command("/m", 8100, EngineConfig(), 8192, "policy"),
        server_env(EngineConfig(), tmp_path),
    )
    assert cmd[cmd.index("--distributed-executor-backend") + 1] == "uni"
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert env["OMP_NUM_THREADS"] == str(max(1, (os.cpu_count() or 1) - 1))
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert server_env(EngineConfig(), tmp_path)["OMP_NUM_THREADS"] == "3"  # the caller's choice stands
    tp2 = EngineConfig(tensor_parallel_size=2)
    assert "--distributed-executor-backend" not in server_command("/m", 8100, tp2, 8192, "policy")
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in server_env(tp2, tmp_path)


def test_an_eager_server_on_cpu_runs_without_dynamo_and_a_compiling_one_keeps_it(tmp_path, monkeypatch):
    """enforce_eager on CPU: TORCHDYNAMO_DISABLE in the server (tests/engine/test_vllm_e2e.py shows nothing
    compiles); without enforce_eager, or on a GPU, vLLM's compilation stays as it is."""
    monkeypatch.delenv("TORCHDYNAMO_DISABLE", raising=False)
    assert server_env(EngineConfig(), tmp_path)["TORCHDYNAMO_DISABLE"] == "1"
    assert "TORCHDYNAMO_DISABLE" not in server_env(EngineConfig(enforce_eager=False), tmp_path)
    from swe_megatron.engine import vllm_server

    monkeypatch.setattr(vllm_server, "_has_gpu", lambda: True)  # GPU servers keep vLLM's defaults
    assert "TORCHDYNAMO_DISABLE" not in server_env(EngineConfig(), tmp_path)


def test_a_port_answered_by_another_runs_server_is_not_taken_for_ours(tmp_path, monkeypatch):
    """Two runs on one machine may pick the same port: the other run's vLLM then answers our health probe
    while ours is still loading (and will fail to bind). The server must be recognised as not ours (its
    /v1/models root is another model folder), never used: weights reloaded into it would corrupt both runs."""
    from swe_megatron.engine import vllm_server

    other = Stub(root="/runs/other/engines/engine0/model")
    port = int(other.url.rsplit(":", 1)[1])
    monkeypatch.setattr(vllm_server, "server_command", lambda *a, **k: ["sleep", "30"])  # ours, still loading
    ours = vllm_server.VllmServer(str(tmp_path / "model"), port, EngineConfig(), tmp_path / "work")
    ours.start()
    try:
        with pytest.raises(EngineError, match=r"another .*server.*/runs/other/engines/engine0/model") as e:
            ours.wait_healthy(timeout_s=20)
    finally:
        ours.stop(grace_s=1)
    assert not str(e.value).rstrip().endswith(":"), e.value  # ours, still loading, has logged nothing yet
    mine = Stub(root=str(tmp_path / "model"))  # a server started from our folder is ours
    ours = vllm_server.VllmServer(str(tmp_path / "model"), int(mine.url.rsplit(":", 1)[1]), EngineConfig(),
                                  tmp_path / "work")  # fmt: skip
    ours.start()
    try:
        ours.wait_healthy(timeout_s=20)
    finally:
        ours.stop(grace_s=1)
