"""``FunctionUpstream``: a plain function answers (httpx's ``MockTransport`` idea): tests, replay."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from .._endpoint import Endpoint
from .._exceptions import UpstreamError
from .._protocol import dumps
from .._protocol.responses import read_responses_reply
from .._protocol.token_data import pop_return_tokens
from .base import UpstreamReply

ResponseHandler = Callable[[Endpoint, dict[str, Any]], "dict[str, Any] | Awaitable[dict[str, Any]]"]
"""``handler(endpoint, body)`` → a reply dict (Responses for ``create_response``, Chat for ``pass_chat``)."""


class FunctionUpstream:
    """Answers with ``handler(endpoint, body)`` returning a Responses dict (sync or async).

    The seam for tests that need no server: the reply is read, completed and validated exactly like a
    real upstream's. ``chat`` answers the Chat Completions calls of a judge that asks in chat (its
    Chat Completions dict is handed on as it is).
    """

    def __init__(self, handler: ResponseHandler, *, chat: ResponseHandler | None = None) -> None:
        self.handler = handler
        self.chat = chat

    @classmethod
    def from_policy(cls, function: Callable[..., Any]) -> FunctionUpstream:
        """A policy script as the upstream: ``function(messages, tools)`` answers as the model, in the shape
        ``eval --policy-script`` takes (see ``verifiers_nemo._policy_script``), for Responses and chat calls."""
        from .._policy_script import call_policy, chat_reply, responses_reply
        from .._protocol import to_chat_messages, to_chat_tools

        async def responses(endpoint: Endpoint, body: dict[str, Any]) -> dict[str, Any]:
            messages = to_chat_messages(body.get("input") or [])
            if isinstance(body.get("instructions"), str) and body["instructions"]:
                messages.insert(0, {"role": "system", "content": body["instructions"]})
            answer = await call_policy(function, messages, to_chat_tools(body.get("tools") or []))
            return responses_reply(answer, endpoint.model or "script")

        async def chat(endpoint: Endpoint, body: dict[str, Any]) -> dict[str, Any]:
            answer = await call_policy(function, list(body.get("messages") or []), list(body.get("tools") or []))
            return chat_reply(answer, endpoint.model or "script")

        return cls(responses, chat=chat)

    async def create_response(
        self, session: aiohttp.ClientSession, endpoint: Endpoint, body: dict[str, Any]
    ) -> UpstreamReply:
        pop_return_tokens(body)
        result = await _call(self.handler, endpoint, body)
        try:
            response, tokens = read_responses_reply(result, body)
        except UpstreamError as exc:
            exc.request = body
            raise
        return UpstreamReply.with_tokens(response, body, tokens)

    async def pass_chat(
        self, session: aiohttp.ClientSession, endpoint: Endpoint, body: dict[str, Any]
    ) -> UpstreamReply:
        if self.chat is None:
            raise UpstreamError("this FunctionUpstream answers no Chat Completions calls: pass chat=handler")
        result = await _call(self.chat, endpoint, body)
        return UpstreamReply(result, body, response_json=dumps(result))


async def _call(handler: ResponseHandler, endpoint: Endpoint, body: dict[str, Any]) -> dict[str, Any]:
    result = handler(endpoint, body)
    if inspect.isawaitable(result):
        result = await result
    return result
