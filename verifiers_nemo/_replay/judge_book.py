"""Recorded judge calls, and the answer a replayed judge request gets from them.

Judge environments record what their judge said next to each rollout, in one of these shapes:

* ``judge_evaluations: [{"responses_create_params": ..., "response": ...}]`` or
  ``judge_responses_create_params`` + ``judge_response``: the whole request and response;
* ``rubric_evaluations: [{"judge_prompt": ..., "judge_response": ...}]``: the user prompt and the
  judge's text;
* ``judge_output``: only the judge's text, next to the ``extracted_answer`` the judge was shown.

A replayed judge request is matched on what it asks (its ``input``, or ``messages`` for Chat
Completions), never on ``model``, sampling keys or ids, which a replay legitimately changes.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .._tasks.recorded import input_key

JUDGE_PATH = "/judge/{name}/v1"
"""Where a judge endpoint of the replay server lives; policy calls go to ``/v1``."""

_QUESTION_FIELDS = ("question", "problem")


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text") or "" for part in content if isinstance(part, dict))
    return ""


def request_text(items: Any) -> str:
    """All the text of a request's messages, joined by newlines."""
    if isinstance(items, str):
        return items
    return "\n".join(_text_of(item.get("content")) for item in items or [] if isinstance(item, dict))


def _last_user_text(items: Any) -> str | None:
    if isinstance(items, str):
        return items
    users = [item for item in items or [] if isinstance(item, dict) and item.get("role") == "user"]
    return _text_of(users[-1].get("content")) if users else None


def response_text(response: dict[str, Any]) -> str:
    """The text of a Responses object's messages (reasoning left out)."""
    return "".join(
        _text_of(item.get("content")) for item in response.get("output") or [] if item.get("type") == "message"
    )


def responses_object(text: str, model: str) -> dict[str, Any]:
    """A completed Responses object whose one message says ``text``."""
    return {
        "id": f"resp_replay_judge_{abs(hash(text)):x}",
        "object": "response",
        "created_at": int(time.time()),
        "model": model,
        "status": "completed",
        "incomplete_details": None,
        "output": [
            {
                "id": "msg_replay_judge",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": None,
    }


def chat_completion_object(text: str, model: str) -> dict[str, Any]:
    """A Chat Completions object whose one choice says ``text``."""
    return {
        "id": f"chatcmpl-replay-judge-{abs(hash(text)):x}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}, "logprobs": None}
        ],
        "usage": None,
    }


@dataclass(frozen=True)
class JudgeCall:
    """One recorded judge call: how a request is recognised as it, and what the judge answered.

    Exactly one of ``input_key`` (the whole recorded input), ``prompt`` (the recorded user prompt)
    or ``anchors`` (texts the prompt contained, when only the judge's text was kept) identifies it.
    ``response`` is the recorded Responses object, or ``None`` when only ``text`` was kept.
    """

    text: str
    response: dict[str, Any] | None = None
    input_key: str | None = None
    prompt: str | None = None
    anchors: tuple[str, ...] = ()


def judge_calls(row: dict[str, Any]) -> list[JudgeCall]:
    """The judge calls a recorded rollout carries (none when it kept no judge I/O)."""
    calls = []
    pairs = [
        (e.get("responses_create_params"), e.get("response"))
        for e in row.get("judge_evaluations") or []
        if isinstance(e, dict)
    ]
    pairs.append((row.get("judge_responses_create_params"), row.get("judge_response")))
    for params, response in pairs:
        if isinstance(params, dict) and isinstance(response, dict):
            key = input_key(params.get("input"))
            calls.append(JudgeCall(text=response_text(response), response=response, input_key=key))
    for evaluation in row.get("rubric_evaluations") or []:
        if isinstance(evaluation, dict) and isinstance(evaluation.get("judge_prompt"), str):
            text = evaluation.get("judge_response")
            if isinstance(text, str):
                calls.append(JudgeCall(text=text, prompt=evaluation["judge_prompt"]))
    output = row.get("judge_output")
    if isinstance(output, str):
        question = next((row[f] for f in _QUESTION_FIELDS if isinstance(row.get(f), str) and row[f]), None)
        answer = row.get("extracted_answer")
        anchors = tuple(a for a in (question, answer) if isinstance(a, str) and a)
        if question is not None:
            calls.append(JudgeCall(text=output, anchors=anchors))
    return calls


class JudgeBook:
    """Every recorded judge call of a replay, looked up by what a judge request asks."""

    def __init__(self, calls: Iterable[JudgeCall]) -> None:
        self.calls = list(calls)
        self._by_input: dict[str, JudgeCall] = {}
        self._by_prompt: dict[str, JudgeCall] = {}
        self._by_anchors: list[JudgeCall] = []
        for call in self.calls:
            if call.input_key is not None:
                self._by_input.setdefault(call.input_key, call)
            elif call.prompt is not None:
                self._by_prompt.setdefault(call.prompt, call)
            else:
                self._by_anchors.append(call)

    def __len__(self) -> int:
        return len(self.calls)

    def find(self, items: Any) -> JudgeCall | None:
        """The recorded call that asked ``items``: the same input, else the same user prompt, else
        the text-only recording whose question and answer the prompt holds (the most specific)."""
        call = self._by_input.get(input_key(items))
        if call is None:
            prompt = _last_user_text(items)
            call = self._by_prompt.get(prompt) if prompt is not None else None
        if call is None:
            text = request_text(items)
            held = [c for c in self._by_anchors if all(anchor in text for anchor in c.anchors)]
            call = max(held, key=lambda c: sum(map(len, c.anchors)), default=None)
        return call
