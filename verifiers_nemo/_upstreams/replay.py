"""The replay policy: a local Responses server that plays back an environment's recorded rollouts.

Each packaged environment ships ``data/example_rollouts.jsonl``: task inputs, the full
``response.output`` a real model produced, and the reward Gym gave it. Serving those outputs step
by step through the real stack (routing proxy, Gym agent, resources server, ``/verify``) must
reproduce each recorded reward: a check of the whole pipeline against data nobody here wrote,
with no GPU.

A step is the recorded output items from where the agent is (the outputs it already sends back)
up to the next ``function_call_output`` (which the agent produces itself by calling the tool).
Each route's endpoint names its recorded row in a header; without it, the row is found by the
request's original input and the outputs so far.

Judge calls (``judge_endpoint``: the same server under ``/judge/NAME/v1``) are answered from the
judge I/O the recordings carry (``replay_judge``), matched on what the judge is asked.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from aiohttp import web

from .._endpoint import Endpoint
from .replay_judge import JUDGE_PATH, JudgeBook, chat_completion_object, input_key, judge_calls, responses_object

logger = logging.getLogger(__name__)

ROW_HEADER = "X-Verifiers-Nemo-Replay-Row"

_NOT_SHIPPED = (
    "its recordings are of tasks that are not in any shipped dataset file, and recordings do not "
    "keep the ground truth /verify needs ({fields})"
)
KNOWN_UNREPRODUCIBLE: dict[str, str] = {
    # Measured on nemo-gym 0.4.0 over every environment the catalogue marks as needing nothing
    # beyond nemo-gym (no judge, no external service). Keyed by environment, or "env#row".
    "blackjack": "an unseeded card game: replayed actions meet different cards, so episodes differ",
    "gymnasium": "a base class for gymnasium-style servers, not a runnable environment (it exits at start)",
    "indirect_prompt_injection": _NOT_SHIPPED.format(fields="environment, injection, verifier_config"),
    "math_advanced_calculations": _NOT_SHIPPED.format(fields="ground_truth"),
    "ruler": _NOT_SHIPPED.format(fields="outputs"),
    "workplace_assistant": _NOT_SHIPPED.format(fields="ground_truth"),
    "equivalence_rule#2": (
        "the recording ends in a reasoning item with no message and no incomplete_details, so the "
        "agent asks for another step the recording does not have"
    ),
}
"""Recordings that cannot reproduce their reward from the packaged data, and why."""

_NO_JUDGE_IO = "its recordings keep no judge I/O ({what}), so the judge calls cannot be answered"
_OLD_JUDGE_PROMPT = (
    "its recorded judge requests were built from an older judge prompt than the shipped one, so no "
    "replayed judge request matches a recording"
)
JUDGE_UNREPRODUCIBLE: dict[str, str] = {
    # Measured on nemo-gym 0.4.0 over every environment whose default config needs a judge and ships
    # recordings: each recorded row's /verify run with its judge calls answered by judge_endpoint().
    "arena_judge": (
        "its recordings keep the two judgements only as texts (judgement_gen_base, judgement_base_gen), "
        "whose prompts differ only in the order of the two answers, so they are not matched"
    ),
    "finance_sec_search": _NO_JUDGE_IO.format(what="only the judge's text, and not its retrieval model's calls"),
    "gdpval": _NO_JUDGE_IO.format(what="judge_response is null"),
    "omniscience": (
        "its recordings are of tasks that are not in any shipped dataset file, and the recorded rows "
        "carry verify outputs (verdict, is_correct, ...) that its /verify rejects when sent back"
    ),
    "proof_judge": _NO_JUDGE_IO.format(what="only the response and reward"),
    "proof_verification": _NO_JUDGE_IO.format(what="only the response and reward"),
    "terminus_judge": _OLD_JUDGE_PROMPT,
    "text_to_sql": _OLD_JUDGE_PROMPT,
    "verifif": _NO_JUDGE_IO.format(what="only each validator's verdict; its judge is called by its own client"),
    "simpleqa#3": (
        "the recorded judge text ('After reviewing ..., the grade is B.') reads as grade A to the shipped "
        "parser (it takes the first letter), so the replayed reward is 1, not the recorded 0"
    ),
    "simpleqa#4": "the recorded judge text reads as grade A to the shipped parser (see simpleqa#3)",
}
"""Judge environments whose recordings cannot reproduce their reward with the judge replayed, and why."""


_UNSEEDED_LEVELS = (
    "its recordings keep no seed and match no shipped row (the dataset's {fields} are not in them), so /reset "
    "draws another level and the recorded moves run out (the replay answers 409)"
)
PACKAGES_UNREPRODUCIBLE: dict[str, str] = {
    # Measured on nemo-gym 0.4.0 over every environment that needs extra packages (and no external
    # service) and ships recordings, each replayed through the real stack with its packages installed.
    "grl_sokoban": _UNSEEDED_LEVELS.format(fields="seed, level_id"),
    "grl_tetris": _UNSEEDED_LEVELS.format(fields="seed, game_id"),
    "structured_outputs": _NOT_SHIPPED.format(fields="schema_str"),
    "scicode": "its Gym agent answers HTTP 500 from a server it calls itself on every recorded row (not investigated)",
    "math_with_judge#1": (
        "the recording says its symbolic check passed (library_reward 1.0, no judge call) on an answer with "
        "powers up to 4033; the shipped check scores the replayed answer 0 here (cause not investigated)"
    ),
}
"""Environments with extra packages whose recordings do not reproduce their reward, and why."""


def unreproducible_reason(env: str, row: int | None = None) -> str | None:
    """Why ``env`` (or one recorded row of it) cannot be replayed, if it is known not to."""
    keys = [env] if row is None else [env, f"{env}#{row}"]
    tables = (KNOWN_UNREPRODUCIBLE, JUDGE_UNREPRODUCIBLE, PACKAGES_UNREPRODUCIBLE)
    return next((known[key] for key in keys for known in tables if key in known), None)


REPLAY_MODEL = "replay"
_ZERO_USAGE = {
    "input_tokens": 0,
    "output_tokens": 0,
    "total_tokens": 0,
    "input_tokens_details": {"cached_tokens": 0},
    "output_tokens_details": {"reasoning_tokens": 0},
}


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _as_items(value: Any) -> list[Any]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    return list(value or [])


def _written_by_agent(item: dict[str, Any]) -> bool:
    """Items the Gym agent adds itself: tool results, and observations sent back as user messages."""
    return item.get("type") == "function_call_output" or (
        item.get("type", "message") == "message" and item.get("role") in ("user", "system", "developer")
    )


@dataclass(frozen=True)
class Recording:
    """One recorded rollout: the original input, the model's full output, how the last call ended."""

    input: list[Any]
    output: list[dict[str, Any]]
    incomplete_details: dict[str, Any] | None = None

    def step(self, done: int) -> tuple[list[dict[str, Any]], bool] | None:
        """The items the model produced after ``done`` output items, up to what the agent adds
        next (a tool result or an observation), and whether this is the recording's last step."""
        if done >= len(self.output):
            return None
        end = done
        while end < len(self.output) and not _written_by_agent(self.output[end]):
            end += 1
        if end == done:
            return None
        return self.output[done:end], end == len(self.output)


def _dataset_rows_by_input(paths: Iterable[Path]) -> dict[str, dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for path in paths:
        with open(path, "rb") as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    key = input_key(row["responses_create_params"]["input"])
                except (ValueError, KeyError, TypeError):
                    continue
                rows.setdefault(key, row)
    return rows


def replay_tasks(taskset: Any) -> list[Any]:
    """The tasks of a replay run: the recorded rows, with what ``/verify`` needs put back.

    Recordings store what ``/verify`` returned, which often lacks the task's ground-truth fields
    and adds verify outputs that some servers reject when sent back. When the environment's own
    dataset files hold a row with the same input, that row's fields are the task (the recorded
    input and output are kept); otherwise the recorded row is used without its outputs.
    """
    env = taskset.env
    paths = [d.path for d in (env.datasets if env else ()) if d.exists]
    originals = _dataset_rows_by_input(paths)
    tasks = []
    for task in taskset:
        original = originals.get(input_key(task.row["responses_create_params"].get("input")))
        if original is None:
            tasks.append(task)
            continue
        row = {key: value for key, value in original.items() if key != "responses_create_params"}
        row["responses_create_params"] = task.row["responses_create_params"]
        for key in ("response", "reward", "agent_ref"):
            if key in task.row:
                row[key] = task.row[key]
        tasks.append(dataclasses.replace(task, row=row, recorded_row=task.row))
    return tasks


class ReplayUpstream:
    """A Responses-API server on 127.0.0.1 serving recorded outputs; its own thread and loop."""

    def __init__(self, recordings: list[Recording], judge: JudgeBook | None = None) -> None:
        self.recordings = recordings
        self.judge = judge or JudgeBook(())
        self._by_input: dict[str, list[int]] = {}
        for index, recording in enumerate(recordings):
            self._by_input.setdefault(_canonical(recording.input), []).append(index)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._port: int | None = None
        self.requests = 0
        self.judge_requests = 0
        self._row_of_task: dict[int, int] = {}

    @classmethod
    def from_tasks(cls, tasks: list[Any]) -> ReplayUpstream:
        """From recorded tasks (``NeMoGymTaskset(recorded=True)``); one recording per task index,
        with the judge calls each recorded."""
        recordings: dict[int, Recording] = {}
        calls = []
        for task in tasks:
            if task.task_index in recordings:
                continue
            calls.extend(judge_calls(task.recorded_row or task.row))
            response = task.recorded_response or {}
            recordings[task.task_index] = Recording(
                input=_as_items(task.row["responses_create_params"].get("input")),
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

    @property
    def url(self) -> str:
        if self._port is None:
            raise RuntimeError("ReplayUpstream is not started")
        return f"http://127.0.0.1:{self._port}"

    # -- serving ---------------------------------------------------------------------------------

    def _find(self, request: web.Request, body: dict[str, Any]) -> tuple[Recording, int] | None:
        items = _as_items(body.get("input"))
        header = request.headers.get(ROW_HEADER)
        if header is not None and header.isdigit() and int(header) < len(self.recordings):
            recording = self.recordings[int(header)]
            return recording, max(0, len(items) - len(recording.input))
        for size in range(len(items), -1, -1):
            for index in self._by_input.get(_canonical(items[:size]), []):
                recording = self.recordings[index]
                done = len(items) - size
                if _canonical(items[size:]) == _canonical(recording.output[:done]) or done == 0:
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
                "usage": _ZERO_USAGE,
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

    def start(self) -> ReplayUpstream:
        if self._thread is not None:
            return self
        ready = threading.Event()
        errors: list[BaseException] = []

        def serve() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            try:
                app = web.Application(client_max_size=256 * 1024 * 1024)
                app.router.add_post("/v1/responses", self._responses)
                app.router.add_get("/v1/models", self._models)
                judge = JUDGE_PATH.format(name="{name}")
                app.router.add_post(f"{judge}/responses", self._judge_responses)
                app.router.add_post(f"{judge}/chat/completions", self._judge_chat)
                app.router.add_get(f"{judge}/models", self._models)
                app.router.add_get("/", self._health)
                self._runner = web.AppRunner(app, access_log=None)
                loop.run_until_complete(self._runner.setup())
                site = web.TCPSite(self._runner, "127.0.0.1", 0)
                loop.run_until_complete(site.start())
                self._port = self._runner.addresses[0][1]
            except BaseException as exc:  # surfaced to start()'s caller
                errors.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=serve, name="replay-upstream", daemon=True)
        self._thread.start()
        ready.wait()
        if errors:
            raise errors[0]
        return self

    def stop(self) -> None:
        if self._thread is None or self._loop is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._thread = None

    def __enter__(self) -> ReplayUpstream:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
