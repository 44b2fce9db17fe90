"""A rollout's transcript in one compact shape, whatever recorded it.

Three sources: our ``results.jsonl`` with ``--save-trace`` (each policy call's request and reply, in
the Responses or Chat Completions shape), our ``results.jsonl`` without it (the prompt and completion
messages), and verifiers' ``traces.jsonl`` (a tree of message nodes and the calls that produced them).

The shape (kept small, it is embedded in the report for every rollout it shows)::

    {"m": [message, ...], "c": [call, ...], "tools": [name, ...]}
    message = {"r": role, "t": text, "rs": reasoning, "tc": [[name, arguments, id], ...],
               "id": tool_call_id, "k": index of the policy call that produced it (assistant replies)}
    call = {"lat": seconds, "in": tokens, "out": tokens, "fin": finish_reason, "err": "type: message",
            "p": "request parameters", "tok": [prompt tokens, completion tokens, mean logprob, min logprob]}

Long texts go through a ``Strings`` table (many rollouts share a system prompt): a text field holds
either the text or the index of it in the table. Without a table (``strings=None``: the report's figures read
only counts and latencies) every text stays as it is.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

TEXT_LIMIT = 20_000
"""Characters of one text kept in the report; the rest is named, not embedded."""
SHARED_MIN = 160
"""Texts at least this long are stored once in the string table."""
_PARAM_SKIP = {"input", "messages", "tools", "instructions", "metadata", "user", "model", "stream", "include"}


class Strings:
    """The report's string table: each long text stored once, referenced by index."""

    def __init__(self, limit: int | None = TEXT_LIMIT) -> None:
        self.items: list[str] = []
        self.limit = limit
        """Characters kept of one text (None: all, for an export)."""
        self._index: dict[str, int] = {}

    def ref(self, text: str) -> str | int:
        """``text`` itself when short, else its index in the table (added once)."""
        if self.limit is not None and len(text) > self.limit:
            text = text[: self.limit] + f"\n… [{len(text) - self.limit:,} more characters not embedded in the report]"
        if len(text) < SHARED_MIN:
            return text
        return self._index_of(text)

    def _index_of(self, text: str) -> int:
        index = self._index.get(text)
        if index is None:
            index = self._index[text] = len(self.items)
            self.items.append(text)
        return index

    def text(self, value: str | int) -> str:
        """The text a field holds (itself, or the table's entry)."""
        return self.items[value] if isinstance(value, int) else value


def ref(strings: Strings | None, text: str) -> str | int:
    """``strings.ref(text)``; the text itself without a table (figures only, nothing embedded)."""
    return text if strings is None else strings.ref(text)


def text_of(content: Any) -> str:
    """The text of a message's content: a string, or the text parts of a list of parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, Mapping):
                text = part.get("text")
                if isinstance(text, str):
                    parts.append(text)
                elif part.get("type") in ("input_image", "image_url", "image"):
                    parts.append("[image]")
                elif part.get("type"):
                    parts.append(f"[{part.get('type')}]")
        return "\n".join(parts)
    return json.dumps(content, ensure_ascii=False)


def _arguments(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


class _Builder:
    """Messages built with their texts as they are (merging needs them whole); ``finish`` puts the long ones in
    the string table."""

    def __init__(self, strings: Strings | None) -> None:
        self.strings = strings
        self.messages: list[dict[str, Any]] = []

    def add(
        self,
        role: str,
        text: str = "",
        *,
        call: int | None = None,
        tool_calls: Sequence[Sequence[str]] = (),
        tool_call_id: str | None = None,
        reasoning: str = "",
    ) -> None:
        message: dict[str, Any] = {"r": role}
        if text:
            message["t"] = text
        if reasoning:
            message["rs"] = reasoning
        if tool_calls:
            message["tc"] = [[name, args, call_id] for name, args, call_id in tool_calls]
        if tool_call_id:
            message["id"] = tool_call_id
        if call is not None:
            message["k"] = call
        # Consecutive Responses output items of one call (reasoning, text, tool calls) read as one reply.
        last = self.messages[-1] if self.messages else None
        if last is not None and call is not None and last.get("k") == call and last["r"] == role == "assistant":
            for key in ("t", "rs"):
                if key in message and key in last:
                    last[key] = last[key] + "\n" + message[key]
                elif key in message:
                    last[key] = message[key]
            if "tc" in message:
                last.setdefault("tc", []).extend(message["tc"])
            return
        self.messages.append(message)

    def finish(self) -> list[dict[str, Any]]:
        """The messages, each long text replaced by its place in the string table."""
        for message in self.messages:
            for key in ("t", "rs"):
                if key in message:
                    message[key] = ref(self.strings, message[key])
            for tool_call in message.get("tc") or ():
                tool_call[1] = ref(self.strings, tool_call[1])
        return self.messages

    def chat_message(self, message: Mapping[str, Any], call: int | None = None) -> None:
        """A Chat Completions (or verifiers) message."""
        role = str(message.get("role") or "?")
        tool_calls = []
        for tc in message.get("tool_calls") or []:
            if not isinstance(tc, Mapping):
                continue
            function = tc.get("function") if isinstance(tc.get("function"), Mapping) else tc
            tool_calls.append(
                (str(function.get("name") or "?"), _arguments(function.get("arguments")), str(tc.get("id") or ""))
            )
        reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
        self.add(
            role,
            text_of(message.get("content")),
            call=call if role == "assistant" else None,
            tool_calls=tool_calls,
            tool_call_id=message.get("tool_call_id"),
            reasoning=reasoning if isinstance(reasoning, str) else text_of(reasoning),
        )

    def responses_item(self, item: Any, call: int | None = None) -> None:
        """A Responses API input or output item."""
        if isinstance(item, str):
            self.add("user", item)
            return
        if not isinstance(item, Mapping):
            return
        kind = item.get("type")
        if kind == "function_call":
            self.add(
                "assistant",
                call=call,
                tool_calls=[
                    (str(item.get("name") or "?"), _arguments(item.get("arguments")), str(item.get("call_id") or ""))
                ],
            )
        elif kind == "function_call_output":
            self.add("tool", text_of(item.get("output")), tool_call_id=item.get("call_id"))
        elif kind == "reasoning":
            summary = text_of(item.get("summary")) or text_of(item.get("content"))
            self.add("assistant", call=call, reasoning=summary or "[reasoning]")
        elif kind in (None, "message") or "role" in item:
            role = str(item.get("role") or "assistant")
            self.add(role, text_of(item.get("content")), call=call if role == "assistant" else None)
        else:
            self.add("assistant" if call is not None else "user", f"[{kind}]", call=call)


def _token_summary(prompt_ids: Any, completion_ids: Any, logprobs: Any) -> list[Any] | None:
    if not completion_ids and not prompt_ids:
        return None
    values = [float(v) for v in logprobs or [] if isinstance(v, int | float) and math.isfinite(v)]
    mean = round(math.fsum(values) / len(values), 4) if values else None
    return [len(prompt_ids or []), len(completion_ids or []), mean, round(min(values), 4) if values else None]


def _params(request: Mapping[str, Any]) -> str:
    parts = []
    for key, value in request.items():
        if key in _PARAM_SKIP or value is None or value == {} or value == []:
            continue
        parts.append(f"{key}={json.dumps(value, ensure_ascii=False)}")
    return " ".join(parts)[:400]


def _error_text(error: Any) -> str | None:
    if not error:
        return None
    if isinstance(error, Mapping):
        return f"{error.get('type', 'error')}: {error.get('message', '')}"
    return str(error)


def from_policy_calls(calls: Sequence[Mapping[str, Any]], strings: Strings | None) -> dict[str, Any]:
    """The transcript of a rollout saved with ``--save-trace``: each call's new input, then its reply."""
    builder = _Builder(strings)
    out_calls: list[dict[str, Any]] = []
    tools: list[str] = []
    previous_len = 0
    for position, call in enumerate(calls):
        request = call.get("request") if isinstance(call.get("request"), Mapping) else {}
        if "messages" in request:  # Chat Completions shape
            items, chat = list(request.get("messages") or []), True
        else:
            raw = request.get("input")
            items, chat = ([raw] if isinstance(raw, str) else list(raw or [])), False
        if position == 0:
            instructions = request.get("instructions")
            if isinstance(instructions, str) and instructions:
                builder.add("system", instructions)
            tools = [
                str(t.get("name") or (t.get("function") or {}).get("name") or "?")
                for t in request.get("tools") or []
                if isinstance(t, Mapping)
            ]
            new = items
        else:
            new = items[previous_len:] if len(items) >= previous_len else items
        previous_len = len(items)
        for item in new:
            # The previous replies come back in the next request: shown once, as replies.
            echo = isinstance(item, Mapping) and (
                item.get("role") == "assistant" or item.get("type") in ("function_call", "reasoning")
            )
            if position > 0 and echo:
                continue
            if chat and isinstance(item, Mapping):
                builder.chat_message(item)
            else:
                builder.responses_item(item)
        response = call.get("response")
        if isinstance(response, Mapping):
            for item in response.get("output") or []:
                builder.responses_item(item, call=position)
        usage = call.get("usage") or (response.get("usage") if isinstance(response, Mapping) else None) or {}
        entry: dict[str, Any] = {"lat": _round(call.get("latency_s"))}
        _usage_into(entry, usage)
        if call.get("finish_reason"):
            entry["fin"] = call["finish_reason"]
        error = _error_text(call.get("error"))
        if error:
            entry["err"] = ref(strings, error)
        if call.get("attempts") and call["attempts"] > 1:
            entry["att"] = call["attempts"]
        params = _params(request)
        if params:
            entry["p"] = ref(strings, params)
        tok = _token_summary(
            call.get("prompt_token_ids"), call.get("completion_token_ids"), call.get("completion_logprobs")
        )
        if tok:
            entry["tok"] = tok
        out_calls.append(entry)
    return {"m": builder.finish(), "c": out_calls, "tools": tools}


def from_messages(prompt: Iterable[Any], completion: Iterable[Any], strings: Strings | None) -> dict[str, Any]:
    """The transcript of a rollout saved without its policy calls: prompt and completion messages,
    each assistant message numbered as one reply."""
    builder = _Builder(strings)
    for message in prompt or []:
        if isinstance(message, Mapping):
            builder.chat_message(message)
    turn = 0
    for message in completion or []:
        if not isinstance(message, Mapping):
            continue
        if message.get("role") == "assistant":
            builder.chat_message(message, call=turn)
            turn += 1
        else:
            builder.chat_message(message)
    return {"m": builder.finish(), "c": [], "tools": []}


def from_trace_nodes(trace: Mapping[str, Any], strings: Strings | None) -> dict[str, Any]:
    """The transcript of a verifiers trace: its message nodes in order, each reply tied to its call."""
    builder = _Builder(strings)
    calls = [c for c in trace.get("calls") or [] if isinstance(c, Mapping)]
    call_of_node = {c.get("node"): position for position, c in enumerate(calls)}
    out_calls: list[dict[str, Any]] = [{} for _ in calls]
    tools: list[str] = []
    for number, node in enumerate(trace.get("nodes") or []):
        if not isinstance(node, Mapping):
            continue
        if node.get("tools") and not tools:
            tools = [str(t.get("name") or "?") for t in node["tools"] if isinstance(t, Mapping)]
        message = node.get("message")
        if not isinstance(message, Mapping):
            continue
        call = call_of_node.get(number)
        builder.chat_message(message, call=call)
        if call is not None and node.get("token_ids"):
            out_calls[call]["tok"] = _token_summary(None, node.get("token_ids"), node.get("logprobs"))
    for position, call in enumerate(calls):
        entry = out_calls[position]
        timing = call.get("time") or {}
        if isinstance(timing.get("start"), int | float) and isinstance(timing.get("end"), int | float):
            entry["lat"] = _round(timing["end"] - timing["start"])
        _usage_into(entry, call.get("usage") or {})
        if call.get("finish_reason"):
            entry["fin"] = call["finish_reason"]
        params = " ".join(f"{k}={json.dumps(v)}" for k, v in (call.get("sampling") or {}).items() if v is not None)
        if params:
            entry["p"] = ref(strings, params[:400])
    return {"m": builder.finish(), "c": out_calls, "tools": tools}


def _usage_into(entry: dict[str, Any], usage: Mapping[str, Any]) -> None:
    tokens_in = usage.get("input_tokens", usage.get("prompt_tokens"))
    tokens_out = usage.get("output_tokens", usage.get("completion_tokens"))
    if isinstance(tokens_in, int):
        entry["in"] = tokens_in
    if isinstance(tokens_out, int):
        entry["out"] = tokens_out


def _round(value: Any) -> float | None:
    return round(float(value), 4) if isinstance(value, int | float) else None
