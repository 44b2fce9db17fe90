"""``ReplayServer``: the replay policy as a local Responses server (recorded outputs step by step)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote

from aiohttp import web

from .._endpoint import Endpoint
from .._serving import LoopThreadServer
from .._tasks.recorded import input_key
from .judge_book import JUDGE_PATH, JudgeBook, chat_completion_object, judge_calls, responses_object
from .recordings import REPLAY_MODEL, ROW_HEADER, ZERO_USAGE, Recording, as_items, written_by_agent


class ReplayServer(LoopThreadServer):
    """The replay policy: a Responses-API server on 127.0.0.1 serving recorded outputs step by step (and
    the recorded judge answers under ``/judge/NAME/v1``), on its own thread and loop.

    Point an endpoint at it (``endpoint_for(task)``, ``judge_endpoint(name)``); it is a server, not an
    ``Upstream``: the proxy reaches it over HTTP like any inference server. A request that does not name its
    recording (``endpoint_for``'s header) is matched on its original input, recorded nulls and ``type: message``
    aside (a dataset row's input is its recording's without them), and on the model outputs it already holds (the
    tool results between them are the agent's own, serialised its own way)."""

    thread_name = "verifiers-nemo-replay"

    def __init__(self, recordings: list[Recording], judge: JudgeBook | None = None) -> None:
        super().__init__("127.0.0.1", 0)
        self.recordings = recordings
        self.judge = judge or JudgeBook(())
        self._by_input: dict[str, list[int]] = {}
        for index, recording in enumerate(recordings):
            self._by_input.setdefault(input_key(recording.input), []).append(index)
        self.requests = 0
        self.judge_requests = 0
        self._row_of_task: dict[int, int] = {}

    @classmethod
    def from_tasks(cls, tasks: Iterable[Any]) -> ReplayServer:
        """From recorded tasks: a ``NeMoGymTaskset(recorded=True)``, or tasks of one; one recording per task
        index, with the judge calls each recorded."""
        recordings: dict[int, Recording] = {}
        calls = []
        for task in tasks:
            if task.task_index in recordings:
                continue
            calls.extend(judge_calls(task.recorded_row or task.row))
            response = task.recorded_response or {}
            recordings[task.task_index] = Recording(
                input=as_items(task.row["responses_create_params"].get("input")),
                output=list(response.get("output") or []),
                incomplete_details=response.get("incomplete_details"),
            )
        ordered = sorted(recordings)
        replay = cls([recordings[i] for i in ordered], JudgeBook(calls))
        replay._row_of_task = {task_index: row for row, task_index in enumerate(ordered)}
        return replay

    def endpoint_for(self, task: Any) -> Endpoint:
        """The endpoint that replays ``task``'s recording."""
        index = self._row_of_task.get(task.task_index, task.task_index)
        return Endpoint(
            base_url=f"{self.url}/v1",
            model=REPLAY_MODEL,
            api="responses",
            extra_headers={ROW_HEADER: str(index)},
            name=f"replay#{index}",
        )

    def judge_endpoint(self, name: str = "judge") -> Endpoint:
        """The endpoint that answers judge calls from the recorded judge I/O (``name`` labels it).

        It reaches this server under ``/judge/NAME/v1``, apart from policy calls; a judge request no
        recording has is refused with 404 ``replay_unknown_judge_input``.
        """
        return Endpoint(
            base_url=self.url + JUDGE_PATH.format(name=quote(name, safe="")),
            model=REPLAY_MODEL,
            api="responses",
            name=f"replay-judge:{name}",
        )

    # -- serving ---------------------------------------------------------------------------------

    def _find(self, request: web.Request, body: dict[str, Any]) -> tuple[Recording, int] | None:
        items = as_items(body.get("input"))
        header = request.headers.get(ROW_HEADER)
        if header is not None and header.isdigit() and int(header) < len(self.recordings):
            recording = self.recordings[int(header)]
            return recording, max(0, len(items) - len(recording.input))
        for size in range(len(items), -1, -1):
            for index in self._by_input.get(input_key(items[:size]), []):
                recording = self.recordings[index]
                done = len(items) - size
                if done == 0 or _model_items(items[size:]) == _model_items(recording.output[:done]):
                    return recording, done
        return None

    async def _responses(self, request: web.Request) -> web.Response:
        self.requests += 1
        body = await request.json()
        found = self._find(request, body)
        if found is None:
            return web.json_response(
                {"error": {"message": "no recorded rollout has this input", "type": "replay_unknown_input"}},
                status=404,
            )
        recording, done = found
        found_step = recording.step(done)
        if found_step is None:
            return web.json_response(
                {
                    "error": {
                        "message": f"the recording has no output after {done} items (it ended)",
                        "type": "replay_exhausted",
                    }
                },
                status=409,
            )
        step, last = found_step
        incomplete = recording.incomplete_details if last else None
        return web.json_response(
            {
                "id": f"resp_replay_{id(recording):x}_{done}",
                "object": "response",
                "created_at": int(time.time()),
                "model": body.get("model") or REPLAY_MODEL,
                "status": "incomplete" if incomplete else "completed",
                "incomplete_details": incomplete,
                "output": step,
                "parallel_tool_calls": body.get("parallel_tool_calls", True),
                "tool_choice": body.get("tool_choice", "auto"),
                "tools": body.get("tools") or [],
                "usage": ZERO_USAGE,
            }
        )

    def _judge_answer(self, request: web.Request, items: Any) -> tuple[str, dict[str, Any] | None] | web.Response:
        self.judge_requests += 1
        call = self.judge.find(items)
        if call is None:
            name = request.match_info["name"]
            message = f"judge request (judge {name!r}) that no recording has: no recorded judge call was asked this"
            return web.json_response({"error": {"message": message, "type": "replay_unknown_judge_input"}}, status=404)
        return call.text, call.response

    async def _judge_responses(self, request: web.Request) -> web.Response:
        body = await request.json()
        answer = self._judge_answer(request, body.get("input"))
        if isinstance(answer, web.Response):
            return answer
        text, response = answer
        return web.json_response(response or responses_object(text, body.get("model") or REPLAY_MODEL))

    async def _judge_chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        answer = self._judge_answer(request, body.get("messages"))
        if isinstance(answer, web.Response):
            return answer
        return web.json_response(chat_completion_object(answer[0], body.get("model") or REPLAY_MODEL))

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": REPLAY_MODEL, "object": "model"}]})

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    # -- lifecycle -------------------------------------------------------------------------------

    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_get("/v1/models", self._models)
        judge = JUDGE_PATH.format(name="{name}")
        app.router.add_post(f"{judge}/responses", self._judge_responses)
        app.router.add_post(f"{judge}/chat/completions", self._judge_chat)
        app.router.add_get(f"{judge}/models", self._models)
        app.router.add_get("/", self._health)
        return app


def _model_items(items: list[Any]) -> str:
    """The items a model produced, canonical (what tells two recordings with one input apart)."""
    return input_key([item for item in items if not (isinstance(item, dict) and written_by_agent(item))])
