"""``ExactTokensUpstream``: every turn generated from the exact token IDs the policy already produced.

Through the chat endpoint, a multi-turn rollout drifts: each turn's prompt is the chat template applied to the
*parsed* history, so a tool call's arguments come back re-serialised (``{"a": []}`` where the model sampled
``{\\n  "a": [\\n  ]}``) and the next prompt holds tokens the model never sampled. This upstream uses the three
routes a stock vLLM (>= 0.32, started with ``--enable-scale-out``) serves instead:

1. ``POST {base_url}/chat/completions/render``: the converted chat request → the prompt's token IDs and the
   sampling parameters the chat endpoint would use (``tool_choice`` ``required`` / a named function included, as
   structured outputs);
2. ``POST {server}/inference/v1/generate``: those parameters with *our* token IDs → the sampled token IDs and
   their logprobs;
3. ``POST {base_url}/chat/completions/derender``: the generated tokens and the chat request → the Chat
   Completion the server's own tool and reasoning parsers make of them, converted back to a Responses reply.

The first turn of a rollout is generated from the rendered prompt. A later turn (its input holds an output item
this upstream minted) is generated from the previous turn's exact prompt + completion tokens, followed by the
template's glue after an assistant turn (its end-of-turn token when the model did not sample it) and the rendered
tokens that are new since that turn (tool results, user turns, the next assistant header). Where the history
cannot be spliced safely (the agent changed it, the template rewrites it, this upstream forgot the rollout), the
turn is generated from the plain rendering and a warning says why: ``check_contiguity`` then shows the break.

Every reply's ``prompt_token_ids`` / ``completion_token_ids`` / ``completion_logprobs`` are the IDs generate
was given and returned, and the logprobs the server reported for them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from array import array
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from .._endpoint import Endpoint
from .._exceptions import UpstreamError, UpstreamHTTPError, UpstreamProtocolError
from .._protocol.chat import chat_completion_to_response, responses_to_chat_request
from .._protocol.codec import dumps, loads
from .._protocol.gym_schema import TRAINING_FIELDS
from .._protocol.responses import incomplete_response
from .._protocol.token_data import TokenData, pop_return_tokens
from .base import RetryPolicy, UpstreamReply
from .chat import ChatCompletionsUpstream
from .http import headers_for, post_json, snippet

logger = logging.getLogger(__name__)

FLAG_HINT = "exact-token mode (--exact-tokens, Endpoint(exact_tokens=True))"
"""How the user turned this mode on, for error messages."""

# Chat request fields that change how the template renders a conversation (kept on the auxiliary renders).
_TEMPLATE_FIELDS = (
    "tools",
    "tool_choice",
    "chat_template",
    "chat_template_kwargs",
    "documents",
    "reasoning_effort",
    "response_format",
    "add_special_tokens",
)
_OVERFLOW_HINTS = ("context length", "context_length", "context window", "maximum context", "maximum model length")


class ExactTokensUnsupported(UpstreamHTTPError):
    """The server has no render / generate / derender routes (not vLLM >= 0.32, or no ``--enable-scale-out``)."""


@dataclass(slots=True)
class _Turn:
    """What a later turn of the same rollout needs from this one."""

    tokens: array[int]
    """The exact prompt + completion token IDs of this turn."""
    messages: list[dict[str, Any]]
    """The chat history through this turn's assistant message, as the next request will convert it."""
    template: bytes
    """The template-shaping request fields (tools, tool choice, template kwargs), serialised."""
    closing: list[int] | None
    """The template's tokens after an assistant turn's content (``<|im_end|>\\n``), once known."""
    keys: tuple[str, ...] = ()


@dataclass(slots=True)
class _Splice:
    prompt: list[int]
    closing: list[int] | None
    reason: str | None = None
    """Why the turn could not be spliced (then ``prompt`` is the plain rendering)."""


def _server_root(base_url: str) -> str:
    """``http://host:8000/v1`` → ``http://host:8000`` (generate lives outside the OpenAI prefix)."""
    parts = urlsplit(base_url)
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


class _Overflow(Exception):
    """The prompt does not fit the model's context (a 400 saying so)."""


def _longest_closing_prefix(tokens: Sequence[int], closing: Sequence[int]) -> int:
    """The largest ``j`` such that ``tokens`` ends with ``closing[:j]`` (the part of the glue the model sampled)."""
    for j in range(min(len(closing), len(tokens)), 0, -1):
        if list(tokens[len(tokens) - j :]) == list(closing[:j]):
            return j
    return 0


def _starts_with(sequence: Sequence[int], prefix: Sequence[int]) -> bool:
    return len(sequence) >= len(prefix) and list(sequence[: len(prefix)]) == list(prefix)


def _item_keys(items: Sequence[Any]) -> list[str]:
    keys = []
    for item in items:
        if isinstance(item, dict):
            for name in ("id", "call_id"):
                value = item.get(name)
                if isinstance(value, str) and value:
                    keys.append(value)
    return keys


class ExactTokensUpstream(ChatCompletionsUpstream):
    """Generates every turn from exact token IDs through vLLM's render / generate / derender routes.

    ``max_turns`` bounds how many rollouts' latest turns are remembered (least recently used first out); a
    rollout that is forgotten continues from the plain rendering (a contiguity break, logged). The request and
    reply conversion is the chat upstream's (``max_tokens_field``, ``reasoning_fields``); a prompt longer than
    the context becomes an empty incomplete answer when ``context_overflow_as_incomplete`` is set.
    """

    def __init__(self, retry: RetryPolicy | None = None, *, max_turns: int = 8192, **conversion: Any) -> None:
        """``conversion``: the chat upstream's options (``max_tokens_field``, ``reasoning_fields``,
        ``context_overflow_as_incomplete``), whose request and reply conversion this upstream shares."""
        super().__init__(retry, **conversion)
        self.max_turns = max_turns
        self._turns: OrderedDict[str, _Turn] = OrderedDict()

    # -- the rollout's memory ------------------------------------------------------------------

    def _previous_turn(self, items: Any) -> _Turn | None:
        if not isinstance(items, list):
            return None
        for item in reversed(items):
            for key in _item_keys([item]):
                turn = self._turns.get(key)
                if turn is not None:
                    self._turns.move_to_end(key)
                    return turn
        return None

    def _remember(self, turn: _Turn, previous: _Turn | None) -> None:
        if previous is not None:  # a rollout goes on from its latest turn only
            for key in previous.keys:
                self._turns.pop(key, None)
        for key in turn.keys:
            self._turns[key] = turn
        while len(self._turns) > self.max_turns:
            self._turns.popitem(last=False)

    @property
    def remembered_turns(self) -> int:
        """How many turns are remembered (one per rollout in flight, normally)."""
        return len({id(turn) for turn in self._turns.values()})

    # -- HTTP ----------------------------------------------------------------------------------

    async def _post(
        self,
        session: aiohttp.ClientSession,
        endpoint: Endpoint,
        url: str,
        payload: dict[str, Any],
        deadline: float,
        attempts: list[int],
        sent: dict[str, Any],
    ) -> Any:
        loop = asyncio.get_running_loop()
        retry = dataclasses.replace(self.retry, timeout=max(0.001, deadline - loop.time()))
        result = await post_json(
            session, url, dumps(payload), headers_for(endpoint), retry, secret=endpoint.api_key, request=sent
        )
        attempts.append(result.attempts)
        facts = {"upstream_status": result.status, "attempts": sum(attempts), "request": sent}
        if result.status == 404 and b"Not Found" in result.body[:200] and b"model" not in result.body[:200]:
            raise ExactTokensUnsupported(
                f"{url} answered 404: {FLAG_HINT} needs vLLM >= 0.32 started with --enable-scale-out "
                "(POST /v1/chat/completions/render, /inference/v1/generate, /v1/chat/completions/derender); "
                "start the server with it, or turn exact tokens off",
                **facts,
            )
        if result.status >= 400:
            text = result.body[:4096].decode("utf-8", errors="replace").lower()
            if result.status == 400 and any(hint in text for hint in _OVERFLOW_HINTS):
                raise _Overflow()
            raise UpstreamHTTPError(
                f"{url} refused the request: HTTP {result.status}: {snippet(result.body, endpoint.api_key)}",
                **facts,
            )
        try:
            data = loads(result.body)
        except ValueError:
            raise UpstreamProtocolError(
                f"{url} answered HTTP {result.status} with a body that is not JSON: "
                f"{snippet(result.body, endpoint.api_key)}",
                **facts,
            ) from None
        if not isinstance(data, dict):
            raise UpstreamProtocolError(f"{url} answered a JSON {type(data).__name__}, not an object", **facts)
        return data

    async def _render(self, post: Any, url: str, chat: dict[str, Any]) -> dict[str, Any]:
        rendered = await post(url, chat)
        ids = rendered.get("token_ids")
        if not isinstance(ids, list) or not ids or not all(isinstance(t, int) for t in ids):
            raise UpstreamProtocolError(f"{url} answered without token_ids: {str(rendered)[:200]}")
        return rendered

    # -- the splice ----------------------------------------------------------------------------

    async def _splice(self, render: Any, chat: dict[str, Any], full: list[int], previous: _Turn) -> _Splice:
        messages = chat["messages"]
        n = len(previous.messages)
        template = {k: chat[k] for k in _TEMPLATE_FIELDS if k in chat}
        if dumps(template) != previous.template:
            return _Splice(full, None, "the tools or template arguments changed since the previous turn")
        if len(messages) <= n or messages[:n] != previous.messages:
            return _Splice(full, None, "the history differs from what the previous turn returned")
        base = {"model": chat.get("model"), **template}
        history = {**base, "messages": messages[:n], "add_generation_prompt": False}
        closing = previous.closing
        if closing is None:
            # The template's tokens after an assistant message's content: an empty assistant turn, minus the
            # generation prompt before it.
            empty_turn = [*messages[: n - 1], {"role": "assistant", "content": ""}]
            rendered, header, empty = await asyncio.gather(
                render(history),
                render({**base, "messages": messages[: n - 1], "add_generation_prompt": True}),
                render({**base, "messages": empty_turn, "add_generation_prompt": False}),
            )
            header_ids, empty_ids = header["token_ids"], empty["token_ids"]
            if not _starts_with(empty_ids, header_ids) or len(empty_ids) == len(header_ids):
                return _Splice(full, None, "the template's end of an assistant turn could not be found")
            closing = list(empty_ids[len(header_ids) :])
        else:
            rendered = await render(history)
        history_ids = rendered["token_ids"]
        if not _starts_with(full, history_ids):
            return _Splice(full, closing, "the template renders the history differently once more is added")
        if list(history_ids[len(history_ids) - len(closing) :]) != closing:
            return _Splice(full, closing, "the rendered history does not end with the template's end of turn")
        sampled = _longest_closing_prefix(previous.tokens, closing)
        prompt = [*previous.tokens, *closing[sampled:], *full[len(history_ids) :]]
        return _Splice(prompt, closing)

    # -- the call ------------------------------------------------------------------------------

    async def create_response(
        self, session: aiohttp.ClientSession, endpoint: Endpoint, body: dict[str, Any]
    ) -> UpstreamReply:
        pop_return_tokens(body)  # token data is what this upstream is for
        chat = self.chat_request(body)
        for name in ("return_token_ids", "stream", "n"):
            chat.pop(name, None)
        chat["logprobs"] = True  # the sampled tokens' logprobs (top_logprobs stays the caller's, default 0)

        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.retry.timeout
        attempts: list[int] = []
        base_url, root = endpoint.base_url, _server_root(endpoint.base_url)
        render_url = f"{base_url}/chat/completions/render"

        async def post(url: str, payload: dict[str, Any]) -> Any:
            return await self._post(session, endpoint, url, payload, deadline, attempts, chat)

        async def render(payload: dict[str, Any]) -> dict[str, Any]:
            return await self._render(post, render_url, payload)

        items = body.get("input")
        previous = self._previous_turn(items)
        try:
            rendered = await render(chat)
            full = list(rendered["token_ids"])
            splice = _Splice(full, None)
            if previous is not None:
                splice = await self._splice(render, chat, full, previous)
                if splice.reason is not None:
                    logger.warning("exact tokens: generating from the plain rendering: %s", splice.reason)
            elif isinstance(items, list) and any(
                isinstance(i, dict) and (i.get("role") == "assistant" or i.get("type") == "function_call")
                for i in items
            ):
                logger.info("exact tokens: a conversation with history this upstream did not produce starts here")
            prompt = splice.prompt

            request = dict(rendered)
            params = dict(request.get("sampling_params") or {})
            if params.get("logprobs") is None:
                params["logprobs"] = 0
            if len(prompt) > len(full) and chat.get(self.max_tokens_field) is None:
                # The server sized max_tokens for the rendering; the spliced prompt may be longer.
                params["max_tokens"] = int(params.get("max_tokens") or 0) - (len(prompt) - len(full))
                if params["max_tokens"] <= 0:
                    raise _Overflow()
            request.update(sampling_params=params, token_ids=prompt, token_offsets=None, stream=False)
            generated = await post(f"{root}/inference/v1/generate", request)
            completion, logprobs, choice = _read_generated(generated, f"{root}/inference/v1/generate")

            derender_input = _without_end_token(generated)
            derendered = await post(
                f"{base_url}/chat/completions/derender",
                {
                    "model": chat.get("model"),
                    "generate_response": derender_input,
                    "chat_request": chat,
                    "prompt_tokens": len(prompt),
                    "prompt_token_ids": prompt,
                },
            )
        except _Overflow:
            if not self.context_overflow_as_incomplete:
                raise UpstreamHTTPError(
                    "the prompt does not fit the model's context",
                    upstream_status=400,
                    attempts=sum(attempts),
                    request=chat,
                ) from None
            return UpstreamReply(incomplete_response(body), chat, 400, max(1, sum(attempts)), context_overflow=True)

        finish_reason = _finish_reason(derendered, choice)
        try:
            response, _ = chat_completion_to_response(_with_finish_reason(derendered, finish_reason), body)
        except UpstreamError as exc:
            exc.attempts, exc.request = sum(attempts), chat
            raise
        tokens = TokenData(prompt, completion, logprobs, finish_reason)
        for item in response["output"]:
            for name in TRAINING_FIELDS:
                item.pop(name, None)
        response["output"][-1].update(tokens.training_fields())

        input_items = [{"role": "user", "content": items}] if isinstance(items, str) else list(items or ())
        following = responses_to_chat_request(
            {**body, "input": [*input_items, *response["output"]]},
            max_tokens_field=self.max_tokens_field,
            reasoning_fields=self.reasoning_fields,
        )
        template = {k: chat[k] for k in _TEMPLATE_FIELDS if k in chat}
        turn = _Turn(
            array("q", [*prompt, *completion]),
            following["messages"],
            dumps(template),
            splice.closing,
            tuple(_item_keys(response["output"])),
        )
        self._remember(turn, previous)
        return UpstreamReply.with_tokens(response, chat, tokens, status=200, attempts=sum(attempts))


def _read_generated(data: Mapping[str, Any], url: str) -> tuple[list[int], list[float], dict[str, Any]]:
    """The first choice's token IDs and the sampled tokens' logprobs, checked to be one per token."""
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise UpstreamProtocolError(f"{url} answered without choices: {str(data)[:200]}")
    choice = choices[0]
    ids = choice.get("token_ids")
    if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
        raise UpstreamProtocolError(f"{url} answered without token_ids")
    content = (choice.get("logprobs") or {}).get("content")
    if not isinstance(content, list) or len(content) != len(ids):
        raise UpstreamProtocolError(f"{url} answered {len(ids)} tokens without one logprob each")
    logprobs = []
    for token, entry in zip(ids, content, strict=True):
        if not isinstance(entry, dict) or entry.get("token_id") != token:
            raise UpstreamProtocolError(f"{url} answered logprobs that are not those of its tokens")
        logprobs.append(float(entry["logprob"]))
    return list(ids), logprobs, choice


def _without_end_token(generated: dict[str, Any]) -> dict[str, Any]:
    """The generate reply to derender: without the end token a stop left at the end of ``token_ids``.

    The chat endpoint never shows the end-of-sequence token (or a stop token) in the text; derender decodes every
    token it is given, so ``<|im_end|>`` would end up in the content.
    """
    choice = generated["choices"][0]
    stop_reason = choice.get("stop_reason")
    if choice.get("finish_reason") != "stop" or isinstance(stop_reason, str) or not choice.get("token_ids"):
        return generated
    trimmed = dict(choice)
    trimmed["token_ids"] = choice["token_ids"][:-1]
    logprobs = choice.get("logprobs")
    if isinstance(logprobs, dict) and isinstance(logprobs.get("content"), list):
        trimmed["logprobs"] = {**logprobs, "content": logprobs["content"][:-1]}
    return {**generated, "choices": [trimmed, *generated["choices"][1:]]}


def _finish_reason(derendered: Mapping[str, Any], generated_choice: Mapping[str, Any]) -> str:
    """The chat endpoint's finish reason: ``tool_calls`` when the parsers found a call, else the engine's."""
    choices = derendered.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    reason = choice.get("finish_reason") or generated_choice.get("finish_reason") or "stop"
    message = choice.get("message") or {}
    if reason == "stop" and message.get("tool_calls"):
        return "tool_calls"
    return str(reason)


def _with_finish_reason(derendered: dict[str, Any], finish_reason: str) -> dict[str, Any]:
    choices = derendered.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return derendered  # the conversion says what is wrong
    return {**derendered, "choices": [{**choices[0], "finish_reason": finish_reason}, *choices[1:]]}
