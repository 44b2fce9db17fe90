"""``ResponsesUpstream``: Gym's Responses request passed through to ``{base_url}/responses``."""

from __future__ import annotations

from typing import Any

from .._endpoint import Endpoint
from .._protocol.responses import read_responses_reply
from .._protocol.token_data import (
    TokenData,
    ask_for_token_data,
    make_logprob_fields_consistent,
    pop_return_tokens,
    strip_training_fields,
)
from .http import HttpUpstream


class ResponsesUpstream(HttpUpstream):
    """Passes the Responses request through to ``{base_url}/responses``.

    Chat-style ``max_tokens`` / ``max_completion_tokens`` (e.g. from sampling args) become
    ``max_output_tokens`` when the request has none, and Gym's training fields on earlier items are
    not sent. With ``return_tokens`` (endpoint or sampling arg) vLLM is asked for token IDs and
    logprobs (``enable_response_messages``, the output logprobs ``include``). Token data is read
    from the reply, then removed where Gym's agent cannot carry it. A 400 that says the prompt
    exceeds the context window becomes an empty incomplete response (as Gym's own vLLM server does)
    when ``context_overflow_as_incomplete`` is set.
    """

    path = "responses"

    def _request(self, endpoint: Endpoint, body: dict[str, Any]) -> dict[str, Any]:
        for name in ("max_tokens", "max_completion_tokens"):
            if name in body:
                value = body.pop(name)
                if body.get("max_output_tokens") is None and value is not None:
                    body["max_output_tokens"] = value
        strip_training_fields(body.get("input"))
        if pop_return_tokens(body) or endpoint.return_tokens:
            ask_for_token_data("responses", body)
        make_logprob_fields_consistent("responses", body)
        return body

    def _reply(self, data: Any, body: dict[str, Any]) -> tuple[dict[str, Any], TokenData]:
        return read_responses_reply(data, body)
