"""Contract with a real vLLM 0.32 server, both APIs: its saved requests and replies
(``tests/data/vllm``) replayed through the conversion and through the routing proxy."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest

from tests.unit.saved_vllm import Answer, SavedVllm, load, raw
from verifiers_nemo import Endpoint, PolicyCall, RoutingProxy, check_contiguity
from verifiers_nemo._protocol import input_to_messages, responses_to_chat_request
from verifiers_nemo._protocol.gym_schema import validate_policy_reply
from verifiers_nemo._protocol.token_data import OUTPUT_LOGPROBS, ask_for_token_data
from verifiers_nemo._routing import ROUTE_METADATA_KEY, STATUS_UPSTREAM_FAILED, Route


@pytest.fixture
def proxy() -> Iterator[RoutingProxy]:
    with RoutingProxy(max_retries=2, backoff=0.01, backoff_max=0.02, upstream_timeout=60) as p:
        yield p


@pytest.fixture
async def vllm() -> AsyncIterator[SavedVllm]:
    async with SavedVllm() as server:
        yield server


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def gym_body(route: Route, request: str = "resp_req.json", **extra: Any) -> dict[str, Any]:
    """A saved Responses request as a Gym agent sends it to the proxy (route key in metadata,
    no vLLM-only fields: Gym's own schema has none)."""
    body = load(request)
    for name in ("enable_response_messages", "include", "top_logprobs"):
        body.pop(name, None)
    return {**body, "model": route.key, "metadata": {ROUTE_METADATA_KEY: route.key}, **extra}


async def call(client: aiohttp.ClientSession, proxy: RoutingProxy, body: dict[str, Any]) -> tuple[int, Any]:
    async with client.post(f"{proxy.base_url}/responses", json=body) as resp:
        return resp.status, await resp.json()


def sent(vllm: SavedVllm) -> dict[str, Any]:
    """The body of the last request vLLM received."""
    return vllm.requests[-1][1]


def only_call(route: Route) -> PolicyCall:
    [policy_call] = route.calls
    return policy_call


def with_logprob_token(name: str, index: int, token: str) -> bytes:
    """A saved reply whose logprob entry ``index`` renders as ``token`` (vLLM renders a special
    token it skips, such as the end token, as an empty string)."""
    data = load(name)
    entries = (
        data["choices"][0]["logprobs"]["content"] if "choices" in data else data["output"][0]["content"][0]["logprobs"]
    )
    entries[index] |= {"token": token, "bytes": list(token.encode())}
    return json.dumps(data).encode()


# -- requests: what the conversion sends is what vLLM accepted --------------------------------


def test_multi_step_gym_request_converts_to_the_chat_request_vllm_accepted() -> None:
    chat = responses_to_chat_request({**load("ms_resp_req.json"), "top_logprobs": 1})
    ask_for_token_data("chat", chat)

    assert chat == load("ms_chat_req.json")


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"top_logprobs": 1}, {"top_logprobs": 1, "logprobs": True}),
        ({"top_logprobs": 0}, {"top_logprobs": 0, "logprobs": True}),
        ({"include": [OUTPUT_LOGPROBS]}, {"logprobs": True}),
        ({"include": [OUTPUT_LOGPROBS], "top_logprobs": 2}, {"top_logprobs": 2, "logprobs": True}),
        ({"top_logprobs": 1, "logprobs": False}, {"logprobs": False}),
        ({"top_logprobs": None}, {}),
        ({"enable_response_messages": True}, {"return_token_ids": True}),
    ],
    ids=["top_logprobs", "top_logprobs-0", "include", "include+top_logprobs", "explicit-false", "null", "messages"],
)
def test_logprob_fields_convert_to_a_combination_vllm_accepts(fields: dict[str, Any], expected: dict[str, Any]) -> None:
    chat = responses_to_chat_request({"model": "tiny", "input": "hi", **fields})

    token_fields = {k: chat[k] for k in ("logprobs", "top_logprobs", "return_token_ids") if k in chat}
    assert token_fields == expected
    assert "include" not in chat and "enable_response_messages" not in chat


def test_reasoning_history_is_sent_in_both_fields_as_vllm_accepted() -> None:
    saved = load("chat_req_reasoning_hist.json")
    items = [
        {"role": "user", "content": "hi"},
        {"id": "rs_1", "type": "reasoning", "summary": [{"type": "summary_text", "text": "thinking"}]},
        {"role": "assistant", "content": "x"},
        {"role": "user", "content": "again"},
    ]

    assert input_to_messages(items) == saved["messages"]


async def test_chat_top_logprobs_alone_reaches_vllm_as_a_request_it_accepts(
    proxy: RoutingProxy, vllm: SavedVllm, client: aiohttp.ClientSession
) -> None:
    route = proxy.open_route(Endpoint(base_url=vllm.base_url, model="tiny", api="chat"))
    vllm.queue("chat", raw("chat.json"))

    status, _ = await call(client, proxy, gym_body(route, top_logprobs=1))  # -S '{"top_logprobs": 1}'

    assert status == 200, route.error
    assert (sent(vllm)["top_logprobs"], sent(vllm)["logprobs"]) == (1, True)
    assert only_call(route).completion_logprobs is not None


# -- Chat Completions replies -----------------------------------------------------------------


async def test_chat_reply_without_tool_calls_key_becomes_one_assistant_message(
    proxy: RoutingProxy, vllm: SavedVllm, client: aiohttp.ClientSession
) -> None:
    route = proxy.open_route(Endpoint(base_url=vllm.base_url, model="tiny", api="chat"))
    vllm.queue("chat", raw("chat.json"))

    status, response = await call(client, proxy, gym_body(route))

    assert status == 200
    [message] = response["output"]
    assert message["type"] == "message" and message["content"][0]["text"] == " 14matckaredORconstTP/."
    assert only_call(route).finish_reason == "length"


async def test_chat_tool_call_with_null_content_becomes_only_a_function_call_with_token_data(
    proxy: RoutingProxy, vllm: SavedVllm, client: aiohttp.ClientSession
) -> None:
    saved = load("chat_toolcall.json")
    route = proxy.open_route(Endpoint(base_url=vllm.base_url, model="tiny", api="chat"))
    vllm.queue("chat", raw("chat_toolcall.json"))

    status, response = await call(client, proxy, gym_body(route, "resp_tc_req.json"))

    assert status == 200
    [item] = response["output"]
    assert (item["type"], item["call_id"], item["name"], item["arguments"]) == (
        "function_call",
        "chatcmpl-tool-a7ae0d7451e40b9f",
        "get_weather",
        '{"city": "sf"}',
    )
    recorded = only_call(route)
    assert recorded.finish_reason == "tool_calls"
    assert recorded.prompt_token_ids == saved["prompt_token_ids"]
    assert recorded.completion_token_ids == saved["choices"][0]["token_ids"]
    assert recorded.completion_token_ids[-1] == 2  # the end token <|im_end|> is kept...
    assert recorded.completion_logprobs is not None and len(recorded.completion_logprobs) == 30
    assert (
        recorded.completion_logprobs[-1] == saved["choices"][0]["logprobs"]["content"][-1]["logprob"]
    )  # ...with its logprob
    assert item["generation_token_ids"] == recorded.completion_token_ids  # Gym's training fields


async def test_chat_length_finish_mid_tool_call_is_an_incomplete_message_not_a_call(
    proxy: RoutingProxy, vllm: SavedVllm, client: aiohttp.ClientSession
) -> None:
    route = proxy.open_route(Endpoint(base_url=vllm.base_url, model="tiny", api="chat"))
    vllm.queue("chat", raw("chat_required.json"))

    status, response = await call(client, proxy, gym_body(route, tool_choice="required"))

    assert status == 200
    assert [item["type"] for item in response["output"]] == ["message"]
    assert response["output"][0]["content"][0]["text"].startswith("<tool_call>")
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}  # the Gym agent stops here
    assert only_call(route).finish_reason == "length"


@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
async def test_chat_reasoning_field_of_either_name_becomes_a_reasoning_item(
    proxy: RoutingProxy, vllm: SavedVllm, client: aiohttp.ClientSession, field: str
) -> None:
    data = load("chat.json")
    data["choices"][0]["message"]["reasoning"] = None  # as saved: vLLM 0.32 sends the key, null
    data["choices"][0]["message"][field] = "thinking"
    route = proxy.open_route(Endpoint(base_url=vllm.base_url, model="tiny", api="chat"))
    vllm.queue("chat", raw("chat.json"), json.dumps(data).encode())

    _, without = await call(client, proxy, gym_body(route))
    _, with_reasoning = await call(client, proxy, gym_body(route))

    assert [i["type"] for i in without["output"]] == ["message"]
    assert [i["type"] for i in with_reasoning["output"]] == ["reasoning", "message"]
    assert with_reasoning["output"][0]["summary"] == [{"type": "summary_text", "text": "thinking"}]


@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_empty_token_logprob_entries_keep_one_logprob_per_token(
    proxy: RoutingProxy, vllm: SavedVllm, client: aiohttp.ClientSession, api: str
) -> None:
    name = "chat_toolcall.json" if api == "chat" else "responses_msgs.json"
    route = proxy.open_route(Endpoint(base_url=vllm.base_url, model="tiny", api=api))  # type: ignore[arg-type]
    vllm.queue(api, with_logprob_token(name, -1, ""))

    status, _ = await call(client, proxy, gym_body(route))

    recorded = only_call(route)
    assert status == 200 and recorded.completion_token_ids is not None
    assert recorded.completion_logprobs is not None
    assert len(recorded.completion_logprobs) == len(recorded.completion_token_ids)


# -- Responses replies ------------------------------------------------------------------------


async def test_responses_logprobs_and_token_ids_are_recorded_then_removed_before_gym(
    proxy: RoutingProxy, vllm: SavedVllm, client: aiohttp.ClientSession
) -> None:
    saved = load("responses_msgs.json")
    route = proxy.open_route(
        Endpoint(base_url=vllm.base_url, model="tiny"),
        sampling_args={"include": [OUTPUT_LOGPROBS], "enable_response_messages": True},
    )
    vllm.queue("responses", raw("responses_msgs.json"))

    status, response = await call(client, proxy, gym_body(route, top_logprobs=1))

    assert status == 200
    part = response["output"][0]["content"][0]
    assert "logprobs" not in part and part["text"] == saved["output"][0]["content"][0]["text"]
    assert "input_messages" not in response and "output_messages" not in response
    validate_policy_reply(response)
    recorded = only_call(route)
    assert recorded.prompt_token_ids == saved["input_messages"][0]["tokens"]
    assert recorded.completion_token_ids == saved["output_messages"][0]["tokens"]
    assert recorded.completion_logprobs == [e["logprob"] for e in saved["output"][0]["content"][0]["logprobs"]]
    assert recorded.finish_reason == "length"
    assert response["output"][0]["generation_log_probs"] == recorded.completion_logprobs  # Gym's training fields


async def test_responses_logprobs_without_response_messages_are_recorded_without_token_ids(
    proxy: RoutingProxy, vllm: SavedVllm, client: aiohttp.ClientSession
) -> None:
    route = proxy.open_route(
        Endpoint(base_url=vllm.base_url, model="tiny"), sampling_args={"include": [OUTPUT_LOGPROBS]}
    )
    vllm.queue("responses", raw("responses.json"))

    status, response = await call(client, proxy, gym_body(route, top_logprobs=1))

    recorded = only_call(route)
    assert status == 200 and "logprobs" not in response["output"][0]["content"][0]
    assert recorded.completion_logprobs is not None and len(recorded.completion_logprobs) == 8
    assert (recorded.prompt_token_ids, recorded.completion_token_ids) == (None, None)
    assert "prompt_token_ids" not in response["output"][0]  # no partial training fields


async def test_responses_incomplete_status_with_a_completed_message_item_is_a_length_finish(
    proxy: RoutingProxy, vllm: SavedVllm, client: aiohttp.ClientSession
) -> None:
    route = proxy.open_route(Endpoint(base_url=vllm.base_url, model="tiny"))
    vllm.queue("responses", raw("responses.json"))

    status, response = await call(client, proxy, gym_body(route))

    assert status == 200
    assert (response["status"], response["output"][0]["status"]) == ("incomplete", "completed")
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert response["usage"]["input_tokens_details"]["cached_tokens"] == 0
    assert only_call(route).finish_reason == "length"


async def test_responses_function_call_with_extra_null_keys_reaches_gym(
    proxy: RoutingProxy, vllm: SavedVllm, client: aiohttp.ClientSession
) -> None:
    route = proxy.open_route(Endpoint(base_url=vllm.base_url, model="tiny"))
    vllm.queue("responses", raw("responses_toolcall.json"))

    status, response = await call(client, proxy, gym_body(route, "resp_tc_req.json"))

    assert status == 200
    [item] = response["output"]
    assert (item["type"], item["name"], item["async"], item["caller"], item["namespace"]) == (
        "function_call",
        "get_weather",
        None,
        None,
        None,
    )
    recorded = only_call(route)
    assert recorded.finish_reason == "tool_calls" and recorded.prompt_token_ids is None


@pytest.mark.parametrize("status", ["cancelled", "failed"])
async def test_responses_without_a_usable_answer_are_an_upstream_error(
    proxy: RoutingProxy, vllm: SavedVllm, client: aiohttp.ClientSession, status: str
) -> None:
    data = load("responses.json") | {"status": status}
    route = proxy.open_route(Endpoint(base_url=vllm.base_url, model="tiny"))
    vllm.queue("responses", json.dumps(data).encode())

    code, body = await call(client, proxy, gym_body(route))

    assert code == STATUS_UPSTREAM_FAILED and body["error"]["kind"] == "protocol"
    assert status in body["error"]["message"]


async def test_training_fields_gym_sends_back_never_reach_vllm(
    proxy: RoutingProxy, vllm: SavedVllm, client: aiohttp.ClientSession
) -> None:
    route = proxy.open_route(Endpoint(base_url=vllm.base_url, model="tiny", return_tokens=True))
    vllm.queue("responses", raw("responses_msgs.json"), raw("responses.json"))
    body = gym_body(route)

    _, first = await call(client, proxy, body)
    body["input"] += first["output"]  # what the Gym agent sends next
    await call(client, proxy, body)

    assert "generation_token_ids" in first["output"][0]
    assert "token_ids" not in json.dumps(sent(vllm)["input"])


# -- both APIs --------------------------------------------------------------------------------


@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_context_overflow_400_ends_the_rollout_as_incomplete(
    proxy: RoutingProxy, vllm: SavedVllm, client: aiohttp.ClientSession, api: str
) -> None:
    route = proxy.open_route(Endpoint(base_url=vllm.base_url, model="tiny", api=api))  # type: ignore[arg-type]
    vllm.queue(api, Answer(raw(f"{api}_overflow_400.txt"), status=400))

    status, response = await call(client, proxy, gym_body(route))

    assert status == 200 and response["incomplete_details"] == {"reason": "max_output_tokens"}
    recorded = only_call(route)
    assert (recorded.context_overflow, recorded.upstream_status, recorded.attempts) == (True, 400, 1)
    assert route.error is None and recorded.finish_reason is None


@pytest.mark.parametrize(
    ("api", "fields"),
    [
        ("chat", {"logprobs": True, "return_token_ids": True}),
        ("responses", {"enable_response_messages": True, "include": [OUTPUT_LOGPROBS], "top_logprobs": 0}),
    ],
)
@pytest.mark.parametrize("switch", ["endpoint", "sampling-arg"])
async def test_return_tokens_asks_vllm_for_token_ids_and_logprobs(
    proxy: RoutingProxy,
    vllm: SavedVllm,
    client: aiohttp.ClientSession,
    api: str,
    fields: dict[str, Any],
    switch: str,
) -> None:
    on_endpoint = switch == "endpoint"
    endpoint = Endpoint(base_url=vllm.base_url, model="tiny", api=api, return_tokens=on_endpoint)  # type: ignore[arg-type]
    route = proxy.open_route(endpoint, sampling_args=None if on_endpoint else {"return_tokens": True})
    vllm.queue(api, raw("chat_toolcall.json" if api == "chat" else "responses_msgs.json"))

    status, _ = await call(client, proxy, gym_body(route))

    assert status == 200
    assert {k: sent(vllm).get(k) for k in fields} == fields
    assert "return_tokens" not in sent(vllm)
    recorded = only_call(route)
    assert recorded.has_tokens and recorded.completion_logprobs is not None


def _next_turn(api: str, first: dict[str, Any], continuation: list[int]) -> bytes:
    """A second reply whose prompt is the first call's prompt + completion + ``continuation``
    (what the chat template renders after the first turn)."""
    if api == "chat":
        prompt = first["prompt_token_ids"] + first["choices"][0]["token_ids"] + continuation
        return json.dumps(load("chat.json") | {"prompt_token_ids": prompt}).encode()
    prompt = first["input_messages"][0]["tokens"] + first["output_messages"][0]["tokens"] + continuation
    second = load("responses_msgs.json")
    second["input_messages"][0]["tokens"] = prompt
    return json.dumps(second).encode()


@pytest.mark.parametrize(("api", "first_reply"), [("chat", "chat_toolcall.json"), ("responses", "responses_msgs.json")])
async def test_contiguity_check_reads_both_apis_token_data(
    proxy: RoutingProxy, vllm: SavedVllm, client: aiohttp.ClientSession, api: str, first_reply: str
) -> None:
    first = load(first_reply)
    template = [201, 1, 3476, 603, 849, 201]  # "\n<|im_start|>assistant\n" in this model's tokens
    endpoint = Endpoint(base_url=vllm.base_url, model="tiny", api=api, return_tokens=True)  # type: ignore[arg-type]
    good, broken = proxy.open_route(endpoint), proxy.open_route(endpoint)
    vllm.queue(api, raw(first_reply), _next_turn(api, first, template))
    vllm.queue(api, raw(first_reply), _retokenized(api, first, template))

    for route in (good, broken):
        for _ in range(2):
            status, _ = await call(client, proxy, gym_body(route))
            assert status == 200

    assert check_contiguity(good.calls), check_contiguity(good.calls).message
    result = check_contiguity(broken.calls)
    assert not result and result.broken_at == 1


def _retokenized(api: str, first: dict[str, Any], continuation: list[int]) -> bytes:
    """A second reply whose prompt re-tokenized the first completion (its last token differs)."""
    reply = json.loads(_next_turn(api, first, continuation))
    prompt = reply["prompt_token_ids"] if api == "chat" else reply["input_messages"][0]["tokens"]
    n = len(first["prompt_token_ids"] if api == "chat" else first["input_messages"][0]["tokens"])
    completion = first["choices"][0]["token_ids"] if api == "chat" else first["output_messages"][0]["tokens"]
    prompt[n + len(completion) - 1] += 1
    return json.dumps(reply).encode()


def test_cli_return_tokens_flag_is_the_return_tokens_sampling_arg() -> None:
    from verifiers_nemo._cli import build_parser, new_settings
    from verifiers_nemo._harness import split_sampling_args

    def settings(*flags: str) -> Any:
        argv = ["eval", "example_multi_step", "-b", "http://127.0.0.1:9/v1", "--api", "chat", *flags]
        return new_settings(build_parser().parse_args(argv))

    assert settings("--return-tokens", "-S", '{"top_logprobs": 1}').sampling_args == {
        "top_logprobs": 1,
        "return_tokens": True,
    }
    assert "return_tokens" not in settings().sampling_args
    # The harness puts it on the route (not in Gym's row), where the upstream reads and removes it.
    assert split_sampling_args(settings("--return-tokens").sampling_args) == ({}, {"return_tokens": True})
