"""``FunctionUpstream``: a plain function answers (httpx's ``MockTransport`` idea): tests, replay."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from .._endpoint import Endpoint
from .._exceptions import UpstreamError
from .._protocol.responses import read_responses_reply
from .._protocol.token_data import pop_return_tokens
from .base import UpstreamReply

ResponseHandler = Callable[[Endpoint, dict[str, Any]], "dict[str, Any] | Awaitable[dict[str, Any]]"]


class FunctionUpstream:
    """Answers with ``handler(endpoint, body)`` returning a Responses dict (sync or async).

    The seam for replay and for tests that need no server: the reply is read, completed and
    validated exactly like a real upstream's.
    """

    def __init__(self, handler: ResponseHandler) -> None:
        self.handler = handler

    async def create_response(
        self, session: aiohttp.ClientSession, endpoint: Endpoint, body: dict[str, Any]
    ) -> UpstreamReply:
        pop_return_tokens(body)
        result = self.handler(endpoint, body)
        if inspect.isawaitable(result):
            result = await result
        try:
            response, tokens = read_responses_reply(result, body)
        except UpstreamError as exc:
            exc.request = body
            raise
        return UpstreamReply.with_tokens(response, body, tokens)
