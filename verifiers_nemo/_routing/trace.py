"""What a route records: one ``PolicyCall`` per policy request, and the token contiguity check."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._exceptions import UpstreamError
from .._protocol import dumps, loads


@dataclass(slots=True, eq=False)
class PolicyCall:
    """One policy call of a rollout, as the proxy forwarded and answered it.

    ``request`` is the body sent upstream (Responses or Chat Completions shape, after routing and
    sampling-argument merging); it never holds the API key, which travels only in a header.
    ``response`` is the Responses-API object handed back to the Gym agent (``None`` when the call
    failed). Both are kept as the JSON bytes that went over the wire (compact, and invisible to
    the garbage collector while thousands of rollouts run) and decoded on first access.
    ``status`` is the HTTP status the agent got; ``upstream_status`` the upstream's last one.

    Token data has one shape whichever API answered, and is present only when the upstream returned
    it (vLLM: ``Endpoint(return_tokens=True)``): ``prompt_token_ids``, ``completion_token_ids`` (the
    end token included when the model emitted one) and ``completion_logprobs`` (one per completion
    token). ``finish_reason`` is ``stop``, ``length``, ``tool_calls`` or ``content_filter`` (Chat
    Completions words, also for the Responses API); ``None`` for a failed call or a context overflow.
    """

    index: int
    status: int
    latency_s: float
    attempts: int
    started_at: float
    request_json: bytes = b"{}"
    response_json: bytes | None = None
    upstream_status: int | None = None
    usage: dict[str, Any] | None = None
    error: UpstreamError | None = None
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    completion_logprobs: list[float] | None = None
    context_overflow: bool = False
    finish_reason: str | None = None
    _request: dict[str, Any] | None = field(default=None, repr=False)
    _response: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def request(self) -> dict[str, Any]:
        """The body sent upstream, as a dict."""
        if self._request is None:
            self._request = loads(self.request_json)
        return self._request

    @property
    def response(self) -> dict[str, Any] | None:
        """The Responses object returned to the agent, as a dict (``None`` if the call failed)."""
        if self._response is None and self.response_json is not None:
            self._response = loads(self.response_json)
        return self._response

    @property
    def ok(self) -> bool:
        """Whether the agent got a usable response."""
        return self.error is None and self.response_json is not None

    @property
    def has_tokens(self) -> bool:
        """Whether prompt and completion token IDs were captured."""
        return self.prompt_token_ids is not None and self.completion_token_ids is not None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PolicyCall:
        """A saved call (``to_dict``: each entry of a ``results.jsonl`` line's ``trace``, as ``eval --save-trace``
        writes it) back as a ``PolicyCall``, its error typed again; keys it does not know are ignored."""
        request, response, error = data.get("request") or {}, data.get("response"), data.get("error")
        return cls(
            index=int(data.get("index") or 0),
            status=int(data.get("status") or 0),
            latency_s=float(data.get("latency_s") or 0.0),
            attempts=int(data.get("attempts") or 1),
            started_at=float(data.get("started_at") or 0.0),
            request_json=dumps(request),
            response_json=None if response is None else dumps(response),
            upstream_status=data.get("upstream_status"),
            usage=data.get("usage"),
            error=UpstreamError.from_dict(error) if isinstance(error, Mapping) else None,  # type: ignore[arg-type]
            prompt_token_ids=data.get("prompt_token_ids"),
            completion_token_ids=data.get("completion_token_ids"),
            completion_logprobs=data.get("completion_logprobs"),
            context_overflow=bool(data.get("context_overflow")),
            finish_reason=data.get("finish_reason"),
            _request=request if isinstance(request, dict) else None,
            _response=response if isinstance(response, dict) else None,
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready copy (the error as ``{"type", "message"}``)."""
        return {
            "index": self.index,
            "request": self.request,
            "response": self.response,
            "status": self.status,
            "upstream_status": self.upstream_status,
            "latency_s": self.latency_s,
            "attempts": self.attempts,
            "started_at": self.started_at,
            "usage": self.usage,
            "error": self.error.to_dict() if self.error is not None else None,
            "prompt_token_ids": self.prompt_token_ids,
            "completion_token_ids": self.completion_token_ids,
            "completion_logprobs": self.completion_logprobs,
            "context_overflow": self.context_overflow,
            "finish_reason": self.finish_reason,
        }


@dataclass(frozen=True, slots=True)
class ContiguityCheck:
    """Result of ``check_contiguity``; truthy when the token sequence is contiguous."""

    ok: bool
    message: str
    broken_at: int | None = None

    def __bool__(self) -> bool:
        return self.ok


def check_contiguity(calls: Sequence[PolicyCall]) -> ContiguityCheck:
    """Check that each call's prompt tokens start with the previous call's prompt + completion tokens.

    This is what lets a trainer use the recorded token IDs of a multi-turn rollout as one sequence
    without retokenizing. Failed calls (no response) are skipped; a successful call without token
    IDs makes the check fail, since nothing can be said about it.
    """
    previous: list[int] | None = None
    previous_index = -1
    checked = 0
    for call in calls:
        if not call.ok:
            continue
        if call.prompt_token_ids is None or call.completion_token_ids is None:
            return ContiguityCheck(False, f"call {call.index} has no token IDs recorded", call.index)
        prompt = call.prompt_token_ids
        if previous is not None:
            n = len(previous)
            if len(prompt) < n or prompt[:n] != previous:
                mismatch = next(
                    (i for i, (a, b) in enumerate(zip(prompt, previous, strict=False)) if a != b),
                    min(len(prompt), n),
                )
                return ContiguityCheck(
                    False,
                    f"call {call.index}: prompt tokens diverge from call {previous_index}'s prompt + "
                    f"completion at position {mismatch} (prompt has {len(prompt)} tokens, "
                    f"expected a prefix of {n})",
                    call.index,
                )
        previous = prompt + call.completion_token_ids
        previous_index = call.index
        checked += 1
    if checked == 0:
        return ContiguityCheck(False, "no successful calls with token IDs to check")
    return ContiguityCheck(True, f"{checked} calls are contiguous")
