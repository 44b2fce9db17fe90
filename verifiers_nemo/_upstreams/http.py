"""HTTP for upstreams: one bounded, retrying POST, secrets redacted from every message, and the
skeleton both HTTP upstreams share (send, map a context overflow or a refusal, read the reply)."""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from .._endpoint import Endpoint
from .._exceptions import (
    UpstreamConnectionError,
    UpstreamError,
    UpstreamHTTPError,
    UpstreamProtocolError,
    UpstreamTimeout,
)
from .._protocol.codec import dumps, loads
from .._protocol.responses import incomplete_response
from .._protocol.token_data import TokenData
from .base import RetryPolicy, UpstreamReply
from .refusals import known_refusal

logger = logging.getLogger(__name__)

# Statuses worth another attempt; everything >= 500 is retried too. Not 409: a conflict is an
# answer about the request, and the same request gets the same answer.
RETRY_STATUSES = frozenset({408, 429})
# Phrases upstreams use when the prompt does not fit the model's context (vLLM, OpenAI, SGLang).
_CONTEXT_OVERFLOW_HINTS = ("context length", "context_length", "context window", "maximum context")
_SNIPPET_CHARS = 300

FAIL_FAST_UNREACHABLE: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "verifiers_nemo_fail_fast_unreachable", default=False
)
"""Set (in the calling task's context) while another replica could answer the call: a connection that fails or
is not established in time is raised at once, not retried here (the caller moves the call; ``_replicas``)."""


@dataclass(slots=True)
class _HttpResult:
    status: int
    body: bytes
    attempts: int


def _redact(text: str, secret: str) -> str:
    if secret and len(secret) >= 4:
        text = text.replace(secret, "***")
    return text


def snippet(raw: bytes, secret: str) -> str:
    """The start of a reply body for an error message, the secret scrubbed."""
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


def headers_for(endpoint: Endpoint) -> dict[str, str]:
    """The request headers for ``endpoint``: JSON, its bearer key, its extra headers."""
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

    Returns the first non-retryable answer (2xx, 4xx, or a refusal no retry can change: ``refusals``), or raises
    ``UpstreamHTTPError`` / ``UpstreamTimeout`` / ``UpstreamConnectionError`` once the retries or the time budget
    are spent (a connection failure at once while ``FAIL_FAST_UNREACHABLE`` is set). ``secret`` is scrubbed from
    every message.
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
        failure: type[UpstreamError]
        unreachable = False
        try:
            async with session.post(url, data=payload, headers=headers, timeout=timeout) as resp:
                status = resp.status
                raw = await resp.read()
                if status < 400 or (status not in RETRY_STATUSES and status < 500):
                    return _HttpResult(status, raw, attempt)
                if known_refusal(status, raw) is not None:
                    return _HttpResult(status, raw, attempt)
                retry_after = _retry_after(resp.headers.get("Retry-After"))
                failure, problem = UpstreamHTTPError, f"HTTP {status}: {snippet(raw, secret)}"
        except TimeoutError:
            failure = UpstreamTimeout
            if loop.time() >= deadline - 0.01:
                problem = f"no complete answer within {retry.timeout:g} s"
            else:
                problem = f"connection not established within {retry.connect_timeout:g} s"
                unreachable = True
        except aiohttp.ClientError as exc:
            failure, problem = UpstreamConnectionError, _redact(f"{type(exc).__name__}: {exc}", secret)
            unreachable = isinstance(exc, aiohttp.ClientConnectionError)
        remaining = deadline - loop.time()
        delay = retry.delay(attempt, retry_after)
        if attempt > retry.max_retries or delay >= remaining or (unreachable and FAIL_FAST_UNREACHABLE.get()):
            tries = f"{attempt} attempt{'s' if attempt > 1 else ''}"
            raise failure(
                f"{url} failed after {tries}: {problem}",
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


class HttpUpstream:
    """What both HTTP upstreams do around their own request and reply formats: send the request with
    bounded retries, turn a context overflow into an empty incomplete answer (as Gym's own vLLM server
    does) when ``context_overflow_as_incomplete`` is set, refuse any other 4xx, and read the reply.

    A subclass names its ``path`` and implements ``_request`` (the body it sends for a Responses
    request) and ``_reply`` (the Gym-ready response and token data from what came back)."""

    path: str

    def __init__(self, retry: RetryPolicy | None = None, *, context_overflow_as_incomplete: bool = True) -> None:
        self.retry = retry or RetryPolicy()
        self.context_overflow_as_incomplete = context_overflow_as_incomplete

    def _request(self, endpoint: Endpoint, body: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def _reply(self, data: Any, body: dict[str, Any]) -> tuple[dict[str, Any], TokenData]:
        raise NotImplementedError

    async def create_response(
        self, session: aiohttp.ClientSession, endpoint: Endpoint, body: dict[str, Any]
    ) -> UpstreamReply:
        sent = self._request(endpoint, body)
        url = f"{endpoint.base_url}/{self.path}"
        secret = endpoint.api_key
        payload = dumps(sent)
        result = await post_json(session, url, payload, headers_for(endpoint), self.retry, secret=secret, request=sent)
        facts = {"upstream_status": result.status, "attempts": result.attempts, "request": sent}
        if result.status >= 400:
            if self.context_overflow_as_incomplete and _is_context_overflow(result):
                return UpstreamReply(
                    incomplete_response(body),
                    sent,
                    result.status,
                    result.attempts,
                    context_overflow=True,
                    request_json=payload,
                )
            refusal = known_refusal(result.status, result.body)
            if refusal is not None:
                raise UpstreamHTTPError(
                    f"{url} refused the request (HTTP {result.status}): {refusal.describe()}", **facts
                )
            raise UpstreamHTTPError(
                f"{url} refused the request: HTTP {result.status}: {snippet(result.body, secret)}", **facts
            )
        try:
            data = loads(result.body)
        except ValueError:
            raise UpstreamProtocolError(
                f"{url} answered HTTP {result.status} with a body that is not JSON: {snippet(result.body, secret)}",
                **facts,
            ) from None
        try:
            response, tokens = self._reply(data, body)
        except UpstreamError as exc:
            exc.upstream_status, exc.attempts, exc.request = result.status, result.attempts, sent
            raise
        return UpstreamReply.with_tokens(
            response, sent, tokens, status=result.status, attempts=result.attempts, request_json=payload
        )

    async def pass_chat(
        self, session: aiohttp.ClientSession, endpoint: Endpoint, body: dict[str, Any]
    ) -> UpstreamReply:
        """POST a Chat Completions body as it is to ``endpoint`` (bounded retries); any status is handed on."""
        url = f"{endpoint.base_url}/chat/completions"
        payload = dumps(body)
        result = await post_json(
            session, url, payload, headers_for(endpoint), self.retry, secret=endpoint.api_key, request=body
        )
        try:
            data = loads(result.body)
        except ValueError:
            data = None
        return UpstreamReply(
            data if isinstance(data, dict) else {},
            body,
            result.status,
            result.attempts,
            request_json=payload,
            response_json=result.body,
        )
