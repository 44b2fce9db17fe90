"""Multi-turn tool rollouts driven straight through an upstream, the way a Gym ``simple_agent`` drives the proxy:
each turn's input is the previous input, the reply's output items as they came back (training fields included)
and one ``function_call_output`` per call; the rollout ends at the first turn without a call."""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from verifiers_nemo import Endpoint
from verifiers_nemo._protocol import dumps
from verifiers_nemo._routing.trace import PolicyCall
from verifiers_nemo._upstreams.base import Upstream

DATA = Path(__file__).resolve().parents[1] / "data" / "vllm"


def weather_task(max_output_tokens: int, seed: int) -> dict[str, Any]:
    """A one-tool task in the shape of ``example_single_tool_call`` (strict schema, as Gym sends it)."""
    return {
        "model": "smol",
        "input": [{"role": "user", "content": "What is the weather in Paris? Use the tool."}],
        "tools": [
            {
                "type": "function",
                "name": "get_weather",
                "description": "Get the current weather of a city.",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string", "description": "The city."}},
                    "required": ["city"],
                    "additionalProperties": False,
                },
                "strict": True,
            }
        ],
        "tool_choice": "required",
        "max_output_tokens": max_output_tokens,
        "temperature": 1.0,
        "seed": seed,
    }


def synonyms_task(max_output_tokens: int, seed: int) -> dict[str, Any]:
    """``example_multi_step``'s first request as a real Gym rollout sent it (``tests/data/vllm/ms_resp_req.json``)."""
    body = json.loads((DATA / "ms_resp_req.json").read_text())
    body.update(model="smol", tool_choice="required", max_output_tokens=max_output_tokens, temperature=1.0, seed=seed)
    return body


TASKS = {"weather": weather_task, "synonyms": synonyms_task}


def tool_result(call: dict[str, Any], turn: int) -> str:
    if call.get("name") == "get_weather":
        return json.dumps({"city": "Paris", "weather": "sunny, 21 C"})
    if call.get("name") == "get_synonym_value":
        return json.dumps({"synonym_value": 40 + turn})
    return json.dumps({"success": True})


async def tool_rollout(
    upstream: Upstream,
    session: aiohttp.ClientSession,
    endpoint: Endpoint,
    first: dict[str, Any],
    max_turns: int,
) -> list[PolicyCall]:
    body = copy.deepcopy(first)
    calls: list[PolicyCall] = []
    for turn in range(max_turns):
        started, t0 = time.time(), time.perf_counter()
        reply = await upstream.create_response(session, endpoint, copy.deepcopy(body))
        calls.append(policy_call(turn, reply, started, time.perf_counter() - t0))
        output = reply.response["output"]
        function_calls = [item for item in output if item.get("type") == "function_call"]
        if not function_calls:
            break
        results = [
            {"type": "function_call_output", "call_id": item["call_id"], "output": tool_result(item, turn)}
            for item in function_calls
        ]
        body["input"] = [*body["input"], *copy.deepcopy(output), *results]
    return calls


class RecordingProxy:
    """A pass-through HTTP proxy on 127.0.0.1 in front of ``root`` that keeps every exchange: path, request,
    status, reply (parsed JSON) and seconds. ``endpoint(model)`` points an ``Endpoint`` at it."""

    def __init__(self, root: str, session: aiohttp.ClientSession) -> None:
        self.root = root.rstrip("/")
        self.session = session
        self.exchanges: list[dict[str, Any]] = []
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def _forward(self, request: web.Request) -> web.Response:
        body = await request.read()
        t0 = time.perf_counter()
        headers = {"Content-Type": "application/json"}
        async with self.session.post(self.root + request.path, data=body, headers=headers) as reply:
            raw = await reply.read()
            status = reply.status
        try:
            reply_data: Any = json.loads(raw)
        except ValueError:  # e.g. a plain-text 500 from the server: pass it on as it is
            reply_data = raw.decode("utf-8", errors="replace")
        self.exchanges.append(
            {
                "path": request.path,
                "request": json.loads(body),
                "status": status,
                "reply": reply_data,
                "seconds": time.perf_counter() - t0,
            }
        )
        content_type = "application/json" if not isinstance(reply_data, str) else "text/plain"
        return web.Response(status=status, body=raw, content_type=content_type)

    def endpoint(self, model: str, **options: Any) -> Endpoint:
        return Endpoint(base_url=f"http://127.0.0.1:{self.port}/v1", model=model, **options)

    async def __aenter__(self) -> RecordingProxy:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


def policy_call(turn: int, reply: Any, started: float, seconds: float) -> PolicyCall:
    """The trace entry of one answered call, as the proxy records it."""
    return PolicyCall(
        index=turn,
        status=200,
        latency_s=seconds,
        attempts=reply.attempts,
        started_at=started,
        request_json=dumps(reply.request),
        response_json=dumps(reply.response),
        upstream_status=reply.status,
        prompt_token_ids=reply.prompt_token_ids,
        completion_token_ids=reply.completion_token_ids,
        completion_logprobs=reply.completion_logprobs,
        context_overflow=reply.context_overflow,
        finish_reason=reply.finish_reason,
    )
