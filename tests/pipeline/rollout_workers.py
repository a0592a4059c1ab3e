"""Workers for tests/pipeline/test_rollout_process.py, imported by the rollout process (a child) by name.

Fakes at the outer boundary only: the engine behind the real VersionGate (a generation that takes a set time)
and the servers' health probes; the process, its pipe, the gate and the rotations are the real ones.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

from swe_megatron.engine.base import EngineError, Generation
from swe_megatron.engine.gate import VersionGate
from swe_megatron.pipeline.rollout_process import Worker
from swe_megatron.rollout.routing import Rotation


class SlowEngine:
    """A generation takes `seconds` (a stand-in for a vLLM server)."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def generate(self, prompt_ids, max_tokens, session=""):
        self.started = time.monotonic()
        time.sleep(self.seconds)
        return Generation(token_ids=[1], logprobs=[0.0], finish_reason="stop")

    def end_session(self, session):
        pass


class FakeRollouts:
    provenance = None

    class sandboxes:  # noqa: N801 - the attribute Worker.close reads
        @staticmethod
        def close():
            pass


class ProbeWorker(Worker):
    """roll(op, ...): what a test asks of the child."""

    def roll(self, op: str, *args):
        if op == "pid":
            return os.getpid()
        if op == "env":
            return os.environ.get(args[0])
        if op == "echo":
            return args
        if op == "raise":
            raise KeyError(args[0])
        if op == "unpicklable":
            e = RuntimeError("holds a lock")
            e.lock = threading.Lock()
            raise e
        if op == "poison":
            return Poison()
        if op == "exit":
            os._exit(3)
        if op == "drop":  # an engine server dies under the child's episodes
            self.rotations[0].drop(self.rotations[0].names.index(args[0]), "connection refused")
            return sorted(self.rotations[0].dead.values())
        if op == "dead":
            return {r.kind: sorted(r.names[i] for i in r.dead) for r in self.rotations}
        if (
            op == "turns"
        ):  # args: n; (start at the engine, end, version) of each turn; an EngineError ends them
            out = []
            for _ in range(args[0]):
                try:
                    gen = self.gate.generate([1], 1)
                except EngineError as e:
                    out.append(("refused", str(e)))
                    break
                out.append((self.gate.engine.started, time.monotonic(), gen.policy_version))
            return out
        raise ValueError(op)


def _refuse():
    raise ValueError("this reply does not unpickle")


class Poison:
    """A reply the parent cannot unpickle."""

    def __reduce__(self):
        return _refuse, ()


@dataclass
class ProbeSpec:
    """Two engine servers and one sandbox server by name; generations of turn_s seconds."""

    turn_s: float = 0.0
    version: int = 0

    def build(self) -> ProbeWorker:
        gate = VersionGate(SlowEngine(self.turn_s), self.version)
        rotations = [rotation("vLLM server", "e0", "e1"), rotation("sandbox server", "s0")]
        return ProbeWorker(FakeRollouts(), gate, rotations)


@dataclass
class BrokenSpec:
    """A spec whose build fails in the child (e.g. a server it cannot reach)."""

    def build(self) -> ProbeWorker:
        raise RuntimeError("no vLLM server answers")


def rotation(kind: str, *names: str) -> Rotation:
    return Rotation(kind, names, lambda i: "down")
