"""A model turn written as the model would have sampled it: an assistant message rendered to completion token IDs
by the renderer a training client uses, and read back the way the training client reads a completion.

A typed renderer (``qwen3``, ...) marks which tokens of a rendered assistant message the model samples
(``sampled_mask``): those are the completion. A template renderer (``DefaultRenderer`` and custom renderers built on
it) marks none; there the completion is what rendering the message adds after the generation prompt, up to and with
the first stop token. Either way the completion is parsed back (``parse_response``) and compared with the message:
a turn the renderer cannot carry (it parses back as something else) is said, not hidden."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

_CONTEXT = {"role": "user", "content": "."}
"""The conversation a turn is rendered after: a typed renderer writes the last assistant turn after a user query
whole (reasoning included), as a model samples it."""


@dataclass(frozen=True)
class Completion:
    """A turn's completion tokens, how the engine ends it, and whether it reads back as the turn."""

    token_ids: list[int]
    finish_reason: str
    """``stop``, or ``length`` for a turn the recording ends cut short (no stop token then)."""
    mismatch: str | None = None
    """How the renderer reads the tokens back differently from the turn (None: exactly as the turn)."""


class CompletionWriter:
    """Writes assistant messages as a renderer's completion tokens (``renderer``: a ``renderers`` renderer)."""

    def __init__(self, renderer: Any) -> None:
        self.renderer = renderer
        self.stop_ids = set(renderer.get_stop_token_ids())

    def write(self, message: dict[str, Any], *, cut: bool = False, max_tokens: int | None = None) -> Completion:
        """``message`` as completion tokens; ``cut``: the model ran out of tokens on it (no stop token), and
        ``max_tokens`` cuts it there as an engine would."""
        ids = self._completion_ids(message)
        finish = "stop"
        if cut:
            while ids and ids[-1] in self.stop_ids:
                ids.pop()
            finish = "length"
        if max_tokens is not None and len(ids) > max_tokens:
            ids, finish = ids[:max_tokens], "length"
        mismatch = None if finish == "length" else self.read_back_mismatch(ids, message)
        return Completion(ids, finish, mismatch)

    def _completion_ids(self, message: dict[str, Any]) -> list[int]:
        rendered = self.renderer.render([_CONTEXT, message])
        if rendered.sampled_mask:
            return [
                token
                for token, owner, sampled in zip(
                    rendered.token_ids, rendered.message_indices, rendered.sampled_mask, strict=True
                )
                if sampled and owner == 1
            ]
        prompt = self.renderer.render([_CONTEXT], add_generation_prompt=True).token_ids
        full = rendered.token_ids
        if full[: len(prompt)] != prompt:
            raise ValueError(
                f"{type(self.renderer).__name__} renders an assistant turn that does not continue its generation "
                "prompt, so its completion tokens cannot be told apart"
            )
        completion = full[len(prompt) :]
        for position, token in enumerate(completion):
            if token in self.stop_ids:
                return completion[: position + 1]
        return completion

    def read_back_mismatch(self, token_ids: list[int], message: dict[str, Any]) -> str | None:
        """How the renderer parses ``token_ids`` back differently from ``message``, or None."""
        parsed = self.renderer.parse_response(token_ids)
        got = {
            "content": parsed.content or "",
            "reasoning_content": (parsed.reasoning_content or "").strip(),
            "tool_calls": [(call.name, _canonical(call.arguments)) for call in parsed.tool_calls],
        }
        want = {
            "content": message.get("content") or "",
            "reasoning_content": (message.get("reasoning_content") or "").strip(),
            "tool_calls": [
                (call["function"]["name"], _canonical(call["function"].get("arguments")))
                for call in message.get("tool_calls") or ()
            ],
        }
        differing = [name for name in want if got[name] != want[name]]
        if not differing:
            return None
        return "; ".join(f"{name} {_clip(want[name])} reads back as {_clip(got[name])}" for name in differing)


def _canonical(arguments: Any) -> str:
    """Tool-call arguments compared as JSON values (key order and spacing aside), as verifiers compares them."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return arguments
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"))


def _clip(value: Any, limit: int = 80) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    text = json.dumps(text) if isinstance(value, str) else text
    return text if len(text) <= limit else text[: limit - 3] + "..."
