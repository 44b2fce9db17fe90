"""Refusals no retry can change (verifiers' training client behind its interception server answers them HTTP 502)
fail a call at once, with the cause and the fix; any other 5xx is still retried."""

from __future__ import annotations

import json

import aiohttp
import pytest

from verifiers_nemo import Endpoint, UpstreamHTTPError
from verifiers_nemo._upstreams import ChatCompletionsUpstream, RetryPolicy
from verifiers_nemo._upstreams.refusals import KNOWN_REFUSALS, known_refusal

from .fake_upstream import FakeReply, FakeUpstream

# What verifiers 0.4.0's interception answers (its dialect's error body) when its training client raises.
FORMAT = "Engine response choice.logprobs.content[0].token must be 'token_id:504'."
DIALECT = (
    "The renderer client only supports the chat-completions dialect, got ResponsesDialect. Use the proxy client "
    "for this dialect, or add renderer support for it."
)
NO_TOOLS = "DefaultRenderer does not support tools. Choose a model-specific renderer instead of the default fallback."
IMAGES = "Qwen3Renderer does not support process_multimodal=False"
BODY = {"model": "m", "input": [{"role": "user", "content": "hi"}]}


def interception_error(message: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": "invalid_request_error"}}).encode()


@pytest.mark.parametrize(
    ("message", "cause", "fix"),
    [
        (FORMAT, '{"token_id": N}', "prime-rl's inference server"),
        (DIALECT, "Chat Completions only", "--env.agent.harness.api chat"),
        (NO_TOOLS, "cannot parse tool calls", "custom"),
        (IMAGES, "hold images", "vision renderer"),
    ],
    ids=["generate-logprob-shape", "responses-dialect", "renderer-without-tools", "images-in-a-text-renderer"],
)
def test_each_known_refusal_is_recognised_with_its_cause_and_fix(message: str, cause: str, fix: str) -> None:
    refusal = known_refusal(502, interception_error(message))
    assert refusal is not None
    assert cause in refusal.describe() and f"Fix: {refusal.fix}." in refusal.describe()
    assert fix in refusal.fix and "\n" not in refusal.describe()


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (502, interception_error("upstream attempt failed")),
        (503, b"<html>Bad Gateway</html>"),
        (200, interception_error(FORMAT)),
        (502, b'{"error": "plain"}'),
    ],
)
def test_other_answers_are_not_refusals(status: int, body: bytes) -> None:
    assert known_refusal(status, body) is None


def test_every_refusal_names_a_distinct_phrase() -> None:
    assert len({refusal.phrase for refusal in KNOWN_REFUSALS}) == len(KNOWN_REFUSALS)


async def test_a_refusal_fails_the_call_at_its_first_answer() -> None:
    async with FakeUpstream() as fake, aiohttp.ClientSession() as session:
        fake.script(FakeReply.error(502, FORMAT, times=10))
        upstream = ChatCompletionsUpstream(RetryPolicy(max_retries=3, backoff=0.01))
        with pytest.raises(UpstreamHTTPError) as failure:
            await upstream.create_response(session, Endpoint(fake.base_url, "m", api="chat"), dict(BODY))
    assert len(fake.requests) == 1 and failure.value.attempts == 1
    assert "Fix: serve the policy with prime-rl's inference server" in str(failure.value)


async def test_any_other_502_is_still_retried() -> None:
    async with FakeUpstream() as fake, aiohttp.ClientSession() as session:
        fake.script(FakeReply.error(502, "upstream attempt failed", times=2))
        upstream = ChatCompletionsUpstream(RetryPolicy(max_retries=3, backoff=0.01))
        reply = await upstream.create_response(session, Endpoint(fake.base_url, "m", api="chat"), dict(BODY))
    assert len(fake.requests) == 3 and reply.attempts == 3
