"""The one owner of Responses <-> Chat Completions conversion.

Three uses, each with its own contract:

* **Requests to a Chat Completions upstream** (``responses_to_chat_request``, ``input_to_messages``):
  strict. What has no Chat Completions equivalent raises ``UpstreamConversionError``
  rather than being silently dropped, because the model would see a different conversation.
* **Replies from a Chat Completions upstream** (``chat_completion_to_response``): the first choice as
  a Gym-valid Responses object, with its token data.
* **Chat-style views** for people and trainers (``to_chat_messages`` for a task's prompt,
  ``to_chat_tools``, ``output_to_messages`` for a rollout's completion): lenient, never raise;
  anything unknown is skipped or kept as it is.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from typing import Any, Literal
from uuid import uuid4

from pydantic import BaseModel, ConfigDict, ValidationError

from .._exceptions import UpstreamConversionError, UpstreamProtocolError
from .gym_schema import summarize
from .responses import check_for_gym, echo_request_fields
from .token_data import OUTPUT_LOGPROBS, TokenData, from_chat, make_logprob_fields_consistent

# --------------------------------------------------------------------------------------------
# Responses request -> Chat Completions request (strict)
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


def _conversion_error(message: str) -> UpstreamConversionError:
    return UpstreamConversionError(f"cannot convert the request to Chat Completions: {message}")


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


def _request_reasoning_text(item: Mapping[str, Any]) -> str:
    """The model's own reasoning text when the item has it, else its summary (what the model is shown)."""
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
            text = _request_reasoning_text(item)
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


def chat_completion_to_response(data: Any, request: Mapping[str, Any]) -> tuple[dict[str, Any], TokenData]:
    """Convert a Chat Completions reply to a Gym-valid Responses reply for ``request``.

    The first choice becomes, in order: a reasoning item (``reasoning_content``/``reasoning``), an
    assistant message (its text, or an empty one when nothing else came back) and one
    ``function_call`` item per tool call. ``finish_reason`` ``length`` or ``content_filter`` makes
    the response ``incomplete``.
    """
    if not isinstance(data, dict):
        raise UpstreamProtocolError(f"upstream reply is a JSON {type(data).__name__}, not a Chat Completion")
    if not data.get("choices"):
        raise UpstreamProtocolError("upstream Chat Completion has no choices")
    try:
        _ChatCompletion.model_validate(data)
    except ValidationError as exc:
        raise UpstreamProtocolError(f"upstream reply is not a valid Chat Completion: {summarize(exc)}") from None
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
            raise UpstreamProtocolError(f"upstream returned a non-function tool call: {call!r}")
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
    echo_request_fields(response, request)
    check_for_gym(response, "converted reply")
    return response, tokens


# --------------------------------------------------------------------------------------------
# Chat-style views of Responses items (lenient: for prompts, completions and datasets)
# --------------------------------------------------------------------------------------------

_TEXT_PART_TYPES = frozenset({"input_text", "output_text", "text"})


def _json_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def to_chat_messages(items: str | list[Any]) -> list[dict[str, Any]]:
    """Responses ``input`` as Chat Completions messages.

    Messages keep their role (``developer`` becomes ``system``); content made only of text parts is
    joined into one string with newlines, other content becomes chat parts (``input_image`` becomes
    ``image_url``). ``function_call`` items become assistant ``tool_calls``, ``function_call_output``
    items ``tool`` messages; reasoning items are left out.
    """
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[dict[str, Any]] = []
    for item in items:
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind in (None, "message") and "role" in item:
            role = "system" if item["role"] == "developer" else str(item["role"])
            messages.append({"role": role, "content": _chat_content(item.get("content"))})
        elif kind == "function_call":
            call = {
                "id": item.get("call_id") or item.get("id") or "",
                "type": "function",
                "function": {"name": item.get("name", ""), "arguments": item.get("arguments", "")},
            }
            if messages and messages[-1]["role"] == "assistant":
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append(
                {"role": "tool", "tool_call_id": item.get("call_id", ""), "content": _json_text(item.get("output", ""))}
            )
    return messages


def to_chat_tools(tools: list[Any]) -> list[dict[str, Any]]:
    """Responses tool definitions in Chat Completions form; non-function tools are kept as they are."""
    converted = []
    for tool in tools:
        if isinstance(tool, dict) and tool.get("type") == "function" and "function" not in tool:
            function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
            converted.append({"type": "function", "function": function})
        else:
            converted.append(tool)
    return converted


def _chat_content(content: Any) -> str | list[dict[str, Any]]:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return json.dumps(content)
    parts = [p for p in content if isinstance(p, dict)]
    if all(p.get("type") in _TEXT_PART_TYPES or p.get("type") == "refusal" for p in parts):
        return "\n".join(str(p.get("text", p.get("refusal", ""))) for p in parts)
    converted: list[dict[str, Any]] = []
    for part in parts:
        kind = part.get("type")
        if kind in _TEXT_PART_TYPES:
            converted.append({"type": "text", "text": part.get("text", "")})
        elif kind == "input_image":
            converted.append({"type": "image_url", "image_url": {"url": part.get("image_url") or part.get("file_id")}})
        else:
            converted.append(part)
    return converted


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                text = part.get("text") or part.get("refusal")
                if text:
                    parts.append(text)
            elif isinstance(part, str):
                parts.append(part)
        return "".join(parts)
    return "" if content is None else str(content)


def _completion_reasoning_text(item: dict[str, Any]) -> str:
    """Summary and raw reasoning both (a completion view shows all the model produced; a request
    to the model sends one, see ``_request_reasoning_text``)."""
    chunks = [s.get("text", "") for s in item.get("summary") or [] if isinstance(s, dict)]
    chunks += [c.get("text", "") for c in item.get("content") or [] if isinstance(c, dict)]
    return "\n".join(c for c in chunks if c)


def output_to_messages(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Responses output items as chat messages.

    Assistant text and tool calls become one assistant message per turn (``tool_calls`` in chat
    form), tool results become ``tool`` messages, and reasoning is kept apart in the assistant
    message's ``reasoning_content``.
    """
    messages: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    pending_reasoning: list[str] = []

    def assistant() -> dict[str, Any]:
        nonlocal current
        if current is None:
            current = {"role": "assistant", "content": ""}
            if pending_reasoning:
                current["reasoning_content"] = "\n".join(pending_reasoning)
                pending_reasoning.clear()
            messages.append(current)
        return current

    for item in output:
        kind = item.get("type")
        if kind == "reasoning":
            text = _completion_reasoning_text(item)
            if text:
                if current is not None and not current.get("content") and not current.get("tool_calls"):
                    current["reasoning_content"] = "\n".join(filter(None, [current.get("reasoning_content"), text]))
                else:
                    current = None
                    pending_reasoning.append(text)
        elif kind == "message" or (kind is None and item.get("role") == "assistant"):
            msg = assistant()
            if msg.get("tool_calls"):
                current = None
                msg = assistant()
            msg["content"] = (msg["content"] or "") + _content_text(item.get("content"))
        elif kind == "function_call":
            msg = assistant()
            msg.setdefault("tool_calls", []).append(
                {
                    "id": item.get("call_id") or item.get("id"),
                    "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments", "")},
                }
            )
        elif kind == "function_call_output":
            current = None
            messages.append(
                {"role": "tool", "tool_call_id": item.get("call_id"), "content": _json_text(item.get("output"))}
            )
        else:
            current = None
            messages.append({"role": "assistant", "content": "", "item": item})
    if pending_reasoning:
        messages.append({"role": "assistant", "content": "", "reasoning_content": "\n".join(pending_reasoning)})
    return messages
