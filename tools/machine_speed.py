"""One line that says how fast this machine's cores are, so CI times from different machines compare.

.venv/bin/python tools/machine_speed.py
# machine: AMD EPYC, 2 cores; one core: 1024^2 fp32 matmul 24.3 ms, Python loop 10^6 adds 28 ms (medians of 5)

Both figures are per core (torch on one thread): the test suite is mostly single-threaded imports, server
starts and small-model steps, which scale with them.
"""

from __future__ import annotations

import os
import platform
import statistics
import time


def _median_s(fn, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    import torch

    torch.set_num_threads(1)
    a = torch.randn(1024, 1024)
    a @ a  # warm-up

    def python_loop():
        n = 0
        for i in range(1_000_000):
            n += i
        return n

    matmul = _median_s(lambda: a @ a)
    loop = _median_s(python_loop)
    print(
        f"machine: {_cpu_model()}, {os.cpu_count()} cores; one core: 1024^2 fp32 matmul {matmul * 1e3:.1f} ms, "
        f"Python loop 10^6 adds {loop * 1e3:.0f} ms (medians of 5)"
    )


if __name__ == "__main__":
    main()
