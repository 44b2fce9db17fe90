"""Scripted policies for end-to-end tests: local Responses-API servers whose answer is a function of
the conversation, so any number of concurrent rollouts can share one server."""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

Handler = Callable[[dict[str, Any], web.Request], Awaitable[Any]]


def message(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": f"msg_{uuid.uuid4().hex}",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def function_call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": f"fc_{uuid.uuid4().hex}",
        "call_id": f"call_{uuid.uuid4().hex}",
        "name": name,
        "arguments": json.dumps(arguments),
        "status": "completed",
    }


def response(body: dict[str, Any], output: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": f"resp_{uuid.uuid4().hex}",
        "object": "response",
        "created_at": time.time(),
        "model": body.get("model"),
        "status": "completed",
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": body.get("tools") or [],
        "usage": {
            "input_tokens": 10,
            "output_tokens": 5,
            "total_tokens": 15,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    }


class LocalServer:
    """An aiohttp server on 127.0.0.1 (a free port) on the test's event loop; subclasses add routes."""

    port = 0
    _runner: web.AppRunner | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def add_routes(self, app: web.Application) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Any:
        app = web.Application()
        self.add_routes(app)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


class PolicyServer(LocalServer):
    """An aiohttp Responses server on 127.0.0.1 (runs on the test's event loop)."""

    def __init__(self, handler: Handler, name: str = "policy") -> None:
        self.handler = handler
        self.name = name
        self.calls = 0
        self.authorizations: set[str] = set()

    async def _respond(self, request: web.Request) -> web.StreamResponse:
        self.calls += 1
        self.authorizations.add(request.headers.get("Authorization", ""))
        body = await request.json()
        answer = await self.handler(body, request)
        if isinstance(answer, web.StreamResponse):
            return answer
        return web.json_response(response(body, answer))

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/responses", self._respond)


def user_text(body: dict[str, Any]) -> str:
    items = body["input"] if isinstance(body["input"], list) else [{"role": "user", "content": body["input"]}]
    return next(i["content"] for i in items if i.get("role") == "user" and isinstance(i.get("content"), str))


def tool_results(body: dict[str, Any]) -> list[str]:
    items = body["input"] if isinstance(body["input"], list) else []
    return [i["output"] for i in items if isinstance(i, dict) and i.get("type") == "function_call_output"]


async def counter_policy(body: dict[str, Any], request: web.Request) -> list[dict[str, Any]]:
    """Solves example_session_state_mgmt rows 'add A then add B then get the count' with tools."""
    a, b = (int(x) for x in re.findall(r"add (\d+)", user_text(body)))
    done = tool_results(body)
    if len(done) == 0:
        return [function_call("increment_counter", {"count": a})]
    if len(done) == 1:
        return [function_call("increment_counter", {"count": b})]
    if len(done) == 2:
        return [function_call("get_counter_value", {})]
    return [message(f"The count is {json.loads(done[2])['count']}.")]


async def hang_forever(body: dict[str, Any], request: web.Request) -> Any:
    await asyncio.sleep(3600)
    return []


# -- a policy that speaks both APIs ----------------------------------------------------------------

Decision = tuple[str, str, dict[str, Any]]
"""``("call", tool_name, arguments)`` or ``("say", text, {})``."""


def synonym_policy(user: str, system: str, tool_outputs: list[str]) -> Decision:
    """Deterministic and right on some rows of example_multi_step only: look up 'Blazing', and 'Warm'
    too when the user's question has an even length, extract those values, then stop. Rows whose
    expected values are both (the first five are) get reward 1 or 0 and set_overlap 1 or 0.5, in
    three or four model calls."""
    wanted = ["Blazing", "Warm"] if len(user) % 2 == 0 else ["Blazing"]
    if len(tool_outputs) < len(wanted):
        return ("call", "get_synonym_value", {"synonym": wanted[len(tool_outputs)]})
    if len(tool_outputs) == len(wanted):
        values = [json.loads(output)["synonym_value"] for output in tool_outputs]
        return ("call", "extract_synonym_values", {"synonym_values": values})
    return ("say", "Done.", {})


def _texts(content: Any) -> str:
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


class DualApiPolicy(LocalServer):
    """A local server answering ``/v1/responses`` and ``/v1/chat/completions`` with ``decide``'s
    choice, a function of the conversation, so any number of concurrent rollouts can share it.

    ``calls`` records, per request, the API, the Authorization header and the user prompt it carried
    (to tell which rollout a call belonged to)."""

    def __init__(self, decide: Callable[[str, str, list[str]], Decision] = synonym_policy) -> None:
        self.decide = decide
        self.calls: list[dict[str, Any]] = []

    def _record(self, api: str, request: web.Request, user: str) -> None:
        self.calls.append({"api": api, "authorization": request.headers.get("Authorization", ""), "user": user})

    async def _responses(self, request: web.Request) -> web.Response:
        body = await request.json()
        items = body["input"] if isinstance(body["input"], list) else [{"role": "user", "content": body["input"]}]
        roles = {"user": [], "system": []}
        for item in items:
            role = item.get("role")
            if role in ("system", "developer"):
                roles["system"].append(_texts(item.get("content")))
            elif role == "user":
                roles["user"].append(_texts(item.get("content")))
        outputs = [i["output"] for i in items if i.get("type") == "function_call_output"]
        user, system = "\n".join(roles["user"]), "\n".join(roles["system"])
        self._record("responses", request, user)
        kind, what, arguments = self.decide(user, system, outputs)
        item = function_call(what, arguments) if kind == "call" else message(what)
        answer = response(body, [item])
        answer["created_at"] = int(answer["created_at"])
        return web.json_response(answer)

    async def _chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        messages = body["messages"]
        user = "\n".join(_texts(m.get("content")) for m in messages if m.get("role") == "user")
        system = "\n".join(_texts(m.get("content")) for m in messages if m.get("role") in ("system", "developer"))
        outputs = [_texts(m.get("content")) for m in messages if m.get("role") == "tool"]
        self._record("chat", request, user)
        kind, what, arguments = self.decide(user, system, outputs)
        if kind == "call":
            reply = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{uuid.uuid4().hex[:12]}",
                        "type": "function",
                        "function": {"name": what, "arguments": json.dumps(arguments)},
                    }
                ],
            }
            finish = "tool_calls"
        else:
            reply, finish = {"role": "assistant", "content": what}, "stop"
        return web.json_response(
            {
                "id": f"chatcmpl-{uuid.uuid4().hex}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model"),
                "choices": [{"index": 0, "message": reply, "finish_reason": finish}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
            }
        )

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
