"""The upstream seam: how one Gym policy call (a Responses request) reaches an inference endpoint.

An upstream is one small interface, in the spirit of an httpx transport: ``create_response(session,
endpoint, body) -> UpstreamReply``. Implementations: ``ResponsesUpstream`` (passthrough),
``ChatCompletionsUpstream`` (conversion), ``FunctionUpstream`` (a plain function: tests). A judge that
asks in Chat Completions is passed through by the same objects' ``pass_chat`` (``ChatPassthrough``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, fields
from typing import Any, Protocol

import aiohttp

from .._endpoint import Endpoint
from .._protocol.token_data import TokenData


class Upstream(Protocol):
    """How one Responses request reaches an endpoint (the seam for passthrough, chat, replay)."""

    async def create_response(
        self, session: aiohttp.ClientSession, endpoint: Endpoint, body: dict[str, Any]
    ) -> UpstreamReply:
        """Answer ``body`` (a Responses request whose ``model`` is the endpoint's) or raise
        ``UpstreamError``."""
        ...


class ChatPassthrough(Protocol):
    """How a Chat Completions request (a judge that asks in chat) reaches an endpoint unchanged."""

    async def pass_chat(
        self, session: aiohttp.ClientSession, endpoint: Endpoint, body: dict[str, Any]
    ) -> UpstreamReply:
        """Send ``body`` as it is; the reply (any status) in ``response_json``, parsed in ``response``
        when it is a JSON object. Raise ``UpstreamError`` when no answer came."""
        ...


_TOKEN_FIELDS = tuple(f.name for f in fields(TokenData))  # once: token_fields() runs on every policy call


@dataclass(slots=True)
class UpstreamReply:
    """A Responses-API object ready for the Gym agent, with what was sent and the call's token data.

    Token fields are ``None`` where the upstream did not return them; ``finish_reason`` uses the
    Chat Completions words whichever API answered (``stop``, ``length``, ``tool_calls``...).
    """

    response: dict[str, Any]
    request: dict[str, Any]
    status: int = 200
    attempts: int = 1
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    completion_logprobs: list[float] | None = None
    context_overflow: bool = False
    request_json: bytes | None = None
    """``request`` as sent, when already serialized (saves the proxy a second ``dumps``)."""
    finish_reason: str | None = None
    response_json: bytes | None = None
    """The reply as received, when it is handed on unchanged (a passed-through chat answer)."""

    def token_fields(self) -> dict[str, Any]:
        """Its token data by ``TokenData``'s field names (a ``PolicyCall`` has the same fields)."""
        return {name: getattr(self, name) for name in _TOKEN_FIELDS}

    @classmethod
    def with_tokens(
        cls, response: dict[str, Any], request: dict[str, Any], tokens: TokenData, **extra: Any
    ) -> UpstreamReply:
        return cls(
            response,
            request,
            prompt_token_ids=tokens.prompt_token_ids,
            completion_token_ids=tokens.completion_token_ids,
            completion_logprobs=tokens.completion_logprobs,
            finish_reason=tokens.finish_reason,
            **extra,
        )


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Bounds for one policy call: total time over all attempts, retries, and backoff.

    ``timeout`` covers every attempt and backoff of one call; ``connect_timeout`` bounds each
    connection attempt. The delay before retry ``n`` is ``backoff * 2**(n-1)`` capped at
    ``backoff_max``, scaled by a random factor in [0.5, 1] (jitter), and at least the upstream's
    ``Retry-After`` (capped as well).
    """

    max_retries: int = 3
    backoff: float = 0.5
    backoff_max: float = 8.0
    timeout: float = 600.0
    connect_timeout: float = 10.0

    def delay(self, retry: int, retry_after: float | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (1-based)."""
        delay = min(self.backoff_max, self.backoff * 2 ** (retry - 1)) * random.uniform(0.5, 1.0)
        if retry_after is not None:
            delay = max(delay, min(retry_after, self.backoff_max))
        return delay
