"""Token IDs, logprobs and finish reason of one policy call, read the same way whichever API answered.

vLLM returns token data only when asked, and in a different place per API:

- Chat Completions: ``logprobs: true`` gives ``choices[0].logprobs.content[].logprob``;
  ``return_token_ids: true`` gives the top-level ``prompt_token_ids`` and ``choices[0].token_ids``
  (the end token included, with its logprob).
- Responses: ``enable_response_messages: true`` gives ``input_messages[].tokens`` and
  ``output_messages[].tokens``; ``include: ["message.output_text.logprobs"]`` gives
  ``output[].content[].logprobs[]``, on output text only: a turn that is only a tool call has none.

``ask_for_token_data`` adds those request fields (``Endpoint(return_tokens=True)``); the readers
return a ``TokenData`` in one shape: completion logprobs are one per completion token, and the finish
reason uses the Chat Completions words (``stop``, ``length``, ``tool_calls``, ``content_filter``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from .gym_schema import TRAINING_FIELDS

OUTPUT_LOGPROBS = "message.output_text.logprobs"
"""The Responses ``include`` value that asks for the logprobs of output text."""

RETURN_TOKENS_ARG = "return_tokens"
"""Sampling-arg spelling of ``Endpoint.return_tokens`` (never forwarded upstream)."""


@dataclass(frozen=True, slots=True)
class TokenData:
    """What a trainer needs from one call; ``None`` where the upstream did not say."""

    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    completion_logprobs: list[float] | None = None
    finish_reason: str | None = None

    @property
    def complete(self) -> bool:
        """Whether prompt and completion token IDs and completion logprobs are all known."""
        return (
            self.prompt_token_ids is not None
            and self.completion_token_ids is not None
            and self.completion_logprobs is not None
        )

    def training_fields(self) -> dict[str, list[Any]]:
        """Gym's training fields for an output item (empty unless ``complete``)."""
        if not self.complete:
            return {}
        return {
            "prompt_token_ids": list(self.prompt_token_ids or ()),
            "generation_token_ids": list(self.completion_token_ids or ()),
            "generation_log_probs": list(self.completion_logprobs or ()),
        }


# -- asking ------------------------------------------------------------------------------------


def pop_return_tokens(body: dict[str, Any]) -> bool:
    """Remove the ``return_tokens`` sampling arg from ``body``; whether it asked for token data."""
    return bool(body.pop(RETURN_TOKENS_ARG, False))


def ask_for_token_data(api: Literal["responses", "chat"], body: dict[str, Any]) -> None:
    """Add, in place, the vLLM request fields that return prompt/completion token IDs and logprobs.

    Values the request already sets win (e.g. an explicit ``logprobs: false``).
    """
    if api == "chat":
        body.setdefault("logprobs", True)
        body.setdefault("return_token_ids", True)
    else:
        body.setdefault("enable_response_messages", True)
        include = body.get("include")
        include = list(include) if isinstance(include, list | tuple) else []
        if OUTPUT_LOGPROBS not in include:
            include.append(OUTPUT_LOGPROBS)
        body["include"] = include
    make_logprob_fields_consistent(api, body)


def make_logprob_fields_consistent(api: Literal["responses", "chat"], body: dict[str, Any]) -> None:
    """Make the logprob fields a request vLLM accepts and honours.

    Chat: ``top_logprobs`` needs ``logprobs: true`` (vLLM answers 400 otherwise), so it is set unless
    the request says ``logprobs: false``, which then drops ``top_logprobs``. Responses: logprobs are
    computed for ``top_logprobs`` top entries, and a null ``top_logprobs`` with the logprobs
    ``include`` makes vLLM fail; it becomes 0 (the sampled token's logprob only).
    """
    if api == "chat":
        if body.get("top_logprobs") is None:
            body.pop("top_logprobs", None)
        elif body.get("logprobs") is False:
            del body["top_logprobs"]
        else:
            body["logprobs"] = True
    elif OUTPUT_LOGPROBS in (body.get("include") or ()) and body.get("top_logprobs") is None:
        body["top_logprobs"] = 0


# -- reading -----------------------------------------------------------------------------------


def _int_list(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return list(value)
    return None


def _float_list(value: Any) -> list[float] | None:
    if isinstance(value, list) and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value):
        return [float(v) for v in value]
    return None


def from_chat(data: Mapping[str, Any], choice: Mapping[str, Any]) -> TokenData:
    """Token data of a Chat Completions reply's ``choice`` (vLLM extensions, or nemo-gym's own
    ``prompt_token_ids`` / ``generation_token_ids`` / ``generation_log_probs`` on the message)."""
    message = choice.get("message") or {}
    prompt = _int_list(data.get("prompt_token_ids"))
    if prompt is None:
        prompt = _int_list(message.get("prompt_token_ids"))
    completion = _int_list(choice.get("token_ids"))
    if completion is None:
        completion = _int_list(message.get("generation_token_ids"))
    content = (choice.get("logprobs") or {}).get("content")
    logprobs = _float_list(message.get("generation_log_probs"))
    if logprobs is None and isinstance(content, list):
        logprobs = _float_list([entry.get("logprob") for entry in content if isinstance(entry, dict)])
        if logprobs is not None and len(logprobs) != len(content):
            logprobs = None
    if completion is None and isinstance(content, list) and content:
        # vLLM's --return-tokens-as-token-ids renders each logprob token as "token_id:<id>".
        tokens = [entry.get("token") for entry in content if isinstance(entry, dict)]
        if len(tokens) == len(content) and all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
            completion = [int(t.removeprefix("token_id:")) for t in tokens]
    return TokenData(prompt, completion, _aligned(logprobs, completion), choice.get("finish_reason"))


def _joined_tokens(messages: Any) -> list[int] | None:
    """The token IDs of vLLM's ``input_messages`` / ``output_messages`` (``raw_message_tokens``
    entries), concatenated; ``None`` when any entry has none (e.g. harmony messages)."""
    if not isinstance(messages, list) or not messages:
        return None
    tokens: list[int] = []
    for message in messages:
        ids = _int_list(message.get("tokens")) if isinstance(message, dict) else None
        if ids is None:
            return None
        tokens.extend(ids)
    return tokens


def output_text_logprobs(response: Mapping[str, Any]) -> list[float] | None:
    """The logprobs of every output text part, in order (``None`` if no part has any)."""
    found = False
    logprobs: list[float] = []
    for item in response.get("output") or ():
        if not isinstance(item, dict) or item.get("type") != "message":
            continue
        for part in item.get("content") or ():
            entries = part.get("logprobs") if isinstance(part, dict) else None
            if not isinstance(entries, list):
                continue
            values = _float_list([entry.get("logprob") if isinstance(entry, dict) else None for entry in entries])
            if values is None:
                return None
            found = True
            logprobs.extend(values)
    return logprobs if found else None


def responses_finish_reason(response: Mapping[str, Any]) -> str | None:
    """A Responses object's outcome in Chat Completions words."""
    status = response.get("status")
    if status == "incomplete":
        reason = (response.get("incomplete_details") or {}).get("reason")
        return "content_filter" if reason == "content_filter" else "length"
    if status not in (None, "completed"):
        return None
    output = response.get("output") or ()
    if any(isinstance(item, dict) and item.get("type") == "function_call" for item in output):
        return "tool_calls"
    return "stop"


def from_responses(response: Mapping[str, Any]) -> TokenData:
    """Token data of a Responses reply: vLLM's response messages and output text logprobs, else the
    training fields of the last output item carrying them (a Gym-style model server)."""
    prompt = _joined_tokens(response.get("input_messages"))
    completion = _joined_tokens(response.get("output_messages"))
    logprobs = output_text_logprobs(response)
    if prompt is None and completion is None and logprobs is None:
        for item in reversed(response.get("output") or ()):
            if isinstance(item, dict) and item.get("prompt_token_ids") is not None:
                prompt = _int_list(item.get("prompt_token_ids"))
                completion = _int_list(item.get("generation_token_ids"))
                logprobs = _float_list(item.get("generation_log_probs"))
                break
    return TokenData(prompt, completion, _aligned(logprobs, completion), responses_finish_reason(response))


def _aligned(logprobs: list[float] | None, completion: list[int] | None) -> list[float] | None:
    """Logprobs only when they are one per completion token (or the tokens are unknown)."""
    if logprobs is not None and completion is not None and len(logprobs) != len(completion):
        return None
    return logprobs


def strip_training_fields(items: Any) -> None:
    """Remove, in place, Gym's training fields from request input items (no upstream takes them)."""
    if not isinstance(items, list):
        return
    for item in items:
        if isinstance(item, dict):
            for name in TRAINING_FIELDS:
                item.pop(name, None)
