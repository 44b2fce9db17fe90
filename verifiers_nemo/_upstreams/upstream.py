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
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol
from uuid import uuid4

import aiohttp
from pydantic import BaseModel, ConfigDict, ValidationError

from .._endpoint import Endpoint
from .._exceptions import UpstreamError
from .._protocol.gym_schema import GymSchemaError, drop_uncarried_fields, summarize, validate_policy_reply
from .._protocol.token_data import (
    OUTPUT_LOGPROBS,
    TokenData,
    ask_for_token_data,
    from_chat,
    from_responses,
    make_logprob_fields_consistent,
    pop_return_tokens,
    strip_training_fields,
)

try:  # orjson is faster and ships with nemo-gym; plain json is the fallback.
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

FailureKind = Literal["http", "timeout", "connection", "protocol", "conversion", "internal"]

# Statuses worth another attempt; everything >= 500 is retried too. Not 409: a conflict is an
# answer about the request, and the same request gets the same answer.
RETRY_STATUSES = frozenset({408, 429})
# Phrases upstreams use when the prompt does not fit the model's context (vLLM, OpenAI, SGLang).
_CONTEXT_OVERFLOW_HINTS = ("context length", "context_length", "context window", "maximum context")
# Fields a Response echoes from its request.
_ECHOED_REQUEST_FIELDS = (
    "instructions",
    "max_output_tokens",
    "max_tool_calls",
    "metadata",
    "reasoning",
    "service_tier",
    "temperature",
    "text",
    "top_logprobs",
    "top_p",
    "truncation",
    "user",
)
_SNIPPET_CHARS = 300


def dumps(obj: Any) -> bytes:
    """Serialize to compact JSON bytes."""
    if _orjson is not None:
        try:
            # orjson's bytes keep a 4 KiB buffer; a right-sized copy costs < 1 us and keeps
            # recorded calls small.
            return bytes(memoryview(_orjson.dumps(obj)))
        except TypeError:  # e.g. an integer beyond 64 bits
            pass
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def loads(data: bytes | str) -> Any:
    """Parse JSON (raises ``ValueError`` on garbage)."""
    if _orjson is not None:
        try:
            return _orjson.loads(data)
        except _orjson.JSONDecodeError:
            pass  # plain json accepts a few things orjson does not (huge integers)
    return json.loads(data)


class UpstreamFailure(UpstreamError):
    """An ``UpstreamError`` with the facts of the failed call.

    ``kind`` is one of ``http`` (a non-retryable or exhausted HTTP status), ``timeout``,
    ``connection``, ``protocol`` (garbage JSON or a reply that does not validate), ``conversion``
    (a request that cannot be expressed to this upstream) or ``internal``.
    """

    def __init__(
        self,
        message: str,
        *,
        kind: FailureKind,
        upstream_status: int | None = None,
        attempts: int = 0,
        request: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.upstream_status = upstream_status
        self.attempts = attempts
        self.request = request


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


# Statuses of a Responses object that carry no usable answer (a background or failed response).
_UNUSABLE_STATUSES = frozenset({"failed", "cancelled", "in_progress", "queued"})
# vLLM's token messages (``enable_response_messages``): recorded, never handed to Gym.
_RESPONSE_MESSAGE_FIELDS = ("input_messages", "output_messages")


def finish_response(data: Any, request: Mapping[str, Any]) -> dict[str, Any]:
    """Complete and validate a Responses object for Gym, or raise ``UpstreamFailure``.

    Fields a Response merely echoes from its request (``tools``, ``tool_choice``,
    ``parallel_tool_calls``, ``model``...) are filled in when missing, and usage gets the
    ``cached_tokens`` / ``reasoning_tokens`` details Gym requires (0 when absent). The model output
    itself is never invented: a reply without a valid ``output`` is an error. The result is what
    nemo-gym 0.4.0 accepts, whatever openai is installed here.
    """
    if not isinstance(data, dict):
        raise UpstreamFailure(
            f"upstream reply is a JSON {type(data).__name__}, not a Responses object", kind="protocol"
        )
    if data.get("status") in _UNUSABLE_STATUSES:
        error = data.get("error")
        detail = f": {error.get('message')}" if isinstance(error, dict) and error.get("message") else ""
        raise UpstreamFailure(f"upstream reply has status {data['status']!r}{detail}", kind="protocol")
    if "id" not in data:
        data["id"] = f"resp_{uuid4().hex}"
    if "created_at" not in data:
        data["created_at"] = time.time()
    data.setdefault("object", "response")
    if "model" not in data:
        data["model"] = request.get("model")
    if "parallel_tool_calls" not in data:
        data["parallel_tool_calls"] = request.get("parallel_tool_calls", True)
    if "tool_choice" not in data:
        data["tool_choice"] = request.get("tool_choice") or "auto"
    if "tools" not in data:
        data["tools"] = request.get("tools") or []
    usage = data.get("usage")
    if isinstance(usage, dict):
        if not isinstance(usage.get("input_tokens_details"), dict):
            usage["input_tokens_details"] = {"cached_tokens": 0}
        elif usage["input_tokens_details"].get("cached_tokens") is None:
            usage["input_tokens_details"]["cached_tokens"] = 0
        if not isinstance(usage.get("output_tokens_details"), dict):
            usage["output_tokens_details"] = {"reasoning_tokens": 0}
        elif usage["output_tokens_details"].get("reasoning_tokens") is None:
            usage["output_tokens_details"]["reasoning_tokens"] = 0
    _check_for_gym(data, "upstream reply")
    return data


def _check_for_gym(response: dict[str, Any], what: str) -> None:
    try:
        validate_policy_reply(response)
    except GymSchemaError as exc:
        raise UpstreamFailure(f"{what} is not a Responses object Gym accepts: {exc.summary}", kind="protocol") from None


def prepare_responses_reply(data: Any) -> TokenData:
    """Read the token data of a Responses reply, then make it one a Gym agent can carry: vLLM's
    output text logprobs and response messages are removed (recorded in the returned
    ``TokenData``), and complete token data is attached to the last output item as Gym's training
    fields (as nemo-gym's own vLLM model server does)."""
    if not isinstance(data, dict):
        return TokenData()
    tokens = from_responses(data)
    drop_uncarried_fields(data)
    for name in _RESPONSE_MESSAGE_FIELDS:
        data.pop(name, None)
    output = data.get("output")
    if tokens.complete and isinstance(output, list) and output and isinstance(output[-1], dict):
        output[-1].update(tokens.training_fields())
    return tokens


def _echo_request_fields(response: dict[str, Any], request: Mapping[str, Any]) -> None:
    for name in _ECHOED_REQUEST_FIELDS:
        value = request.get(name)
        if value is not None:
            response[name] = value


def incomplete_response(request: Mapping[str, Any]) -> dict[str, Any]:
    """An empty, incomplete answer (``max_output_tokens``): how Gym's vLLM server reports a prompt
    that does not fit the context window, so the agent ends the rollout instead of crashing."""
    response: dict[str, Any] = {
        "id": f"resp_{uuid4().hex}",
        "object": "response",
        "created_at": time.time(),
        "model": request.get("model"),
        "status": "incomplete",
        "incomplete_details": {"reason": "max_output_tokens"},
        "output": [
            {
                "id": f"msg_{uuid4().hex}",
                "type": "message",
                "role": "assistant",
                "status": "incomplete",
                "content": [{"type": "output_text", "text": "", "annotations": []}],
            }
        ],
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "tool_choice": request.get("tool_choice") or "auto",
        "tools": request.get("tools") or [],
        "usage": {
            "input_tokens": 0,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 0,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 0,
        },
    }
    _echo_request_fields(response, request)
    return response


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


# --------------------------------------------------------------------------------------------
# Responses request -> Chat Completions request
# --------------------------------------------------------------------------------------------

# Responses request fields with no Chat Completions meaning (dropped) and fields handled explicitly.
_DROPPED_FIELDS = frozenset(
    {"include", "store", "background", "truncation", "max_tool_calls", "metadata", "stream", "stream_options"}
)
_UNSUPPORTED_FIELDS = ("previous_response_id", "conversation", "prompt")
_HANDLED_FIELDS = frozenset(
    {
        "model",
        "input",
        "instructions",
        "max_output_tokens",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "reasoning",
        "text",
        "enable_response_messages",
        *_UNSUPPORTED_FIELDS,
    }
)


def _conversion_error(message: str) -> UpstreamFailure:
    return UpstreamFailure(f"cannot convert the request to Chat Completions: {message}", kind="conversion")


def _text_of_parts(parts: Any, allowed: Iterable[str], where: str) -> str:
    if isinstance(parts, str):
        return parts
    if not isinstance(parts, list):
        raise _conversion_error(f"{where} content must be a string or a list of parts")
    allowed = tuple(allowed)
    texts = []
    for part in parts:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in allowed:
            raise _conversion_error(f"{where} content part type {kind!r} is not supported")
        texts.append(part.get("refusal") if kind == "refusal" else part.get("text", ""))
    return "".join(t for t in texts if t)


def _user_content(content: Any, role: str) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _conversion_error(f"{role} message content must be a string or a list of parts")
    parts: list[dict[str, Any]] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text"):
            parts.append({"type": "text", "text": part.get("text", "")})
        elif kind == "input_image" and part.get("image_url"):
            image: dict[str, Any] = {"url": part["image_url"]}
            if part.get("detail"):
                image["detail"] = part["detail"]
            parts.append({"type": "image_url", "image_url": image})
        elif kind == "input_file":
            file = {k: part[k] for k in ("file_data", "file_id", "filename") if part.get(k) is not None}
            parts.append({"type": "file", "file": file})
        else:
            raise _conversion_error(f"{role} message content part type {kind!r} is not supported")
    if len(parts) == 1 and parts[0]["type"] == "text":
        return parts[0]["text"]
    return parts


def _reasoning_text(item: Mapping[str, Any]) -> str:
    content = [c.get("text", "") for c in item.get("content") or () if isinstance(c, dict)]
    if any(content):
        return "\n".join(t for t in content if t)
    return "\n".join(s.get("text", "") for s in item.get("summary") or () if isinstance(s, dict))


class _AssistantTurn:
    """Consecutive assistant items (reasoning, message, function calls) folded into one message."""

    __slots__ = ("reasoning", "texts", "tool_calls")

    def __init__(self) -> None:
        self.reasoning: list[str] = []
        self.texts: list[str] = []
        self.tool_calls: list[dict[str, Any]] = []

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.texts or self.tool_calls)

    def message(self, reasoning_fields: tuple[str, ...]) -> dict[str, Any]:
        text = "".join(self.texts)
        message: dict[str, Any] = {
            "role": "assistant",
            "content": text if text or not self.tool_calls else None,
        }
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        if self.reasoning:
            reasoning = "\n".join(self.reasoning)
            for name in reasoning_fields:
                message[name] = reasoning
        return message


def input_to_messages(
    items: str | list[Any], reasoning_fields: tuple[str, ...] = ("reasoning_content", "reasoning")
) -> list[dict[str, Any]]:
    """Convert a Responses ``input`` to Chat Completions messages.

    Function calls are grouped with the assistant text and reasoning before them into one
    assistant message; each ``function_call_output`` becomes a ``tool`` message.
    """
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise _conversion_error("input must be a string or a list of items")
    messages: list[dict[str, Any]] = []
    turn = _AssistantTurn()

    def flush() -> None:
        nonlocal turn
        if turn:
            messages.append(turn.message(reasoning_fields))
            turn = _AssistantTurn()

    for item in items:
        if not isinstance(item, dict):
            raise _conversion_error(f"input item {item!r} is not an object")
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role == "assistant":
                if turn.tool_calls:
                    flush()
                turn.texts.append(
                    _text_of_parts(item.get("content"), ("output_text", "input_text", "text", "refusal"), role)
                )
            elif role in ("user", "system", "developer"):
                flush()
                chat_role = "user" if role == "user" else "system"
                messages.append({"role": chat_role, "content": _user_content(item.get("content"), role)})
            else:
                raise _conversion_error(f"message role {role!r} is not supported")
        elif kind == "function_call":
            turn.tool_calls.append(
                {
                    "id": item["call_id"],
                    "type": "function",
                    "function": {"name": item["name"], "arguments": item.get("arguments") or ""},
                }
            )
        elif kind == "function_call_output":
            flush()
            output = _text_of_parts(item.get("output"), ("input_text", "output_text", "text"), "tool")
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": output})
        elif kind == "reasoning":
            if turn.texts or turn.tool_calls:
                flush()
            text = _reasoning_text(item)
            if text:
                turn.reasoning.append(text)
        else:
            raise _conversion_error(f"input item type {kind!r} has no Chat Completions equivalent")
    flush()
    return messages


def _chat_tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    if tool.get("type") != "function":
        raise _conversion_error(f"tool type {tool.get('type')!r} has no Chat Completions equivalent")
    function: dict[str, Any] = {"name": tool["name"]}
    for name in ("description", "parameters", "strict"):
        if tool.get(name) is not None:
            function[name] = tool[name]
    return {"type": "function", "function": function}


def _chat_tool_choice(choice: Any) -> Any:
    if isinstance(choice, str):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and choice.get("name"):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise _conversion_error(f"tool_choice {choice!r} has no Chat Completions equivalent")


def _response_format(text: Any) -> dict[str, Any] | None:
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(fmt, dict) or fmt.get("type") in (None, "text"):
        return None
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    if fmt["type"] == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "description", "strict") if fmt.get(k) is not None}
        return {"type": "json_schema", "json_schema": schema}
    raise _conversion_error(f"text format {fmt['type']!r} has no Chat Completions equivalent")


def responses_to_chat_request(
    body: Mapping[str, Any],
    *,
    max_tokens_field: str = "max_tokens",
    reasoning_fields: tuple[str, ...] = ("reasoning_content", "reasoning"),
) -> dict[str, Any]:
    """Convert a Responses request body to a Chat Completions request body vLLM accepts.

    ``instructions`` and ``developer`` messages become ``system`` messages, ``max_output_tokens``
    becomes ``max_tokens_field``, ``reasoning.effort`` becomes ``reasoning_effort``, ``text.format``
    becomes ``response_format``; ``tool_choice`` and ``parallel_tool_calls`` go only with tools. The
    logprobs asked for by ``include`` or ``top_logprobs`` become ``logprobs: true`` (vLLM refuses
    ``top_logprobs`` without it), vLLM's Responses-only ``enable_response_messages`` becomes
    ``return_token_ids``. Fields it does not know (sampling args such as ``top_k``, vLLM extensions
    such as ``return_token_ids`` or ``chat_template_kwargs``) pass through unchanged; ``None``
    values are dropped (vLLM reads a null ``top_logprobs`` as "no logprobs").
    """
    for name in _UNSUPPORTED_FIELDS:
        if body.get(name) is not None:
            raise _conversion_error(f"{name!r} needs a Responses API upstream")
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": body["instructions"]})
    messages.extend(input_to_messages(body.get("input", []), reasoning_fields))
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    tools = body.get("tools")
    if tools:
        chat["tools"] = [_chat_tool(tool) for tool in tools]
        if body.get("tool_choice") is not None:
            chat["tool_choice"] = _chat_tool_choice(body["tool_choice"])
        if body.get("parallel_tool_calls") is not None:
            chat["parallel_tool_calls"] = body["parallel_tool_calls"]
    if body.get("max_output_tokens") is not None:
        chat[max_tokens_field] = body["max_output_tokens"]
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and reasoning.get("effort"):
        chat["reasoning_effort"] = reasoning["effort"]
    response_format = _response_format(body.get("text"))
    if response_format is not None:
        chat["response_format"] = response_format
    for name, value in body.items():
        if value is not None and name not in _HANDLED_FIELDS and name not in _DROPPED_FIELDS:
            chat.setdefault(name, value)
    include = body.get("include")
    if isinstance(include, list) and OUTPUT_LOGPROBS in include:
        chat.setdefault("logprobs", True)
    if body.get("enable_response_messages"):
        chat.setdefault("return_token_ids", True)
    make_logprob_fields_consistent("chat", chat)
    return chat


# --------------------------------------------------------------------------------------------
# Chat Completions reply -> Responses reply
# --------------------------------------------------------------------------------------------


class _ChatModel(BaseModel):
    model_config = ConfigDict(extra="allow", protected_namespaces=())


class _ChatLogprob(_ChatModel):
    logprob: float


class _ChatLogprobs(_ChatModel):
    content: list[_ChatLogprob] | None = None


class _ChatMessage(_ChatModel):
    role: Literal["assistant"]
    content: str | None = None
    refusal: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


class _ChatChoice(_ChatModel):
    finish_reason: Literal["stop", "length", "tool_calls", "content_filter", "function_call"]
    message: _ChatMessage
    logprobs: _ChatLogprobs | None = None
    token_ids: list[int] | None = None


class _ChatUsage(_ChatModel):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None
    prompt_tokens_details: dict[str, Any] | None = None
    completion_tokens_details: dict[str, Any] | None = None


class _ChatCompletion(_ChatModel):
    """What the conversion reads from a Chat Completion (OpenAI's fields, vLLM's extensions);
    independent of the installed openai, whose models change required fields between versions."""

    id: str | None = None
    created: float | None = None
    model: str | None = None
    choices: list[_ChatChoice]
    usage: _ChatUsage | None = None
    prompt_token_ids: list[int] | None = None


def _usage(usage: Any) -> dict[str, Any] | None:
    if not isinstance(usage, dict):
        return None
    prompt = usage.get("prompt_tokens") or 0
    completion = usage.get("completion_tokens") or 0
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": usage.get("total_tokens") or prompt + completion,
    }


def chat_to_responses_reply(data: Any, request: Mapping[str, Any]) -> UpstreamReply:
    """Convert a Chat Completions reply to a Gym-valid Responses reply for ``request``.

    The first choice becomes, in order: a reasoning item (``reasoning_content``/``reasoning``), an
    assistant message (its text, or an empty one when nothing else came back) and one
    ``function_call`` item per tool call. ``finish_reason`` ``length`` or ``content_filter`` makes
    the response ``incomplete``.
    """
    if not isinstance(data, dict):
        raise UpstreamFailure(f"upstream reply is a JSON {type(data).__name__}, not a Chat Completion", kind="protocol")
    if not data.get("choices"):
        raise UpstreamFailure("upstream Chat Completion has no choices", kind="protocol")
    try:
        _ChatCompletion.model_validate(data)
    except ValidationError as exc:
        raise UpstreamFailure(
            f"upstream reply is not a valid Chat Completion: {summarize(exc)}", kind="protocol"
        ) from None
    choice = data["choices"][0]
    message = choice["message"]
    finish_reason = choice.get("finish_reason")
    truncated = finish_reason in ("length", "content_filter")

    output: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if reasoning:
        output.append(
            {
                "id": f"rs_{uuid4().hex}",
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": reasoning}],
            }
        )
    content = message.get("content") or ""
    refusal = message.get("refusal")
    tool_calls = message.get("tool_calls") or []
    if content or refusal or not (output or tool_calls):
        parts: list[dict[str, Any]] = []
        if content or not refusal:
            parts.append({"type": "output_text", "text": content, "annotations": []})
        if refusal:
            parts.append({"type": "refusal", "refusal": refusal})
        output.append(
            {
                "id": f"msg_{uuid4().hex}",
                "type": "message",
                "role": "assistant",
                "status": "incomplete" if truncated else "completed",
                "content": parts,
            }
        )
    for call in tool_calls:
        function = call.get("function")
        if call.get("type", "function") != "function" or not isinstance(function, dict):
            raise UpstreamFailure(f"upstream returned a non-function tool call: {call!r}", kind="protocol")
        call_id = call.get("id") or f"call_{uuid4().hex}"
        output.append(
            {
                "id": call_id,
                "type": "function_call",
                "call_id": call_id,
                "name": function.get("name"),
                "arguments": function.get("arguments") or "",
                "status": "completed",
            }
        )

    tokens = from_chat(data, choice)
    output[-1].update(tokens.training_fields())

    response: dict[str, Any] = {
        "id": f"resp_{data.get('id') or uuid4().hex}",
        "object": "response",
        "created_at": float(data.get("created") or time.time()),
        "model": data.get("model") or request.get("model"),
        "status": "incomplete" if truncated else "completed",
        "output": output,
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "tool_choice": request.get("tool_choice") or "auto",
        "tools": request.get("tools") or [],
        "usage": _usage(data.get("usage")),
    }
    if truncated:
        reason = "max_output_tokens" if finish_reason == "length" else "content_filter"
        response["incomplete_details"] = {"reason": reason}
    _echo_request_fields(response, request)
    _check_for_gym(response, "converted reply")
    return UpstreamReply.with_tokens(response, dict(request), tokens)
