"""A scriptable fake OpenAI-compatible inference server for tests (and ``Frozen``, one that accepts connections and
never answers: a hung engine).

``FakeUpstream`` is an aiohttp server on 127.0.0.1 (a free port) that speaks ``POST /v1/responses``
and ``POST /v1/chat/completions`` (plus ``GET /v1/models``). Typical use::

    async with FakeUpstream("u0") as fake:
        endpoint = Endpoint(base_url=fake.base_url, model="m0", api_key="sk-0")
        fake.script(FakeReply.error(503, times=2), FakeReply.say("hello"))
        ...
        assert fake.requests[-1].authorization == "Bearer sk-0"

With nothing scripted it answers *as itself*: the assistant text is the JSON object
``{"upstream": <name>, "model": <model it received>, "authorization": <Authorization header>,
"api": "responses"|"chat", "call": <n>}``, so a test can tell which server, model and key a call
reached. Scripted replies (``FakeReply``) are consumed in order, each answering ``times`` requests:
text, tool calls, reasoning, HTTP errors, a hang (until the server closes), garbage JSON, any raw
JSON, or a connection reset in the middle of the body. ``gzip=True`` compresses every answer.

With ``token_ids=True`` chat answers carry vLLM-style token data when the request asks for it
(``logprobs: true`` → ``choices[0].logprobs.content``; ``return_token_ids: true`` → top-level
``prompt_token_ids`` and ``choices[0].token_ids``), computed by a toy tokenizer (one token per
character of a rendered transcript, see ``render_prompt``) whose prompts of consecutive calls are
contiguous exactly when the conversation is carried over faithfully.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip as gzip_module
import json
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web

ReplyKind = Literal["reply", "error", "hang", "garbage", "json", "reset"]


@dataclass(frozen=True)
class FakeReply:
    """One scripted answer; build it with the class methods. ``times`` is how many requests it
    answers before the next one in the script takes over."""

    kind: ReplyKind
    text: str | None = None
    reasoning: str | None = None
    tool_calls: tuple[tuple[str, str], ...] = ()
    finish_reason: str = "stop"
    status: int = 200
    payload: Any = None
    headers: tuple[tuple[str, str], ...] = ()
    times: int = 1

    @classmethod
    def say(cls, text: str, *, reasoning: str | None = None, finish_reason: str = "stop", times: int = 1) -> FakeReply:
        """An assistant message (with optional reasoning)."""
        return cls("reply", text=text, reasoning=reasoning, finish_reason=finish_reason, times=times)

    @classmethod
    def call_tools(
        cls,
        *calls: tuple[str, dict[str, Any]],
        text: str | None = None,
        reasoning: str | None = None,
        times: int = 1,
    ) -> FakeReply:
        """One or more function calls ``(name, arguments)``, optionally with text and reasoning."""
        encoded = tuple((name, json.dumps(args)) for name, args in calls)
        return cls("reply", text=text, reasoning=reasoning, tool_calls=encoded, times=times)

    @classmethod
    def error(
        cls,
        status: int = 503,
        message: str = "overloaded",
        *,
        retry_after: float | None = None,
        times: int = 1,
    ) -> FakeReply:
        """An OpenAI-style JSON error with ``status``."""
        headers = (("Retry-After", str(retry_after)),) if retry_after is not None else ()
        payload = {"error": {"message": message, "type": "fake_error", "code": status}}
        return cls("error", status=status, payload=payload, headers=headers, times=times)

    @classmethod
    def hang(cls, times: int = 1) -> FakeReply:
        """Never answer (until the server closes)."""
        return cls("hang", times=times)

    @classmethod
    def garbage(cls, times: int = 1) -> FakeReply:
        """HTTP 200 with a body that is not JSON."""
        return cls("garbage", times=times)

    @classmethod
    def json(cls, payload: Any, status: int = 200, times: int = 1) -> FakeReply:
        """Exactly this JSON body (e.g. a schema-invalid reply)."""
        return cls("json", payload=payload, status=status, times=times)

    @classmethod
    def reset(cls, times: int = 1) -> FakeReply:
        """Start a 200 answer, then drop the connection in the middle of the body."""
        return cls("reset", times=times)


@dataclass
class ReceivedRequest:
    """A request the fake received."""

    path: str
    headers: dict[str, str]
    body: Any

    @property
    def authorization(self) -> str | None:
        return self.headers.get("Authorization")


@dataclass
class _Slot:
    reply: FakeReply
    left: int = field(default=0)


def render_message(message: dict[str, Any]) -> str:
    """The toy chat template for one message (the assistant's body starts after ``<assistant>``)."""
    return f"<{message['role']}>" + render_body(message)


def render_body(message: dict[str, Any]) -> str:
    out = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if reasoning:
        out.append(f"<think>{reasoning}</think>")
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(part.get("text", "") for part in content)
    if content:
        out.append(content)
    for call in message.get("tool_calls") or ():
        out.append(f"<call {call['function']['name']}>{call['function']['arguments']}</call>")
    out.append("</>")
    return "".join(out)


def render_prompt(messages: list[dict[str, Any]]) -> str:
    """The toy prompt: every message rendered, then the generation prompt ``<assistant>``."""
    return "".join(render_message(m) for m in messages) + "<assistant>"


def tokenize(text: str) -> list[int]:
    """One token per character."""
    return [ord(c) for c in text]


class FakeUpstream:
    """A fake OpenAI-compatible server on 127.0.0.1 (see the module docstring)."""

    def __init__(self, name: str = "fake", *, gzip: bool = False, token_ids: bool = False) -> None:
        self.name = name
        self.gzip = gzip
        self.token_ids = token_ids
        self.requests: list[ReceivedRequest] = []
        self._script: deque[_Slot] = deque()
        self._release = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._port: int | None = None

    async def __aenter__(self) -> FakeUpstream:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def port(self) -> int:
        assert self._port is not None, "FakeUpstream is not started"
        return self._port

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>/v1``, for an ``Endpoint``."""
        return f"http://127.0.0.1:{self.port}/v1"

    def script(self, *replies: FakeReply) -> None:
        """Queue scripted answers; when the queue is empty the fake answers as itself."""
        self._script.extend(_Slot(r, r.times) for r in replies)

    async def start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/responses", self._handle)
        app.router.add_post("/v1/chat/completions", self._handle)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, backlog=4096)
        await site.start()
        self._port = int(self._runner.addresses[0][1])

    async def close(self) -> None:
        self._release.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def _next(self) -> FakeReply | None:
        while self._script:
            slot = self._script[0]
            if slot.left > 0:
                slot.left -= 1
                return slot.reply
            self._script.popleft()
        return None

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.name, "object": "model"}]})

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(ReceivedRequest(request.path, dict(request.headers), body))
        api = "chat" if request.path.endswith("/chat/completions") else "responses"
        reply = self._next()
        if reply is None:
            identity = {
                "upstream": self.name,
                "model": body.get("model"),
                "authorization": request.headers.get("Authorization"),
                "api": api,
                "call": len(self.requests),
            }
            reply = FakeReply.say(json.dumps(identity))
        if reply.kind == "hang":
            await self._release.wait()
            return web.Response(status=503)
        if reply.kind == "garbage":
            return self._send(200, b"<html>this is not JSON{", {"Content-Type": "text/html"})
        if reply.kind == "reset":
            return await self._reset(request)
        if reply.kind in ("error", "json"):
            return self._send(reply.status, json.dumps(reply.payload).encode(), dict(reply.headers))
        payload = self._chat(body, reply) if api == "chat" else self._responses(body, reply)
        return self._send(200, json.dumps(payload).encode(), {})

    def _send(self, status: int, raw: bytes, headers: dict[str, str]) -> web.Response:
        headers = {"Content-Type": "application/json", **headers}
        if self.gzip:
            raw = gzip_module.compress(raw)
            headers["Content-Encoding"] = "gzip"
        return web.Response(status=status, body=raw, headers=headers)

    async def _reset(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        response.content_length = 10_000
        await response.prepare(request)
        await response.write(b'{"id": "partial", "output": [')
        assert request.transport is not None
        request.transport.abort()
        with contextlib.suppress(Exception):
            await asyncio.sleep(0)
        return response

    def _responses(self, body: dict[str, Any], reply: FakeReply) -> dict[str, Any]:
        n = len(self.requests)
        output: list[dict[str, Any]] = []
        if reply.reasoning:
            output.append(
                {
                    "id": f"rs_{n}",
                    "type": "reasoning",
                    "summary": [{"type": "summary_text", "text": reply.reasoning}],
                }
            )
        if reply.text is not None or not reply.tool_calls:
            output.append(
                {
                    "id": f"msg_{n}",
                    "type": "message",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": reply.text or "", "annotations": []}],
                }
            )
        for i, (name, arguments) in enumerate(reply.tool_calls):
            output.append(
                {
                    "id": f"fc_{n}_{i}",
                    "type": "function_call",
                    "call_id": f"call_{n}_{i}",
                    "name": name,
                    "arguments": arguments,
                    "status": "completed",
                }
            )
        completion = len(reply.text or "") + sum(len(a) for _, a in reply.tool_calls)
        response: dict[str, Any] = {
            "id": f"resp_{self.name}_{n}",
            "object": "response",
            "created_at": time.time(),
            "model": body.get("model"),
            "status": "completed",
            "output": output,
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "tool_choice": body.get("tool_choice") or "auto",
            "tools": body.get("tools") or [],
            "usage": {
                "input_tokens": 10,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": completion,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": 10 + completion,
            },
        }
        if body.get("metadata") is not None:
            response["metadata"] = body["metadata"]
        if reply.finish_reason == "length":
            response["status"] = "incomplete"
            response["incomplete_details"] = {"reason": "max_output_tokens"}
        return response

    def _chat(self, body: dict[str, Any], reply: FakeReply) -> dict[str, Any]:
        n = len(self.requests)
        message: dict[str, Any] = {"role": "assistant", "content": reply.text}
        if reply.reasoning:
            message["reasoning_content"] = reply.reasoning
        if reply.tool_calls:
            message["tool_calls"] = [
                {
                    "id": f"call_{n}_{i}",
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }
                for i, (name, arguments) in enumerate(reply.tool_calls)
            ]
        elif reply.text is None:
            message["content"] = ""
        prompt_ids = tokenize(render_prompt(body.get("messages", [])))
        completion_ids = tokenize(render_body(message))
        finish = "tool_calls" if reply.tool_calls and reply.finish_reason == "stop" else reply.finish_reason
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "message": message, "logprobs": None}
        payload: dict[str, Any] = {
            "id": f"chatcmpl-{self.name}-{n}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model"),
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": len(completion_ids),
                "total_tokens": len(prompt_ids) + len(completion_ids),
            },
        }
        if self.token_ids and body.get("logprobs"):
            choice["logprobs"] = {
                "content": [
                    {"token": chr(t), "logprob": -0.01 * (i % 7), "bytes": None, "top_logprobs": []}
                    for i, t in enumerate(completion_ids)
                ]
            }
        if self.token_ids and body.get("return_token_ids"):
            payload["prompt_token_ids"] = prompt_ids
            choice["token_ids"] = completion_ids
        return payload


class RawServer:
    """A TCP server on 127.0.0.1 that accepts each connection and never speaks HTTP, counting them: ``Refuser``
    closes each at once (a replica dying), ``Frozen`` holds each open and answers nothing (a SIGSTOPped engine; the
    kernel still accepts)."""

    hold = False

    def __init__(self) -> None:
        self.accepted = 0
        self._server: asyncio.Server | None = None
        self._held: list[asyncio.StreamWriter] = []

    async def __aenter__(self) -> Any:
        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.accepted += 1
            if self.hold:
                self._held.append(writer)
            else:
                writer.close()

        self._server = await asyncio.start_server(accept, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        for writer in self._held:
            writer.close()
        self._server.close()
        await self._server.wait_closed()

    @property
    def base_url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/v1"


class Refuser(RawServer):
    """A replica dying: each connection is closed at once, unanswered."""


class Frozen(RawServer):
    """A replica that hangs: each connection is accepted and never answered."""

    hold = True
