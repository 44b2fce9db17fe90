"""Responses objects for a Gym agent: completed from their request, read for token data, validated.

Whatever produced a reply (a Responses upstream, the Chat Completions conversion, a function), it
reaches the agent only through here: fields a Response echoes from its request are filled in, the
usage details Gym requires are added, what Gym's agent cannot carry is removed, and the result is
checked against the schema nemo-gym 0.4.0 validates (``gym_schema``). The model output itself is
never invented.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any
from uuid import uuid4

from .._exceptions import UpstreamProtocolError
from .gym_schema import GymSchemaError, drop_uncarried_fields, validate_policy_reply
from .token_data import TokenData, from_responses

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

# Statuses of a Responses object that carry no usable answer (a background or failed response).
_UNUSABLE_STATUSES = frozenset({"failed", "cancelled", "in_progress", "queued"})
# vLLM's token messages (``enable_response_messages``): recorded, never handed to Gym.
_RESPONSE_MESSAGE_FIELDS = ("input_messages", "output_messages")


def finish_response(data: Any, request: Mapping[str, Any]) -> dict[str, Any]:
    """Complete and validate a Responses object for Gym, or raise ``UpstreamProtocolError``.

    Fields a Response merely echoes from its request (``tools``, ``tool_choice``,
    ``parallel_tool_calls``, ``model``...) are filled in when missing, and usage gets the
    ``cached_tokens`` / ``reasoning_tokens`` details Gym requires (0 when absent). The model output
    itself is never invented: a reply without a valid ``output`` is an error. The result is what
    nemo-gym 0.4.0 accepts, whatever openai is installed here.
    """
    if not isinstance(data, dict):
        raise UpstreamProtocolError(f"upstream reply is a JSON {type(data).__name__}, not a Responses object")
    if data.get("status") in _UNUSABLE_STATUSES:
        error = data.get("error")
        detail = f": {error.get('message')}" if isinstance(error, dict) and error.get("message") else ""
        raise UpstreamProtocolError(f"upstream reply has status {data['status']!r}{detail}")
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
    check_for_gym(data, "upstream reply")
    return data


def check_for_gym(response: dict[str, Any], what: str) -> None:
    try:
        validate_policy_reply(response)
    except GymSchemaError as exc:
        raise UpstreamProtocolError(f"{what} is not a Responses object Gym accepts: {exc.summary}") from None


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


def echo_request_fields(response: dict[str, Any], request: Mapping[str, Any]) -> None:
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
    echo_request_fields(response, request)
    return response


def read_responses_reply(data: Any, request: Mapping[str, Any]) -> tuple[dict[str, Any], TokenData]:
    """A Responses reply from any source as (the object Gym gets, its token data); see
    ``prepare_responses_reply`` and ``finish_response``."""
    tokens = prepare_responses_reply(data)
    return finish_response(data, request), tokens
