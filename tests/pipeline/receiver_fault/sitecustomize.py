"""Test-only fault injection (test_async_e2e.py): on PYTHONPATH with SWE_TEST_KILL_RECEIVER_AFTER=N set, a vLLM
worker that receives weights by broadcast dies (os._exit, as SIGKILL would end it: no abort written, no reply)
after reading N tensors of a sync, mid-bucket. The project's code is unchanged; only receive_buckets is wrapped,
and only the engine's workers call it. Python processes without the variable, or without torch, are untouched."""

import os

_after = os.environ.get("SWE_TEST_KILL_RECEIVER_AFTER")
if _after:
    try:
        from swe_megatron.engine import weight_receiver
    except ImportError:  # a Python without the project (a sandbox's): nothing to wrap
        weight_receiver = None
    if weight_receiver is not None:
        _real = weight_receiver.receive_buckets

        def _dying(sync, counts):
            for i, item in enumerate(_real(sync, counts), 1):
                yield item
                if i == int(_after):
                    os._exit(9)

        weight_receiver.receive_buckets = _dying
