"""``ReplayEngine``: the replay policy for verifiers' training client (``client.type = "train"``).

The training client renders each prompt to token IDs itself and asks an engine to sample from them
(``POST <root>/inference/v1/generate``, vLLM's route with ``--enable-scale-out`` and prime-rl's inference server).
This engine answers with the recorded rollout's next turn as the model would have written it: the turn's assistant
message (text, reasoning, tool calls) rendered to completion tokens by the same renderer the client uses, so the
client parses it back into the recorded message; a logprob of 0 per token (the recording is certain).

It answers in the reply shape of the engine it stands for (``shape``: ``reply_shapes``); a replay is one policy (the
recording), so where the shape carries weight versions its one version, ``REPLAY_WEIGHT_VERSION``, covers every
completion.

Each recorded rollout has a root of its own, ``<url>/row/<task index>``: a training client's ``base_url`` is
``endpoint_for(task)``, and a call's place in the recording is found per rollout (the ``X-Session-ID`` header the
client sends: the trace's id, so a retried episode, a new trace, starts again from the first turn) by the earlier
prompt its own continues (``RolloutNotes.turn_for``). What the engine noticed about a
rollout (a turn its renderer cannot carry, a call past the recording's end) is kept until ``take_notes`` reads it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from .._replay.recordings import REPLAY_MODEL, Recording
from .._serving import LoopThreadServer
from .completion import CompletionWriter
from .reply_shapes import GENERATE_SHAPES, GenerateShape, logprob_entries, weight_versions_key
from .turns import RecordedTurn, recorded_turns

SESSION_HEADER = "X-Session-ID"
"""verifiers' ``SESSION_ID_HEADER``: the rollout's trace id, on every generate request of its training client."""
LOGPROB = 0.0
REPLAY_WEIGHT_VERSION = "0"
"""The weight version a replay's ``vllm-0.33`` replies report: the recording is one policy."""
CACHED_TURNS = 4_096
"""Turns whose answer the engine keeps: written ahead at its start, and as asked for (a task's repeats ask for the
same turns); about 4 KB each."""


@dataclass
class RolloutNotes:
    """What the engine saw of one rollout (one trace)."""

    calls: int = 0
    prompts: list[tuple[list[int], int]] = field(default_factory=list)
    """Each call's prompt token IDs and the recorded turn it was answered with."""
    unfaithful: list[str] = field(default_factory=list)
    """Turns the renderer reads back as something else than recorded (``turn N: ...``)."""
    exhausted: bool = False
    """The rollout asked for a turn after the recording's last."""

    def turn_for(self, prompt: list[int] | None) -> int:
        """Which recorded turn answers a call with this prompt: the one after the turn of the longest earlier prompt
        it continues (that prompt is where it starts), the same turn again for the same prompt (a call sent again),
        the first for a prompt that continues none (an agent that calls the model on a context of its own, as
        langgraph's planners do, is answered as the eval's replay answers it). Without token IDs: calls in order."""
        if not prompt:
            return self.calls
        turn, longest = 0, -1
        for earlier, earlier_turn in self.prompts:
            if earlier == prompt:
                turn, longest = earlier_turn, len(prompt)
                break
            if longest < len(earlier) < len(prompt) and prompt[: len(earlier)] == earlier:
                turn, longest = earlier_turn + 1, len(earlier)
        self.prompts.append((prompt, turn))
        return turn


class ReplayEngine(LoopThreadServer):
    """A generate engine on 127.0.0.1 that plays recorded rollouts back as tokens (see the module docstring).

    ``recordings``: task index → the task's recording; ``renderer``: the ``renderers`` renderer the training
    client renders with (built from the same config and tokenizer)."""

    thread_name = "verifiers-nemo-replay-engine"

    def __init__(
        self,
        recordings: dict[int, Recording],
        renderer: Any,
        model: str = REPLAY_MODEL,
        *,
        write_ahead: int = CACHED_TURNS,
        shape: GenerateShape = "vllm-0.31",
    ) -> None:
        if shape not in GENERATE_SHAPES:
            raise ValueError(f"unknown generate reply shape {shape!r}: one of {', '.join(GENERATE_SHAPES)}")
        super().__init__("127.0.0.1", 0)
        self.model = model
        self.shape = shape
        self.write_ahead = min(write_ahead, CACHED_TURNS)
        """Turns written at start, in the background (0: each is written when first asked for)."""
        self._recordings = recordings
        self._turns: dict[int, list[RecordedTurn]] = {}
        self._writer = CompletionWriter(renderer)
        self._choices: OrderedDict[tuple[int, int, int | None], tuple[bytes, str | None, int]] = OrderedDict()
        self._writing: asyncio.Task[None] | None = None
        self.written = threading.Event()
        """Set once the turns written ahead (``on_startup``) are all written."""
        self._notes: dict[str, RolloutNotes] = {}
        self._lock = threading.Lock()
        self.requests = 0

    @classmethod
    def from_tasks(cls, tasks: Iterable[Any], renderer: Any, model: str = REPLAY_MODEL, **options: Any) -> ReplayEngine:
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
        return cls(recordings, renderer, model, **options)

    def endpoint_for(self, task_index: int) -> str:
        """The ``base_url`` of a training client that replays task ``task_index``'s recording."""
        return f"{self.url}/row/{task_index}/v1"

    def take_notes(self, session: str) -> RolloutNotes:
        """What the engine saw of the rollout whose trace id is ``session`` (forgotten once taken)."""
        with self._lock:
            return self._notes.pop(session, RolloutNotes())

    # -- serving ---------------------------------------------------------------------------------

    async def on_startup(self) -> None:
        """Write the recordings' turns ahead, in the background of this loop (a turn at a time, requests served in
        between), up to ``write_ahead``: an eval starts its engine before its Gym stacks, which take far longer."""
        self._writing = asyncio.get_running_loop().create_task(self._write_ahead())

    async def on_shutdown(self) -> None:
        if self._writing is not None:
            self._writing.cancel()

    async def _write_ahead(self) -> None:
        written = 0
        try:
            for row in self._recordings:
                turns = self._turns_of(row) or []
                for turn, recorded in enumerate(turns):
                    if written >= self.write_ahead:
                        return
                    with contextlib.suppress(ValueError):  # an unrenderable turn is said when it is asked for
                        self._choice(row, turn, recorded, None)
                    written += 1
                    await asyncio.sleep(0)
        finally:
            self.written.set()

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
            prompt = body.get("token_ids")
            turn = notes.turn_for(prompt if isinstance(prompt, list) else None)
            notes.calls += 1
            if turn >= len(turns):
                notes.exhausted = True
        if turn >= len(turns):
            return _error(409, "replay_exhausted", f"the recording has no model call after {len(turns)} (it ended)")
        try:
            choice, mismatch, _ = self._choice(row, turn, turns[turn], sampling.get("max_tokens"))
        except ValueError as exc:
            return _error(422, "replay_unrenderable", str(exc))
        if mismatch is not None:
            with self._lock:
                notes.unfaithful.append(f"turn {turn + 1}: {mismatch}")
        request_id = f"replay-{row}-{turn}-{time.monotonic_ns()}"
        body = b'{"request_id": "%s", "choices": [%s]}' % (request_id.encode(), choice)
        return web.Response(body=body, content_type="application/json")

    def _choice(
        self, row: int, turn: int, recorded: RecordedTurn, max_tokens: int | None
    ) -> tuple[bytes, str | None, int]:
        """A turn's generate choice as JSON, how the renderer reads it back, and its length in tokens; at most
        ``CACHED_TURNS`` kept (a task's repeats ask for the same turns; a whole turn serves any ``max_tokens`` it fits
        in). On this server's own loop only: its renderer is no other thread's."""
        cached = self._choices.get((row, turn, max_tokens)) or self._choices.get((row, turn, None))
        if cached is not None and (max_tokens is None or cached[2] <= max_tokens):
            return cached
        key = (row, turn, max_tokens)
        completion = self._writer.write(recorded.message, cut=recorded.cut, max_tokens=max_tokens)
        entries = logprob_entries(self.shape, completion.token_ids, LOGPROB)
        choice = (
            f'{{"index": 0, "token_ids": {json.dumps(completion.token_ids)}, "finish_reason": '
            f'"{completion.finish_reason}", "logprobs": {{"content": [{entries}]}}'
            f"{weight_versions_key(self.shape, REPLAY_WEIGHT_VERSION, len(completion.token_ids))}}}"
        )
        self._choices[key] = (choice.encode(), completion.mismatch, len(completion.token_ids))
        if len(self._choices) > CACHED_TURNS:
            self._choices.popitem(last=False)
        return self._choices[key]

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
