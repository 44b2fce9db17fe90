"""How a Gym policy call (an OpenAI Responses request) reaches an inference endpoint.

An upstream is one small interface, in the spirit of an httpx transport: ``create_response(session,
endpoint, body) -> UpstreamReply``. ``ResponsesUpstream`` passes the request through to
``{base_url}/responses``; ``ChatCompletionsUpstream`` converts it to ``{base_url}/chat/completions``
and the answer back; ``FunctionUpstream`` answers with a plain function (tests, replay). Every reply
is read for token data (``_token_data``), stripped of what a Gym agent cannot carry, and checked
against the schema nemo-gym 0.4.0 validates (``_gym_schema``, independent of the installed openai)
before it can reach the agent. Every HTTP call is bounded in time and retried with backoff on
408/429/5xx and connection errors.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp

from .._endpoint import Endpoint
from .._exceptions import FailureKind, UpstreamFailure
from .._protocol.chat import chat_completion_to_response, responses_to_chat_request
from .._protocol.codec import dumps, loads
from .._protocol.responses import finish_response, incomplete_response, prepare_responses_reply
from .._protocol.token_data import (
    TokenData,
    ask_for_token_data,
    make_logprob_fields_consistent,
    pop_return_tokens,
    strip_training_fields,
)

logger = logging.getLogger(__name__)

# Statuses worth another attempt; everything >= 500 is retried too. Not 409: a conflict is an
# answer about the request, and the same request gets the same answer.
RETRY_STATUSES = frozenset({408, 429})
# Phrases upstreams use when the prompt does not fit the model's context (vLLM, OpenAI, SGLang).
_CONTEXT_OVERFLOW_HINTS = ("context length", "context_length", "context window", "maximum context")
_SNIPPET_CHARS = 300


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


class Upstream(Protocol):
    """How one Responses request reaches an endpoint (the seam for passthrough, chat, replay)."""

    async def create_response(
        self, session: aiohttp.ClientSession, endpoint: Endpoint, body: dict[str, Any]
    ) -> UpstreamReply:
        """Answer ``body`` (a Responses request whose ``model`` is the endpoint's) or raise
        ``UpstreamError``."""
        ...


# --------------------------------------------------------------------------------------------
# HTTP with bounded retries
# --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _HttpResult:
    status: int
    body: bytes
    attempts: int


def _redact(text: str, secret: str) -> str:
    if secret and len(secret) >= 4:
        text = text.replace(secret, "***")
    return text


def _snippet(raw: bytes, secret: str) -> str:
    text = raw[:_SNIPPET_CHARS].decode("utf-8", errors="replace")
    if len(raw) > _SNIPPET_CHARS:
        text += "…"
    return _redact(text, secret)


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None  # an HTTP date; not worth parsing for a bounded backoff
    return seconds if seconds >= 0 else None


def _headers(endpoint: Endpoint) -> dict[str, str]:
    headers = {"Content-Type": "application/json"}
    if endpoint.api_key:
        headers["Authorization"] = f"Bearer {endpoint.api_key}"
    headers.update(endpoint.extra_headers)
    return headers


async def post_json(
    session: aiohttp.ClientSession,
    url: str,
    payload: bytes,
    headers: Mapping[str, str],
    retry: RetryPolicy,
    *,
    secret: str = "",
    request: dict[str, Any] | None = None,
) -> _HttpResult:
    """POST ``payload``; retry 408/429/5xx, connection errors and connect timeouts.

    Returns the first non-retryable answer (2xx or 4xx), or raises ``UpstreamFailure`` once the
    retries or the time budget are spent. ``secret`` is scrubbed from every message.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + retry.timeout
    attempt = 0
    while True:
        attempt += 1
        remaining = deadline - loop.time()
        timeout = aiohttp.ClientTimeout(total=remaining, sock_connect=min(retry.connect_timeout, remaining))
        retry_after: float | None = None
        status: int | None = None
        kind: FailureKind
        try:
            async with session.post(url, data=payload, headers=headers, timeout=timeout) as resp:
                status = resp.status
                raw = await resp.read()
                if status < 400 or (status not in RETRY_STATUSES and status < 500):
                    return _HttpResult(status, raw, attempt)
                retry_after = _retry_after(resp.headers.get("Retry-After"))
                kind, problem = "http", f"HTTP {status}: {_snippet(raw, secret)}"
        except TimeoutError:
            kind = "timeout"
            if loop.time() >= deadline - 0.01:
                problem = f"no complete answer within {retry.timeout:g} s"
            else:
                problem = f"connection not established within {retry.connect_timeout:g} s"
        except aiohttp.ClientError as exc:
            kind, problem = "connection", _redact(f"{type(exc).__name__}: {exc}", secret)
        remaining = deadline - loop.time()
        delay = retry.delay(attempt, retry_after)
        if attempt > retry.max_retries or delay >= remaining:
            tries = f"{attempt} attempt{'s' if attempt > 1 else ''}"
            raise UpstreamFailure(
                f"{url} failed after {tries}: {problem}",
                kind=kind,
                upstream_status=status,
                attempts=attempt,
                request=request,
            )
        logger.debug("retrying %s in %.2f s after attempt %d: %s", url, delay, attempt, problem)
        await asyncio.sleep(delay)


def _is_context_overflow(result: _HttpResult) -> bool:
    if result.status != 400:
        return False
    text = result.body[:4096].decode("utf-8", errors="replace").lower()
    return any(hint in text for hint in _CONTEXT_OVERFLOW_HINTS)


def _parse_reply(result: _HttpResult, url: str, secret: str, request: dict[str, Any]) -> Any:
    try:
        return loads(result.body)
    except ValueError:
        raise UpstreamFailure(
            f"{url} answered HTTP {result.status} with a body that is not JSON: {_snippet(result.body, secret)}",
            kind="protocol",
            upstream_status=result.status,
            attempts=result.attempts,
            request=request,
        ) from None


def _http_failure(result: _HttpResult, url: str, secret: str, request: dict[str, Any]) -> UpstreamFailure:
    return UpstreamFailure(
        f"{url} refused the request: HTTP {result.status}: {_snippet(result.body, secret)}",
        kind="http",
        upstream_status=result.status,
        attempts=result.attempts,
        request=request,
    )


# --------------------------------------------------------------------------------------------
# Responses objects: validation, token data, synthesized replies
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# Upstream implementations
# --------------------------------------------------------------------------------------------


class ResponsesUpstream:
    """Passes the Responses request through to ``{base_url}/responses``.

    Chat-style ``max_tokens`` / ``max_completion_tokens`` (e.g. from sampling args) become
    ``max_output_tokens`` when the request has none, and Gym's training fields on earlier items are
    not sent. With ``return_tokens`` (endpoint or sampling arg) vLLM is asked for token IDs and
    logprobs (``enable_response_messages``, the output logprobs ``include``). Token data is read
    from the reply, then removed where Gym's agent cannot carry it. A 400 that says the prompt
    exceeds the context window becomes an empty incomplete response (as Gym's own vLLM server does)
    when ``context_overflow_as_incomplete`` is set.
    """

    def __init__(self, retry: RetryPolicy | None = None, *, context_overflow_as_incomplete: bool = True) -> None:
        self.retry = retry or RetryPolicy()
        self.context_overflow_as_incomplete = context_overflow_as_incomplete

    async def create_response(
        self, session: aiohttp.ClientSession, endpoint: Endpoint, body: dict[str, Any]
    ) -> UpstreamReply:
        for name in ("max_tokens", "max_completion_tokens"):
            if name in body:
                value = body.pop(name)
                if body.get("max_output_tokens") is None and value is not None:
                    body["max_output_tokens"] = value
        strip_training_fields(body.get("input"))
        if pop_return_tokens(body) or endpoint.return_tokens:
            ask_for_token_data("responses", body)
        make_logprob_fields_consistent("responses", body)
        url = f"{endpoint.base_url}/responses"
        payload = dumps(body)
        result = await post_json(
            session, url, payload, _headers(endpoint), self.retry, secret=endpoint.api_key, request=body
        )
        if result.status >= 400:
            if self.context_overflow_as_incomplete and _is_context_overflow(result):
                return UpstreamReply(
                    incomplete_response(body),
                    body,
                    result.status,
                    result.attempts,
                    context_overflow=True,
                    request_json=payload,
                )
            raise _http_failure(result, url, endpoint.api_key, body)
        data = _parse_reply(result, url, endpoint.api_key, body)
        try:
            tokens = prepare_responses_reply(data)
            response = finish_response(data, body)
        except UpstreamFailure as exc:
            exc.upstream_status, exc.attempts, exc.request = result.status, result.attempts, body
            raise
        return UpstreamReply.with_tokens(
            response, body, tokens, status=result.status, attempts=result.attempts, request_json=payload
        )


class ChatCompletionsUpstream:
    """Converts the Responses request to ``{base_url}/chat/completions`` and the answer back.

    ``developer`` messages become ``system`` (what vLLM chat templates accept); reasoning items
    travel as ``reasoning_fields`` on the assistant message (``reasoning_content`` for vLLM < 0.16,
    ``reasoning`` after). ``max_output_tokens`` becomes ``max_tokens_field``. With ``return_tokens``
    (endpoint or sampling arg) vLLM is asked for ``logprobs`` and ``return_token_ids``; token IDs
    and logprobs are read whenever the upstream returns them and attached to the last output item
    as Gym's training fields.
    """

    def __init__(
        self,
        retry: RetryPolicy | None = None,
        *,
        max_tokens_field: str = "max_tokens",
        reasoning_fields: tuple[str, ...] = ("reasoning_content", "reasoning"),
        context_overflow_as_incomplete: bool = True,
    ) -> None:
        self.retry = retry or RetryPolicy()
        self.max_tokens_field = max_tokens_field
        self.reasoning_fields = reasoning_fields
        self.context_overflow_as_incomplete = context_overflow_as_incomplete

    async def create_response(
        self, session: aiohttp.ClientSession, endpoint: Endpoint, body: dict[str, Any]
    ) -> UpstreamReply:
        return_tokens = pop_return_tokens(body) or endpoint.return_tokens
        try:
            chat = responses_to_chat_request(
                body, max_tokens_field=self.max_tokens_field, reasoning_fields=self.reasoning_fields
            )
        except UpstreamFailure as exc:
            exc.request = body
            raise
        if return_tokens:
            ask_for_token_data("chat", chat)
        url = f"{endpoint.base_url}/chat/completions"
        payload = dumps(chat)
        result = await post_json(
            session, url, payload, _headers(endpoint), self.retry, secret=endpoint.api_key, request=chat
        )
        if result.status >= 400:
            if self.context_overflow_as_incomplete and _is_context_overflow(result):
                return UpstreamReply(
                    incomplete_response(body),
                    chat,
                    result.status,
                    result.attempts,
                    context_overflow=True,
                    request_json=payload,
                )
            raise _http_failure(result, url, endpoint.api_key, chat)
        data = _parse_reply(result, url, endpoint.api_key, chat)
        try:
            reply = chat_to_responses_reply(data, body)
        except UpstreamFailure as exc:
            exc.upstream_status, exc.attempts, exc.request = result.status, result.attempts, chat
            raise
        reply.request, reply.request_json = chat, payload
        reply.status, reply.attempts = result.status, result.attempts
        return reply


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
            tokens = prepare_responses_reply(result)
            response = finish_response(result, body)
        except UpstreamFailure as exc:
            exc.request = body
            raise
        return UpstreamReply.with_tokens(response, body, tokens)


def chat_to_responses_reply(data: Any, request: Mapping[str, Any]) -> UpstreamReply:
    """Convert a Chat Completions reply to a Gym-valid ``UpstreamReply`` for ``request``."""
    response, tokens = chat_completion_to_response(data, request)
    return UpstreamReply.with_tokens(response, dict(request), tokens)
