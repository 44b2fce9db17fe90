"""``ReplayEngine``: the replay policy for verifiers' training client (``client.type = "train"``).

The training client renders each prompt to token IDs itself and asks an engine to sample from them
(``POST <root>/inference/v1/generate``, vLLM's route with ``--enable-scale-out`` and prime-rl's inference server).
This engine answers with the recorded rollout's next turn as the model would have written it: the turn's assistant
message (text, reasoning, tool calls) rendered to completion tokens by the same renderer the client uses, so the
client parses it back into the recorded message; a logprob of 0 per token (the recording is certain).

Each recorded rollout has a root of its own, ``<url>/row/<task index>``: a training client's ``base_url`` is
``endpoint_for(task)``, and its turns are counted per rollout by the ``X-Session-ID`` header the client sends (the
trace's id), so a retried episode (a new trace) starts again from the first turn. What the engine noticed about a
rollout (a turn its renderer cannot carry, a call past the recording's end) is kept until ``take_notes`` reads it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from .._replay.recordings import REPLAY_MODEL, Recording
from .._serving import LoopThreadServer
from .completion import CompletionWriter
from .turns import RecordedTurn, recorded_turns

SESSION_HEADER = "X-Session-ID"
"""verifiers' ``SESSION_ID_HEADER``: the rollout's trace id, on every generate request of its training client."""
LOGPROB = 0.0


@dataclass
class RolloutNotes:
    """What the engine saw of one rollout (one trace)."""

    calls: int = 0
    unfaithful: list[str] = field(default_factory=list)
    """Turns the renderer reads back as something else than recorded (``turn N: ...``)."""
    exhausted: bool = False
    """The rollout asked for a turn after the recording's last."""


class ReplayEngine(LoopThreadServer):
    """A generate engine on 127.0.0.1 that plays recorded rollouts back as tokens (see the module docstring).

    ``recordings``: task index → the task's recording; ``renderer``: the ``renderers`` renderer the training
    client renders with (built from the same config and tokenizer)."""

    thread_name = "verifiers-nemo-replay-engine"

    def __init__(self, recordings: dict[int, Recording], renderer: Any, model: str = REPLAY_MODEL) -> None:
        super().__init__("127.0.0.1", 0)
        self.model = model
        self._recordings = recordings
        self._turns: dict[int, list[RecordedTurn]] = {}
        self._writer = CompletionWriter(renderer)
        self._notes: dict[str, RolloutNotes] = {}
        self._lock = threading.Lock()
        self.requests = 0

    @classmethod
    def from_tasks(cls, tasks: Iterable[Any], renderer: Any, model: str = REPLAY_MODEL) -> ReplayEngine:
        """From recorded tasks (``NeMoGymTaskset(recorded=True)`` rows): one recording per task index."""
        recordings: dict[int, Recording] = {}
        for task in tasks:
            if task.task_index not in recordings:
                response = task.recorded_response or {}
                recordings[task.task_index] = Recording(
                    input=list(task.row["responses_create_params"].get("input") or []),
                    output=list(response.get("output") or []),
                    incomplete_details=response.get("incomplete_details"),
                )
        return cls(recordings, renderer, model)

    def endpoint_for(self, task_index: int) -> str:
        """The ``base_url`` of a training client that replays task ``task_index``'s recording."""
        return f"{self.url}/row/{task_index}/v1"

    def take_notes(self, session: str) -> RolloutNotes:
        """What the engine saw of the rollout whose trace id is ``session`` (forgotten once taken)."""
        with self._lock:
            return self._notes.pop(session, RolloutNotes())

    # -- serving ---------------------------------------------------------------------------------

    def _turns_of(self, row: int) -> list[RecordedTurn] | None:
        if row not in self._turns:
            recording = self._recordings.get(row)
            if recording is None:
                return None
            self._turns[row] = recorded_turns(recording)
        return self._turns[row]

    async def _generate(self, request: web.Request) -> web.Response:
        self.requests += 1
        row = int(request.match_info["row"])
        session = request.headers.get(SESSION_HEADER)
        if not session:
            return _error(400, "replay_no_session", f"a generate request without {SESSION_HEADER} (the rollout's id)")
        turns = self._turns_of(row)
        if turns is None:
            return _error(404, "replay_unknown_row", f"no recorded rollout has task index {row}")
        body = await request.json()
        sampling = body.get("sampling_params") or {}
        with self._lock:
            notes = self._notes.setdefault(session, RolloutNotes())
            turn = notes.calls
            notes.calls += 1
            if turn >= len(turns):
                notes.exhausted = True
        if turn >= len(turns):
            return _error(409, "replay_exhausted", f"the recording has no model call after {len(turns)} (it ended)")
        try:
            # On this server's own loop: the renderer's tokenizer is not shared with any other thread.
            completion = self._writer.write(
                turns[turn].message, cut=turns[turn].cut, max_tokens=sampling.get("max_tokens")
            )
        except ValueError as exc:
            return _error(422, "replay_unrenderable", str(exc))
        if completion.mismatch is not None:
            with self._lock:
                notes.unfaithful.append(f"turn {turn + 1}: {completion.mismatch}")
        ids = completion.token_ids
        choice = {
            "index": 0,
            "token_ids": ids,
            "finish_reason": completion.finish_reason,
            "logprobs": {"content": [{"token": f"token_id:{t}", "logprob": LOGPROB} for t in ids]},
        }
        return web.json_response({"request_id": f"replay-{row}-{turn}-{time.monotonic_ns()}", "choices": [choice]})

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.model, "object": "model"}]})

    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.router.add_post("/row/{row:\\d+}/inference/v1/generate", self._generate)
        app.router.add_get("/row/{row:\\d+}/v1/models", self._models)
        app.router.add_get("/v1/models", self._models)
        return app


def _error(status: int, kind: str, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind}}, status=status)
