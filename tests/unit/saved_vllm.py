"""Saved requests and replies of a real vLLM 0.32 server (``tests/data/vllm``, see its README),
and ``SavedVllm``: a server on 127.0.0.1 that answers with those bytes, byte for byte."""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

DATA = Path(__file__).resolve().parents[1] / "data" / "vllm"


def raw(name: str) -> bytes:
    """A saved file's bytes; for the ``*_400.txt`` files, the body without the status line."""
    data = (DATA / name).read_bytes()
    if name.endswith(".txt"):
        data = data.split(b"\nHTTP ", 1)[0].strip()
    return data


def load(name: str) -> Any:
    """A saved JSON file, parsed (a fresh copy each call)."""
    return json.loads(raw(name))


@dataclass
class Answer:
    """One answer: HTTP ``status`` and the exact ``body`` bytes."""

    body: bytes
    status: int = 200


class SavedVllm:
    """A stand-in vLLM on 127.0.0.1 that answers ``POST /v1/chat/completions`` and
    ``POST /v1/responses`` with queued answers, in order, and records each request body."""

    def __init__(self) -> None:
        self.answers: dict[str, deque[Answer]] = {"chat": deque(), "responses": deque()}
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self._runner: web.AppRunner | None = None
        self._port: int | None = None

    def queue(self, api: str, *answers: Answer | bytes) -> None:
        self.answers[api].extend(a if isinstance(a, Answer) else Answer(a) for a in answers)

    @property
    def base_url(self) -> str:
        assert self._port is not None, "SavedVllm is not started"
        return f"http://127.0.0.1:{self._port}/v1"

    async def __aenter__(self) -> SavedVllm:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/responses", self._responses)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self._port = int(self._runner.addresses[0][1])
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _chat(self, request: web.Request) -> web.Response:
        return await self._answer("chat", request)

    async def _responses(self, request: web.Request) -> web.Response:
        return await self._answer("responses", request)

    async def _answer(self, api: str, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append((api, body))
        if api == "chat" and body.get("top_logprobs") is not None and not body.get("logprobs"):
            # vLLM 0.32's own check (ChatCompletionRequest.check_logprobs), as it answers it.
            error = {
                "error": {
                    "message": "when using `top_logprobs`, `logprobs` must be set to true.",
                    "type": "BadRequestError",
                    "param": None,
                    "code": 400,
                }
            }
            return web.json_response(error, status=400)
        answer = self.answers[api].popleft()
        return web.Response(status=answer.status, body=answer.body, content_type="application/json")
