"""Rank 0's rollouts in a process of their own, so that they never share the trainer's GIL (async mode).

With algo.max_staleness >= 1 the next units roll out while the trainer updates. On threads of the trainer's
process, hundreds of episode threads slowed each train step by 32% (tools/sim_scale.py --trainer-core,
docs/benchmarks.md "Scale"), although they ran on other cores: the GIL was the shared resource. So in async
mode every RL rollout of a stage runs in this process's child, one unit at a time, in order:

    trainer's process (rank 0)                            rollout process (a child python: main() here)
    RolloutProcess(spec)  -- spec ----------------------> spec.build(): the run's Rollouts, its own gate
    .roll(*args) (pipeline/ahead.py's thread waits) ----> work thread: worker.roll(*args) -> (result, dead)
    .pause() before a weight sync ----------------------> main loop: gate.pause(), replies once no turn runs
    .resume(version) after it --------------------------> gate.resume(version)
    .close(reason) -------------------------------------> gate.close(reason), waits for the unit, exits

Each side keeps its own rotation of the same servers (rollout/routing.py). Every reply carries the servers
the child has taken out of rotation, and every pause and resume the parent's: both sides drop them, so a
server that missed a weight update (dropped by the sync) serves no later turn, and one that died under the
child's episodes is left out of the next sync and of eval. The child dies with the trainer's process (the
kernel's parent-death signal, as the servers started here), so a killed run leaves no rollout writing into a
unit folder that the resumed run starts afresh; its sandbox sessions end with it.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pickle
import subprocess
import sys
import threading
import traceback
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from swe_megatron.engine.gate import VersionGate
from swe_megatron.procfs import die_with_parent

Dead = dict[str, dict[str, str]]
"""Servers out of rotation: {rotation kind: {server name: reason}}."""
CHILD = "import sys; from swe_megatron.pipeline.rollout_process import main; main(sys.argv[1:])"
"""The rollout process's program (python -c CHILD FD_IN FD_OUT)."""


def dead_of(rotations) -> Dead:
    """The servers each rotation has dropped, by name."""
    return {r.kind: {r.names[i]: why for i, why in r.dead.items()} for r in rotations}


def drop_dead(rotations, dead: Dead) -> None:
    """Drop from each rotation the servers `dead` names for its kind (the other side's reasons kept)."""
    for r in rotations:
        for name, why in dead.get(r.kind, {}).items():
            if name in r.names:
                r.drop(r.names.index(name), f"{why} (seen by the other rollout process)")


class RolloutProcessError(RuntimeError):
    """The rollout process exited, or could not start."""


@dataclass
class RolloutsSpec:
    """How the rollout process rebuilds the run's Rollouts: the config and the servers (picklable)."""

    cfg: Any
    """The run's config."""
    engines: list[str]
    """vLLM server URLs (every one the run started with)."""
    sandbox_servers: list[str]
    """Sandbox server URLs."""
    token: str
    """The sandbox servers' bearer token."""
    version: int
    """The weight version the engines serve now."""
    dead: Dead = field(default_factory=dict)
    """Servers already out of rotation."""

    @classmethod
    def of(cls, rollouts, gate: VersionGate) -> RolloutsSpec:
        """The spec of a run's Rollouts whose engine is `gate` over a RoutedEngine and whose sandboxes are
        sandbox servers (what pipeline/driver.py builds)."""
        routed, pool = gate.engine, rollouts.sandboxes
        if getattr(routed, "rotation", None) is None or pool is None:
            raise RolloutProcessError(
                "async rollouts (algo.max_staleness >= 1) run in a process of their own and need the run's "
                f"vLLM servers and sandbox servers by URL; got engine {type(routed).__name__} and sandboxes "
                f"{type(pool).__name__}"
            )
        return cls(rollouts.cfg, list(routed.rotation.names), list(pool.rotation.names), pool.clients[0].token,
                   gate.version, dead_of([routed.rotation, pool.rotation]))  # fmt: skip

    def build(self) -> Worker:
        """In the rollout process: the Rollouts over the same servers, behind a gate of its own."""
        from swe_megatron.agent.tokens import ChatFormat
        from swe_megatron.model.tokenizer import load_tokenizer
        from swe_megatron.rollout.routing import check_servers, policy_engine, run_sandboxes
        from swe_megatron.rollout.setup import Rollouts

        cfg = self.cfg
        chat = ChatFormat(load_tokenizer(cfg.model.tokenizer))
        routed = policy_engine(cfg, self.engines, chat.eos_id)
        pool = run_sandboxes(cfg, self.sandbox_servers, self.token)
        drop_dead([routed.rotation, pool.rotation], self.dead)
        check_servers(routed, pool)
        gate = VersionGate(routed, self.version, per_episode=not cfg.agent.partial_rollouts)
        return Worker(Rollouts(cfg, gate, pool, chat), gate, [routed.rotation, pool.rotation])


class Worker:
    """The rollout process's side: one stage's units rolled out through the run's Rollouts."""

    def __init__(self, rollouts, gate: VersionGate, rotations: list):
        self.rollouts, self.gate, self.rotations = rollouts, gate, rotations

    def roll(self, stage_name: str, tasks: list, unit_dir):
        """tasks x the stage's samples_per_task episodes at its limits, graded, into unit_dir; (trajectories,
        RolloutStats.time_split())."""
        r = self.rollouts
        stage = getattr(r.cfg, stage_name)
        trajs, stats = r.run(tasks, stage.samples_per_task, r.limits(stage), unit_dir)
        return trajs, stats.time_split()

    def close(self) -> None:
        if self.rollouts.provenance is not None:
            self.rollouts.provenance.close()
        self.rollouts.sandboxes.close()


class RolloutProcess:
    """The parent's handle on the rollout process (see the module docstring). Start it from a long-lived thread
    (the driver's main thread): the child's parent-death signal fires when the starting thread ends."""

    def __init__(self, spec, rotations: list = (), pythonpath: list[str] = ()):
        """spec: a picklable object whose build() the child calls (RolloutsSpec, or a benchmark's own);
        rotations: the parent's rotations of the same servers (kept in step with the child's);
        pythonpath: extra import paths of the child (where a spec's class lives)."""
        self.rotations = list(rotations)
        parent_in, child_out = os.pipe()
        child_in, parent_out = os.pipe()
        env = dict(os.environ)
        if pythonpath:
            env["PYTHONPATH"] = os.pathsep.join([*pythonpath, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        # main() of this module as imported (not `python -m`, whose __main__ copy would hold other classes
        # than the parent unpickles, and which a mutation check, activating by module name, cannot reach).
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(child_in), str(child_out)],
            pass_fds=(child_in, child_out), env=env, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent,
        )  # fmt: skip
        os.close(child_in)
        os.close(child_out)
        self._recv, self._send = Connection(parent_in), Connection(parent_out)  # each a pipe's one-way end
        self._lock = threading.Lock()
        self._pending: dict[int, Future] = {}
        self._ids = itertools.count(1)
        self._gone: str | None = None
        self._reader = threading.Thread(target=self._read, name="rollout-process-reader", daemon=True)
        self._reader.start()
        # Pickled here and unpickled by the child's start(): a spec that does not unpickle there is an error
        # reply, not a child dead in its receive loop.
        self._call("start", pickle.dumps(spec)).result()

    @classmethod
    def for_run(cls, rollouts, gate: VersionGate) -> RolloutProcess:
        """The rollout process of a run's Rollouts (see RolloutsSpec.of), in step with their rotations."""
        spec = RolloutsSpec.of(rollouts, gate)
        proc = cls(spec, [gate.engine.rotation, rollouts.sandboxes.rotation])
        # stderr is line-buffered (Python >= 3.9, redirected too): the line is in the run's log at once.
        print(f"rollouts: async mode: the RL rollouts run in process {proc.proc.pid}", file=sys.stderr)
        return proc

    def _call(self, op: str, *args) -> Future:
        fut: Future = Future()
        with self._lock:
            if self._gone is not None:
                raise RolloutProcessError(self._gone)
            n = next(self._ids)
            self._pending[n] = fut
            self._send.send((op, n, args))
        return fut

    def _read(self) -> None:
        """Replies -> the futures of their requests; the child gone, or a reply that cannot be read (the child is
        then stopped) -> every request left fails."""
        try:
            while True:
                n, ok, value, dead = self._recv.recv()
                drop_dead(self.rotations, dead)
                with self._lock:
                    fut = self._pending.pop(n)
                fut.set_result(value) if ok else fut.set_exception(value)
        except (EOFError, OSError):
            code = self.proc.wait()
            why = (
                f"the rollout process (pid {self.proc.pid}) exited with status {code} (its output is in this run's "
                "log; a negative status is the signal that killed it, e.g. -9 by the OOM killer)"
            )
        except Exception as e:  # noqa: BLE001 - e.g. a reply that does not unpickle here
            self.proc.kill()
            self.proc.wait()
            why = f"a reply of the rollout process (pid {self.proc.pid}) could not be read ({e!r}); it was stopped"
        with self._lock:
            self._gone = f"{why}: the unit is not committed; rerun to resume"
            left, self._pending = list(self._pending.values()), {}
        for fut in left:
            fut.set_exception(RolloutProcessError(self._gone))

    def roll(self, *args) -> Any:
        """worker.roll(*args) in the child, after the rolls asked before; its result (its error raised here)."""
        return self._call("roll", *args).result()

    def pause(self) -> None:
        """Hold back the child's new turns (episodes) and wait for those in flight (a weight sync follows)."""
        self._call("pause", dead_of(self.rotations)).result()

    def resume(self, version: int | None) -> None:
        """Let the child's turns run again, on `version` (None: the update failed), without the servers the
        sync dropped."""
        self._call("resume", version, dead_of(self.rotations)).result()

    def close(self, reason: str | None = None) -> None:
        """Stop the child: with a reason, its turns in flight are refused with it; it exits once its unit
        returns."""
        with contextlib.suppress(RolloutProcessError):  # already gone
            self._call("close", reason).result()
        self._send.close()
        self.proc.wait()
        self._reader.join()


def _serve(recv: Connection, send: Connection) -> None:
    """The child: requests in order; rolls on one work thread, the rest on this one."""
    lock = threading.Lock()
    worker: Worker | None = None
    work = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollout-unit")

    def reply(n: int, ok: bool, value: Any) -> None:
        dead = dead_of(worker.rotations) if worker is not None else {}
        if not ok:
            where = (
                f"in the rollout process (pid {os.getpid()}):\n{''.join(traceback.format_exception(value))}"
            )
            try:
                value.add_note(where)
                pickle.dumps(value)
            except Exception:  # noqa: BLE001 - an error that does not pickle goes back as its text
                value = RolloutProcessError(f"{value!r} {where}")
        with lock:
            send.send((n, ok, value, dead))

    def run(n: int, fn, *args) -> None:
        try:
            value = fn(*args)
        except BaseException as e:  # noqa: BLE001 - every error goes back to the caller
            reply(n, False, e)
        else:
            reply(n, True, value)

    def pause(dead: Dead) -> None:
        drop_dead(worker.rotations, dead)
        worker.gate.pause()

    def resume(version: int | None, dead: Dead) -> None:
        drop_dead(worker.rotations, dead)
        worker.gate.resume(version)

    def start(spec: bytes) -> None:
        nonlocal worker
        worker = pickle.loads(spec).build()

    while True:
        try:
            op, n, args = recv.recv()
        except EOFError:  # the parent closed its end without a close request: stop what runs
            op, n, args = "close", None, ("rollouts cancelled: the trainer's process is gone",)
        if op == "roll":
            work.submit(run, n, worker.roll, *args)
        elif op == "close":
            if worker is not None and args[0] is not None:
                worker.gate.close(args[0])
            work.shutdown(wait=True)
            if worker is not None:
                worker.close()
            if n is not None:
                reply(n, True, None)
            return
        else:
            run(n, {"start": start, "pause": pause, "resume": resume}[op], *args)


def main(argv: list[str]) -> None:
    """The rollout process: serve the requests of pipe FD_IN, reply on FD_OUT (argv; started by RolloutProcess)."""
    _serve(Connection(int(argv[0])), Connection(int(argv[1])))
