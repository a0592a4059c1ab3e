"""A stand-in vLLM HTTP server (labelled fake at the engine boundary) that can die on cue.

It answers /health, /v1/completions (always the same assistant turn, given as token ids), /collective_rpc and
/reset_prefix_cache. `die()` makes it drop every connection without an answer, in-flight requests included,
like a crashed server; `die_after=N` does that from its N-th completion on.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class VllmStub:
    """See the module docstring."""

    def __init__(
        self, turn_ids: list[int], delay_s: float = 0.0, die_after: int = 0, fail_reload: bool = False
    ):
        self.completions = 0
        """Completion requests received (counted on arrival, the one that kills it included)."""
        self.answered = 0
        """Completion requests answered (a request in flight when the server dies gets no answer)."""
        self.paths: list[str] = []
        self.dead = threading.Event()
        lock = threading.Lock()
        stub = self

        class H(BaseHTTPRequestHandler):
            def _answer(self, data: bytes) -> None:
                with lock:
                    if stub.dead.is_set():
                        self.close_connection = True  # a crashed server: no answer at all
                        return
                    stub.answered += self.path == "/v1/completions"
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._answer(b"")

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with lock:
                    stub.paths.append(self.path)
                    if self.path == "/v1/completions":
                        stub.completions += 1
                        if die_after and stub.completions >= die_after:
                            stub.dead.set()
                time.sleep(delay_s)
                if self.path == "/collective_rpc" and fail_reload:
                    self.send_response(500)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = {
                    "choices": [
                        {
                            "finish_reason": "stop",
                            "token_ids": turn_ids,
                            "logprobs": {
                                "tokens": [f"token_id:{i}" for i in turn_ids],
                                "token_logprobs": [-0.5] * len(turn_ids),
                            },
                        }
                    ]
                }
                if self.path == "/reset_prefix_cache":
                    body = {"success": True}  # what vLLM answers once the cache is empty
                self._answer(
                    json.dumps(body).encode()
                    if self.path in ("/v1/completions", "/reset_prefix_cache")
                    else b""
                )

            def log_message(self, *a):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def die(self) -> None:
        """From now on, drop every connection unanswered."""
        self.dead.set()

    def close(self) -> None:
        """Stop serving."""
        self.httpd.shutdown()
        self.httpd.server_close()
