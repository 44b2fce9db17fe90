"""A recorded rollout as the turns a model sampled: each step's Responses output items as one Chat Completions
assistant message (what verifiers' training client parses a completion into, and what the replay engine writes as
tokens). Pure data: no tokenizer here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._protocol.chat import input_to_messages
from .._replay.recordings import Recording


@dataclass(frozen=True)
class RecordedTurn:
    """One model call of a recording: the assistant message it produced, and whether the call ended cut short
    (the recording's last call with ``incomplete_details``: the model ran out of tokens)."""

    message: dict[str, Any]
    cut: bool = False


def recorded_turns(recording: Recording) -> list[RecordedTurn]:
    """The recording's model calls in order (a step: the items the model produced between two things the agent
    added itself; see ``Recording.step``)."""
    turns: list[RecordedTurn] = []
    done = 0
    while True:
        step = recording.step(done)
        if step is None:
            if done < len(recording.output):  # agent-written items between steps (tool results): skip them
                done += 1
                continue
            return turns
        items, last = step
        cut = bool(last and recording.incomplete_details)
        turns.append(RecordedTurn(assistant_message(items), cut))
        done += len(items)


def assistant_message(items: list[dict[str, Any]]) -> dict[str, Any]:
    """A step's output items (reasoning, text, function calls, in any order) as the one assistant message a model
    turn is: reasoning joined, text joined, every call in order."""
    reasoning: list[str] = []
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for message in input_to_messages(items, reasoning_fields=("reasoning_content",)):
        if message.get("reasoning_content"):
            reasoning.append(message["reasoning_content"])
        if message.get("content"):
            texts.append(message["content"])
        calls.extend(message.get("tool_calls") or ())
    merged: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or (None if calls else "")}
    if reasoning:
        merged["reasoning_content"] = "\n".join(reasoning)
    if calls:
        merged["tool_calls"] = calls
    return merged
