"""``ChatCompletionsUpstream``: Gym's Responses request converted to ``{base_url}/chat/completions``
and the answer back (the conversion itself is ``_protocol.chat``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._endpoint import Endpoint
from .._exceptions import UpstreamError
from .._protocol.chat import chat_completion_to_response, responses_to_chat_request
from .._protocol.token_data import TokenData, ask_for_token_data, pop_return_tokens
from .base import RetryPolicy, UpstreamReply
from .http import HttpUpstream


class ChatCompletionsUpstream(HttpUpstream):
    """Converts the Responses request to ``{base_url}/chat/completions`` and the answer back.

    ``developer`` messages become ``system`` (what vLLM chat templates accept); reasoning items
    travel as ``reasoning_fields`` on the assistant message (``reasoning_content`` for vLLM < 0.16,
    ``reasoning`` after). ``max_output_tokens`` becomes ``max_tokens_field``. With ``return_tokens``
    (endpoint or sampling arg) vLLM is asked for ``logprobs`` and ``return_token_ids``; token IDs
    and logprobs are read whenever the upstream returns them and attached to the last output item
    as Gym's training fields.
    """

    path = "chat/completions"

    def __init__(
        self,
        retry: RetryPolicy | None = None,
        *,
        max_tokens_field: str = "max_tokens",
        reasoning_fields: tuple[str, ...] = ("reasoning_content", "reasoning"),
        context_overflow_as_incomplete: bool = True,
    ) -> None:
        super().__init__(retry, context_overflow_as_incomplete=context_overflow_as_incomplete)
        self.max_tokens_field = max_tokens_field
        self.reasoning_fields = reasoning_fields

    def chat_request(self, body: dict[str, Any]) -> dict[str, Any]:
        """``body`` (a Responses request) as the Chat Completions request this upstream sends."""
        try:
            return responses_to_chat_request(
                body, max_tokens_field=self.max_tokens_field, reasoning_fields=self.reasoning_fields
            )
        except UpstreamError as exc:
            exc.request = body
            raise

    def _request(self, endpoint: Endpoint, body: dict[str, Any]) -> dict[str, Any]:
        return_tokens = pop_return_tokens(body) or endpoint.return_tokens
        chat = self.chat_request(body)
        if return_tokens:
            ask_for_token_data("chat", chat)
        return chat

    def _reply(self, data: Any, body: dict[str, Any]) -> tuple[dict[str, Any], TokenData]:
        return chat_completion_to_response(data, body)


def chat_to_responses_reply(data: Any, request: Mapping[str, Any]) -> UpstreamReply:
    """Convert a Chat Completions reply to a Gym-valid ``UpstreamReply`` for ``request``."""
    response, tokens = chat_completion_to_response(data, request)
    return UpstreamReply.with_tokens(response, dict(request), tokens)
