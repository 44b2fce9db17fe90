"""Exact-token mode (``ExactTokensUpstream``) and training samples, against a stand-in vLLM on 127.0.0.1 that answers
render / generate / derender with a real vLLM 0.32's recorded replies (``tests/realmodel/replies``, see
``tests/realmodel/record_replies.py``)."""

from __future__ import annotations

import copy
import json
import logging
from collections import deque
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.realmodel.rollouts import TASKS, tool_rollout
from verifiers_nemo import Endpoint, UpstreamHTTPError, UpstreamProtocolError, check_contiguity
from verifiers_nemo._routing.trace import PolicyCall
from verifiers_nemo._routing.training_sample import training_samples
from verifiers_nemo._upstreams.exact_tokens import ExactTokensUnsupported, ExactTokensUpstream

REPLIES = Path(__file__).resolve().parents[1] / "realmodel" / "replies"
RENDER, GENERATE, DERENDER = "/v1/chat/completions/render", "/inference/v1/generate", "/v1/chat/completions/derender"


def replies(name: str) -> Any:
    return json.loads((REPLIES / name).read_text())


class RecordedScaleOut:
    """Answers each POST with the next recorded exchange (its path must be the one asked) and keeps every request."""

    def __init__(self, exchanges: list[dict[str, Any]]) -> None:
        self.exchanges = deque(copy.deepcopy(exchanges))
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.runner: web.AppRunner | None = None
        self.port = 0

    async def answer(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append((request.path, body))
        if not self.exchanges:
            return web.json_response({"error": f"unexpected {request.path}"}, status=500)
        exchange = self.exchanges.popleft()
        if exchange["path"] != request.path:
            return web.json_response({"error": f"expected {exchange['path']}, got {request.path}"}, status=500)
        return web.json_response(exchange["reply"], status=exchange["status"])

    def sent(self, path: str) -> list[dict[str, Any]]:
        return [body for p, body in self.requests if p == path]

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint(base_url=f"http://127.0.0.1:{self.port}/v1", model="smol", api="chat")


@pytest.fixture
async def serve() -> AsyncIterator[Any]:
    servers: list[RecordedScaleOut] = []

    async def start(exchanges: list[dict[str, Any]]) -> RecordedScaleOut:
        server = RecordedScaleOut(exchanges)
        app = web.Application()
        app.router.add_post("/{tail:.*}", server.answer)
        server.runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.5)
        await server.runner.setup()
        site = web.TCPSite(server.runner, "127.0.0.1", 0)
        await site.start()
        server.port = int(server.runner.addresses[0][1])
        servers.append(server)
        return server

    yield start
    for server in servers:
        assert server.runner is not None
        await server.runner.cleanup()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


def session_exchanges() -> list[dict[str, Any]]:
    return replies("exact_session.json")


def first_turn() -> list[dict[str, Any]]:
    return session_exchanges()[:3]


async def test_second_turn_is_generated_from_the_first_turns_exact_tokens(serve: Any, session: Any) -> None:
    exchanges = session_exchanges()
    server = await serve(exchanges)

    calls = await tool_rollout(ExactTokensUpstream(), session, server.endpoint, TASKS["weather"](80, 2), 2)

    generated = [e["reply"] for e in exchanges if e["path"] == GENERATE]
    first_prompt, second_prompt = (body["token_ids"] for body in server.sent(GENERATE))
    first_completion = generated[0]["choices"][0]["token_ids"]
    assert second_prompt[: len(first_prompt) + len(first_completion)] == first_prompt + first_completion
    # What follows is the rendered conversation after the previous assistant turn, nothing sampled re-rendered.
    full = exchanges[3]["reply"]["token_ids"]
    history = exchanges[4]["reply"]["token_ids"]
    new = full[len(history) :]
    assert second_prompt[len(second_prompt) - len(new) :] == new
    glue = second_prompt[len(first_prompt) + len(first_completion) : len(second_prompt) - len(new)]
    assert history[len(history) - len(glue) - 1 :] == [first_completion[-1], *glue]  # after the end-of-turn token
    assert check_contiguity(calls)


async def test_reply_token_data_is_what_generate_was_given_and_returned(serve: Any, session: Any) -> None:
    exchanges = session_exchanges()
    server = await serve(exchanges)

    calls = await tool_rollout(ExactTokensUpstream(), session, server.endpoint, TASKS["weather"](80, 2), 2)

    generated = [e["reply"]["choices"][0] for e in exchanges if e["path"] == GENERATE]
    for call, sent, choice in zip(calls, server.sent(GENERATE), generated, strict=True):
        assert call.prompt_token_ids == sent["token_ids"]
        assert call.completion_token_ids == choice["token_ids"]
        assert call.completion_logprobs == [entry["logprob"] for entry in choice["logprobs"]["content"]]
        item = call.response["output"][-1]
        assert item["generation_token_ids"] == choice["token_ids"]
        assert item["prompt_token_ids"] == sent["token_ids"]


async def test_tool_call_reply_reads_as_the_chat_endpoint_would_answer(serve: Any, session: Any) -> None:
    server = await serve(first_turn())

    reply = await ExactTokensUpstream().create_response(session, server.endpoint, TASKS["weather"](80, 2))

    assert reply.finish_reason == "tool_calls"  # derender says "stop"; the chat endpoint says "tool_calls"
    (call,) = [item for item in reply.response["output"] if item["type"] == "function_call"]
    assert call["name"] == "get_weather" and json.loads(call["arguments"]) == {"city": "Paris"}
    assert reply.response["tool_choice"] == "required"
    render_request = server.sent(RENDER)[0]
    assert render_request["tool_choice"] == "required" and render_request["logprobs"] is True
    # The render's sampling parameters (structured outputs for `required`) go to generate as they are.
    rendered = first_turn()[0]["reply"]
    assert (
        server.sent(GENERATE)[0]["sampling_params"]["structured_outputs"]
        == (rendered["sampling_params"]["structured_outputs"])
    )


async def test_end_token_is_not_derendered_into_the_content(serve: Any, session: Any) -> None:
    server = await serve(first_turn())

    await ExactTokensUpstream().create_response(session, server.endpoint, TASKS["weather"](80, 2))

    generated = first_turn()[1]["reply"]["choices"][0]
    derendered = server.sent(DERENDER)[0]["generate_response"]["choices"][0]
    assert generated["finish_reason"] == "stop" and generated["stop_reason"] is None
    assert derendered["token_ids"] == generated["token_ids"][:-1]
    assert len(derendered["logprobs"]["content"]) == len(generated["token_ids"]) - 1
    assert server.sent(DERENDER)[0]["chat_request"]["messages"] == server.sent(RENDER)[0]["messages"]


async def test_history_changed_by_the_agent_is_generated_from_the_plain_rendering(
    serve: Any, session: Any, caplog: pytest.LogCaptureFixture
) -> None:
    exchanges = session_exchanges()
    upstream = ExactTokensUpstream()
    first = await serve(exchanges[:3])
    reply = await upstream.create_response(session, first.endpoint, TASKS["weather"](80, 2))
    body = TASKS["weather"](80, 2)
    output = copy.deepcopy(reply.response["output"])
    output[-1]["arguments"] = '{"city": "Lyon"}'  # not what the model said
    body["input"] += [*output, {"type": "function_call_output", "call_id": output[-1]["call_id"], "output": "{}"}]
    second = await serve([exchanges[3], exchanges[7], exchanges[8]])

    with caplog.at_level(logging.WARNING):
        again = await upstream.create_response(session, second.endpoint, body)

    assert second.sent(GENERATE)[0]["token_ids"] == exchanges[3]["reply"]["token_ids"]
    assert again.prompt_token_ids == exchanges[3]["reply"]["token_ids"]
    assert "history differs" in caplog.text


async def test_conversation_this_upstream_did_not_start_is_rendered_once(serve: Any, session: Any) -> None:
    exchanges = session_exchanges()
    first = await serve(exchanges[:3])
    reply = await ExactTokensUpstream().create_response(session, first.endpoint, TASKS["weather"](80, 2))
    body = TASKS["weather"](80, 2)
    output = reply.response["output"]
    body["input"] += [*output, {"type": "function_call_output", "call_id": output[-1]["call_id"], "output": "{}"}]
    second = await serve([exchanges[3], exchanges[7], exchanges[8]])

    again = await ExactTokensUpstream().create_response(session, second.endpoint, body)  # another upstream

    assert [path for path, _ in second.requests] == [RENDER, GENERATE, DERENDER]
    assert again.prompt_token_ids == exchanges[3]["reply"]["token_ids"]


async def test_server_without_scale_out_routes_is_one_error_naming_the_flag(serve: Any, session: Any) -> None:
    server = await serve([{"path": RENDER, "status": 404, "reply": replies("not_found_404.json")}])

    with pytest.raises(ExactTokensUnsupported) as caught:
        await ExactTokensUpstream().create_response(session, server.endpoint, TASKS["weather"](80, 2))

    assert isinstance(caught.value, UpstreamHTTPError) and caught.value.upstream_status == 404
    assert "--exact-tokens" in caught.value.message and "--enable-scale-out" in caught.value.message
    assert [path for path, _ in server.requests] == [RENDER]


async def test_unknown_model_404_is_not_mistaken_for_missing_routes(serve: Any, session: Any) -> None:
    unknown = {"error": {"message": "The model `x` does not exist.", "type": "NotFoundError", "code": 404}}
    server = await serve([{"path": RENDER, "status": 404, "reply": unknown}])

    with pytest.raises(UpstreamHTTPError) as caught:
        await ExactTokensUpstream().create_response(session, server.endpoint, TASKS["weather"](80, 2))

    assert not isinstance(caught.value, ExactTokensUnsupported)
    assert "does not exist" in caught.value.message


@pytest.mark.parametrize(
    ("exchanges", "generated"),
    [
        ([{"path": RENDER, "status": 400, "reply": replies("render_overflow_400.json")}], False),
        (
            [
                *session_exchanges()[:1],
                {"path": GENERATE, "status": 400, "reply": replies("generate_overflow_400.json")},
            ],
            True,
        ),
    ],
    ids=["render", "generate"],
)
async def test_prompt_longer_than_the_context_is_an_empty_incomplete_reply(
    serve: Any, session: Any, exchanges: list[dict[str, Any]], generated: bool
) -> None:
    server = await serve(exchanges)

    reply = await ExactTokensUpstream().create_response(session, server.endpoint, TASKS["weather"](80, 2))

    assert reply.context_overflow and reply.response["status"] == "incomplete"
    assert bool(server.sent(GENERATE)) is generated


async def test_logprobs_of_other_tokens_are_a_protocol_error(serve: Any, session: Any) -> None:
    exchanges = first_turn()
    content = exchanges[1]["reply"]["choices"][0]["logprobs"]["content"]
    content[0]["token_id"] += 1
    server = await serve(exchanges)

    with pytest.raises(UpstreamProtocolError, match="not those of its tokens"):
        await ExactTokensUpstream().create_response(session, server.endpoint, TASKS["weather"](80, 2))


async def test_remembered_turns_are_bounded_and_one_per_rollout(serve: Any, session: Any) -> None:
    exchanges = session_exchanges()
    upstream = ExactTokensUpstream(max_turns=4)
    server = await serve(exchanges)

    await tool_rollout(upstream, session, server.endpoint, TASKS["weather"](80, 2), 2)

    assert upstream.remembered_turns == 1  # the second turn replaced the first
    for _ in range(3):
        more = await serve(first_turn())
        await upstream.create_response(session, more.endpoint, TASKS["weather"](80, 2))
    assert upstream.remembered_turns <= 4


# -- training samples ------------------------------------------------------------------------------


def policy_call(index: int, prompt: list[int] | None, completion: list[int] | None, ok: bool = True) -> PolicyCall:
    logprobs = None if completion is None else [-0.5 - i for i in range(len(completion))]
    return PolicyCall(
        index=index,
        status=200 if ok else 502,
        latency_s=0.1,
        attempts=1,
        started_at=0.0,
        response_json=b"{}" if ok else None,
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        completion_logprobs=logprobs,
    )


def test_contiguous_calls_are_one_sample_masked_on_the_policys_tokens() -> None:
    calls = [policy_call(0, [1, 2, 3], [4, 5]), policy_call(1, [1, 2, 3, 4, 5, 6, 7], [8, 9, 10])]

    result = training_samples(calls)

    assert result.contiguous and len(result.samples) == 1
    (sample,) = result.samples
    assert sample.prompt_token_ids == [1, 2, 3]
    assert sample.completion_token_ids == [4, 5, 6, 7, 8, 9, 10]
    assert sample.completion_mask == [1, 1, 0, 0, 1, 1, 1]
    assert sample.completion_logprobs == [-0.5, -1.5, 0.0, 0.0, -0.5, -1.5, -2.5]
    assert sample.calls == (0, 1)


def test_broken_contiguity_gives_one_sample_per_contiguous_run_and_says_where() -> None:
    calls = [
        policy_call(0, [1, 2], [3]),
        policy_call(1, [1, 2, 9, 4], [5]),  # re-rendered: 9 where the model sampled 3
        policy_call(2, [1, 2, 9, 4, 5, 6], [7]),
    ]

    result = training_samples(calls)

    assert not result.contiguous
    assert [s.calls for s in result.samples] == [(0,), (1, 2)]
    assert result.samples[1].completion_mask == [1, 0, 1]
    assert len(result.breaks) == 1 and "call 1" in result.breaks[0] and "position 2" in result.breaks[0]


def test_calls_without_tokens_are_skipped_and_cut_the_sequence() -> None:
    calls = [
        policy_call(0, [1], [2]),
        policy_call(1, None, None),
        policy_call(2, [1, 2, 3], [4]),
        policy_call(3, [1], [2], ok=False),
    ]

    result = training_samples(calls)

    assert [s.calls for s in result.samples] == [(0,), (2,)]
    assert result.skipped == ["call 1 has no token IDs recorded", "call 3 failed"]
    assert not result.contiguous


async def test_replayed_exact_rollout_is_one_training_sample(serve: Any, session: Any) -> None:
    server = await serve(session_exchanges())
    calls = await tool_rollout(ExactTokensUpstream(), session, server.endpoint, TASKS["weather"](80, 2), 2)

    result = training_samples(calls)

    assert result.contiguous
    (sample,) = result.samples
    assert sample.prompt_token_ids == calls[0].prompt_token_ids
    assert sample.prompt_token_ids + sample.completion_token_ids == calls[1].prompt_token_ids + (
        calls[1].completion_token_ids or []
    )
    assert sum(sample.completion_mask) == sum(len(c.completion_token_ids or ()) for c in calls)
    assert json.loads(json.dumps(result.to_dict()))["contiguous"] is True
