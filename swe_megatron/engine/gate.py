"""The run's engine behind a gate that weight updates close, and the weight version of every turn.

With asynchronous RL (algo.max_staleness >= 1) the next iteration's episodes run while the trainer updates, so
an update can land mid-episode. `VersionGate.pause()` waits for the generations in flight and holds new
ones back until `resume(version)` says the engines serve `version`: an update never lands mid-turn, and every
Generation says which version sampled it (`policy_version`). With agent.partial_rollouts=false the gate is held per
episode instead of per turn: an update waits for the episodes in flight to end, and the episodes it holds back
start on the new weights, so each episode is sampled by one version.
"""

from __future__ import annotations

import threading

from swe_megatron.engine.base import Engine, EngineError, Generation


class VersionGate:
    """An Engine that forwards to `engine` and tags each generation with the weight version it was sampled by."""

    def __init__(self, engine: Engine | None = None, version: int = 0, per_episode: bool = False):
        self.engine = engine
        """The engine behind the gate (e.g. the run's RoutedEngine; None until `serve`)."""
        self.version = version
        """The weight version the engines serve now."""
        self.per_episode = per_episode
        """Hold the gate for a whole episode (agent.partial_rollouts=false) rather than for one turn."""
        self._cv = threading.Condition()
        self._holders = 0  # turns (or episodes) in flight
        self._sessions: set[str] = set()  # episodes holding the gate (per_episode)
        self._updating = False
        self._waiting_updates = 0
        self._closed: str | None = None

    @property
    def rotation(self):
        """The engine's server rotation, if it has one (routing.check_servers reads it)."""
        return getattr(self.engine, "rotation", None)

    def _enter(self) -> int:
        """Wait until no update runs or waits (updates go first), then hold the gate; the version held."""
        while (self._updating or self._waiting_updates) and self._closed is None:
            self._cv.wait()
        if self._closed is not None:
            raise EngineError(self._closed)
        self._holders += 1
        return self.version

    def _leave(self) -> None:
        self._holders -= 1
        self._cv.notify_all()

    def generate(self, prompt_ids: list[int], max_tokens: int, session: str = "") -> Generation:
        """One turn, never while weights change; its Generation carries the version that sampled it."""
        episode = self.per_episode and bool(session)
        with self._cv:
            if episode and session in self._sessions:
                if self._closed is not None:
                    raise EngineError(self._closed)
                version = self.version
            else:
                version = self._enter()
                if episode:
                    self._sessions.add(session)
        try:
            gen = self.engine.generate(prompt_ids, max_tokens, session)
        finally:
            if not episode:
                with self._cv:
                    self._leave()
        gen.policy_version = version
        return gen

    def end_session(self, session: str) -> None:
        """The episode ended: release its hold (per_episode) and its server slot."""
        with self._cv:
            if session in self._sessions:
                self._sessions.discard(session)
                self._leave()
        self.engine.end_session(session)

    def reload_weights(self, path: str) -> None:
        """Load new weights into every server (call it between pause and resume)."""
        self.engine.reload_weights(path)

    def serve(self, engine: Engine, version: int) -> VersionGate:
        """Put `engine`, serving the weights of `version`, behind the gate; returns the gate."""
        self.engine, self.version = engine, version
        return self

    def pause(self) -> None:
        """Hold back new turns (episodes) and wait for those in flight: the weights may change after this."""
        with self._cv:
            self._waiting_updates += 1
            try:
                while self._holders or self._updating:
                    self._cv.wait()
            finally:
                self._waiting_updates -= 1
            self._updating = True

    def resume(self, version: int | None) -> None:
        """Let turns run again, on `version` (None: the update failed; the version stays)."""
        with self._cv:
            if version is not None:
                self.version = version
            self._updating = False
            self._cv.notify_all()

    def close(self, reason: str) -> None:
        """Refuse every later turn with EngineError(reason) (the run is stopping: episodes in flight end)."""
        with self._cv:
            self._closed = reason
            self._cv.notify_all()
