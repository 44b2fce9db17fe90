"""RoutingProxy: routing, refusal of unknown/closed keys, failures, recording, token data."""

from __future__ import annotations

import asyncio
import json
import random
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest

from tests.unit.fake_upstream import FakeReply, FakeUpstream
from verifiers_nemo import (
    ConfigurationError,
    Endpoint,
    FunctionUpstream,
    PolicyCall,
    RoutingProxy,
    UpstreamError,
    check_contiguity,
)
from verifiers_nemo._routing import ROUTE_METADATA_KEY, STATUS_UPSTREAM_FAILED, get_proxy

# nemo-gym retries these statuses (429/502/503/504/520 forever): the proxy must never answer them.
GYM_RETRY_STATUSES = {429, 500, 502, 503, 504, 520}


@pytest.fixture
def proxy() -> Iterator[RoutingProxy]:
    with RoutingProxy(max_retries=2, backoff=0.01, backoff_max=0.02, upstream_timeout=60) as p:
        yield p


@pytest.fixture
async def fake() -> AsyncIterator[FakeUpstream]:
    async with FakeUpstream("u0") as f:
        yield f


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        yield session


def gym_body(key: str, text: str = "hi", **extra: Any) -> dict[str, Any]:
    """A policy request as a Gym agent sends it, with the route key where the harness puts it."""
    metadata = {ROUTE_METADATA_KEY: key, **extra.pop("metadata", {})}
    return {
        "model": key,
        "metadata": metadata,
        "input": [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": text}],
        **extra,
    }


async def post(client: aiohttp.ClientSession, proxy: RoutingProxy, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with client.post(f"{proxy.base_url}/responses", json=body) as resp:
        return resp.status, await resp.json()


def reply_text(response: dict[str, Any]) -> str:
    messages = [item for item in response["output"] if item["type"] == "message"]
    return messages[-1]["content"][0]["text"]


async def until(predicate: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.005)


# -- routing ---------------------------------------------------------------------------------


async def test_thousand_concurrent_routes_reach_only_their_own_upstream(
    proxy: RoutingProxy, client: aiohttp.ClientSession
) -> None:
    fakes = [FakeUpstream(f"u{i}") for i in range(8)]
    for f in fakes:
        await f.start()
    try:
        routes = []
        for j in range(1000):
            i = j % 8
            endpoint = Endpoint(
                base_url=fakes[i].base_url,
                model=f"model-{i}",
                api_key=f"sk-{i}-secret",
                api="chat" if (j // 8) % 2 else "responses",
            )
            routes.append((i, proxy.open_route(endpoint)))
        order = list(range(1000))
        random.Random(0).shuffle(order)

        results = await asyncio.gather(
            *(post(client, proxy, gym_body(routes[j][1].key, metadata={"row": str(j)})) for j in order)
        )

        crossed = 0
        for j, (status, response) in zip(order, results, strict=True):
            i, route = routes[j]
            assert status == 200, response
            seen = json.loads(reply_text(response))
            crossed += (seen["upstream"], seen["model"], seen["authorization"]) != (
                f"u{i}",
                f"model-{i}",
                f"Bearer sk-{i}-secret",
            )
            assert response["model"] == f"model-{i}"
            assert [c.status for c in route.calls] == [200]
        assert crossed == 0
        assert sum(len(f.requests) for f in fakes) == 1000
        for i, f in enumerate(fakes):
            assert {r.authorization for r in f.requests} == {f"Bearer sk-{i}-secret"}
            for r in f.requests:
                assert "vnr-" not in json.dumps(r.body)  # no route key ever goes upstream
                if r.path.endswith("/responses"):
                    assert set(r.body["metadata"]) == {"row"}
    finally:
        for f in fakes:
            await f.close()


async def test_unknown_key_is_refused_with_404(
    proxy: RoutingProxy, fake: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    proxy.open_route(Endpoint(base_url=fake.base_url, model="m"))

    status, body = await post(client, proxy, gym_body("vnr-not-a-key"))
    no_key_status, _ = await post(client, proxy, {"input": "hi"})

    assert status == 404 and body["error"]["type"] == "route_not_found"
    assert no_key_status == 404
    assert fake.requests == []


async def test_closed_key_is_refused_with_410_and_never_delivered_elsewhere(
    proxy: RoutingProxy, fake: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    closed = proxy.open_route(Endpoint(base_url=fake.base_url, model="m", api_key="sk-closed"))
    other = proxy.open_route(Endpoint(base_url=fake.base_url, model="m", api_key="sk-other"))
    closed.close()
    closed.close()  # idempotent

    status, body = await post(client, proxy, gym_body(closed.key))
    other_status, _ = await post(client, proxy, gym_body(other.key))

    assert status == 410 and body["error"]["type"] == "route_closed"
    assert other_status == 200
    assert [r.authorization for r in fake.requests] == ["Bearer sk-other"]
    assert closed.calls == [] and len(other.calls) == 1


async def test_late_call_after_close_is_refused(
    proxy: RoutingProxy, fake: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    route = proxy.open_route(Endpoint(base_url=fake.base_url, model="m"))
    first, _ = await post(client, proxy, gym_body(route.key))
    route.close()

    late, body = await post(client, proxy, gym_body(route.key))

    assert (first, late) == (200, 410)
    assert len(route.calls) == 1 and len(fake.requests) == 1
    assert route.key[:10] in body["error"]["message"] and route.key not in body["error"]["message"]


async def test_close_cancels_the_call_in_flight_and_keeps_it_as_unanswered(
    proxy: RoutingProxy, fake: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    """A rollout that times out keeps the call it was waiting on: what was sent, no reply, how long it waited."""
    route = proxy.open_route(Endpoint(base_url=fake.base_url, model="m"))
    fake.script(FakeReply.hang())
    pending = asyncio.create_task(post(client, proxy, gym_body(route.key, "still thinking?")))
    await until(lambda: route.in_flight == 1)
    await asyncio.sleep(0.2)

    route.close()
    status, _ = await asyncio.wait_for(pending, 5)

    assert status == 410 and route.in_flight == 0
    [call] = route.calls
    assert call.error is not None and call.error.type == "upstream_timeout" and "no reply" in call.error.message
    assert call.response is None and call.status == 410 and call.latency_s >= 0.2
    assert call.request["input"][-1]["content"] == "still thinking?" and call.request["model"] == "m"
    assert route.error is None  # the rollout's error is its own timeout, not this call's


async def test_metadata_key_wins_over_model_and_never_falls_back(
    proxy: RoutingProxy, fake: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    a = proxy.open_route(Endpoint(base_url=fake.base_url, model="model-a"))
    b = proxy.open_route(Endpoint(base_url=fake.base_url, model="model-b"))

    status, response = await post(client, proxy, {**gym_body(a.key), "model": b.key})
    unknown, _ = await post(client, proxy, {**gym_body("vnr-unknown"), "model": b.key})

    assert status == 200 and response["model"] == "model-a"
    assert unknown == 404
    assert len(a.calls) == 1 and b.calls == []


@pytest.mark.parametrize("prefix", ["/ng-rollout/7-0-a1", "/ng-rollout/7-0-a1/training-token-capture"])
async def test_a_call_under_gym_s_rollout_path_prefix_is_routed_as_without_it(
    proxy: RoutingProxy, fake: FakeUpstream, client: aiohttp.ClientSession, prefix: str
) -> None:
    """nemo-gym 0.7's environment servers hand their agent the model's URL under /ng-rollout/<rollout id>/ (Gym's
    model servers strip it): the call reaches its route as any other."""
    route = proxy.open_route(Endpoint(base_url=fake.base_url, model="m"))

    async with client.post(f"{proxy.url}{prefix}/v1/responses", json=gym_body(route.key)) as resp:
        assert resp.status == 200, await resp.text()
    async with client.get(f"{proxy.url}{prefix}/v1/models") as resp:
        assert resp.status == 200

    assert len(route.calls) == 1 and fake.requests[0].body["model"] == "m"


async def test_request_is_rewritten_for_the_endpoint(
    proxy: RoutingProxy, fake: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    endpoint = Endpoint(
        base_url=fake.base_url,
        model="real-model",
        api_key="sk-real",
        sampling_args={"temperature": 0.1, "top_p": 0.5, "max_tokens": 64},
        extra_headers={"X-Tenant": "t1"},
        extra_body={"seed": 7},
    )
    route = proxy.open_route(endpoint, sampling_args={"top_p": 0.9, "extra_body": {"top_k": 5}})

    status, _ = await post(client, proxy, gym_body(route.key, temperature=0.7))

    sent = fake.requests[0]
    assert status == 200
    assert sent.body["model"] == "real-model"
    assert "metadata" not in sent.body  # emptied once the route key is stripped
    assert (sent.body["temperature"], sent.body["top_p"], sent.body["top_k"], sent.body["seed"]) == (
        0.7,
        0.9,
        5,
        7,
    )
    assert sent.body["max_output_tokens"] == 64 and "max_tokens" not in sent.body
    assert sent.authorization == "Bearer sk-real" and sent.headers["X-Tenant"] == "t1"
    assert route.calls[0].request == sent.body


async def test_gzip_upstream_body_is_decoded(proxy: RoutingProxy, client: aiohttp.ClientSession) -> None:
    async with FakeUpstream("gz", gzip=True) as fake:
        responses = proxy.open_route(Endpoint(base_url=fake.base_url, model="m"))
        chat = proxy.open_route(Endpoint(base_url=fake.base_url, model="m", api="chat"))

        results = [await post(client, proxy, gym_body(r.key)) for r in (responses, chat)]

    assert [status for status, _ in results] == [200, 200]
    assert all(json.loads(reply_text(body))["upstream"] == "gz" for _, body in results)


async def test_stream_true_is_refused_with_400(
    proxy: RoutingProxy, fake: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    route = proxy.open_route(Endpoint(base_url=fake.base_url, model="m"))

    status, body = await post(client, proxy, gym_body(route.key, stream=True))

    assert status == 400 and body["error"]["type"] == "streaming_unsupported"
    assert fake.requests == []


async def test_health_and_models_answer(proxy: RoutingProxy, client: aiohttp.ClientSession) -> None:
    for path in ("/", "/health", "/v1/models"):
        async with client.get(proxy.url + path) as resp:
            assert resp.status == 200, path
            await resp.json()
    async with client.post(proxy.url + "/v1/chat/completions", json={}) as resp:
        assert resp.status == 404 and (await resp.json())["error"]["type"] == "not_found"
    async with client.post(proxy.base_url + "/responses", data=b"{nope") as resp:
        assert resp.status == 400


# -- failures --------------------------------------------------------------------------------


async def test_retries_then_success(proxy: RoutingProxy, fake: FakeUpstream, client: aiohttp.ClientSession) -> None:
    route = proxy.open_route(Endpoint(base_url=fake.base_url, model="m"))
    fake.script(FakeReply.error(503, times=1), FakeReply.error(429, retry_after=0, times=1))

    status, _ = await post(client, proxy, gym_body(route.key))

    assert status == 200
    assert route.calls[0].attempts == 3 and route.error is None


@pytest.mark.parametrize("upstream_status", [429, 500, 503, 520])
async def test_retries_exhausted_record_typed_error_and_answer_non_retryable_status(
    proxy: RoutingProxy, fake: FakeUpstream, client: aiohttp.ClientSession, upstream_status: int
) -> None:
    route = proxy.open_route(Endpoint(base_url=fake.base_url, model="m", api="chat"))
    fake.script(FakeReply.error(upstream_status, times=10))

    status, body = await post(client, proxy, gym_body(route.key))

    assert status == STATUS_UPSTREAM_FAILED and status not in GYM_RETRY_STATUSES
    assert body["error"]["type"] == "upstream_http" and body["error"]["upstream_status"] == upstream_status
    assert isinstance(route.error, UpstreamError) and route.error.type == "upstream_http"
    assert len(fake.requests) == 3  # 1 + max_retries
    [call] = route.calls
    assert (call.status, call.attempts, call.upstream_status, call.response) == (
        424,
        3,
        upstream_status,
        None,
    )


async def test_client_error_is_not_retried(
    proxy: RoutingProxy, fake: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    route = proxy.open_route(Endpoint(base_url=fake.base_url, model="m"))
    fake.script(FakeReply.error(401, "bad key"))

    status, _ = await post(client, proxy, gym_body(route.key))

    assert status == STATUS_UPSTREAM_FAILED and len(fake.requests) == 1
    assert isinstance(route.error, UpstreamError) and route.error.kind == "http"


async def test_conflict_409_is_not_retried(
    proxy: RoutingProxy, fake: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    route = proxy.open_route(Endpoint(base_url=fake.base_url, model="m"))
    fake.script(FakeReply.error(409, "conflict", times=5))

    status, body = await post(client, proxy, gym_body(route.key))

    assert status == STATUS_UPSTREAM_FAILED and body["error"]["upstream_status"] == 409
    assert len(fake.requests) == 1 and route.calls[0].attempts == 1


async def test_upstream_hang_is_bounded(fake: FakeUpstream, client: aiohttp.ClientSession) -> None:
    with RoutingProxy(upstream_timeout=0.3, backoff=0.01) as proxy:
        route = proxy.open_route(Endpoint(base_url=fake.base_url, model="m"))
        fake.script(FakeReply.hang(times=10))
        started = time.monotonic()

        status, _ = await post(client, proxy, gym_body(route.key))

        assert status == STATUS_UPSTREAM_FAILED
        assert time.monotonic() - started < 5.0
        assert isinstance(route.error, UpstreamError) and route.error.kind == "timeout"


async def test_unreachable_upstream_fails_fast(proxy: RoutingProxy, client: aiohttp.ClientSession) -> None:
    with socket.socket() as s:  # a port with nobody listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    route = proxy.open_route(Endpoint(base_url=f"http://127.0.0.1:{port}/v1", model="m"))

    status, _ = await post(client, proxy, gym_body(route.key))

    assert status == STATUS_UPSTREAM_FAILED
    assert isinstance(route.error, UpstreamError) and route.error.kind == "connection"
    assert route.calls[0].attempts == 3


@pytest.mark.parametrize("api", ["responses", "chat"])
@pytest.mark.parametrize(
    "reply",
    [
        FakeReply.garbage(times=5),
        FakeReply.json({"hello": "world"}, times=5),
        FakeReply.json([1, 2], times=5),
    ],
    ids=["garbage", "schema-invalid", "not-an-object"],
)
async def test_garbage_from_upstream_is_an_upstream_error(
    proxy: RoutingProxy, fake: FakeUpstream, client: aiohttp.ClientSession, api: str, reply: FakeReply
) -> None:
    route = proxy.open_route(Endpoint(base_url=fake.base_url, model="m", api=api))  # type: ignore[arg-type]
    fake.script(reply)

    status, body = await post(client, proxy, gym_body(route.key))

    assert status == STATUS_UPSTREAM_FAILED and body["error"]["kind"] == "protocol"
    assert isinstance(route.error, UpstreamError) and route.error.kind == "protocol"
    assert len(fake.requests) == 1  # a broken answer is not retried


async def test_connection_reset_mid_body_is_retried_then_typed(
    proxy: RoutingProxy, fake: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    healed = proxy.open_route(Endpoint(base_url=fake.base_url, model="m"))
    fake.script(FakeReply.reset())
    healed_status, _ = await post(client, proxy, gym_body(healed.key))

    broken = proxy.open_route(Endpoint(base_url=fake.base_url, model="m"))
    fake.script(FakeReply.reset(times=5))
    broken_status, _ = await post(client, proxy, gym_body(broken.key))

    assert healed_status == 200 and healed.calls[0].attempts == 2
    assert broken_status == STATUS_UPSTREAM_FAILED
    assert isinstance(broken.error, UpstreamError) and broken.error.kind == "connection"


async def test_context_overflow_ends_the_rollout_as_incomplete(
    proxy: RoutingProxy, fake: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    route = proxy.open_route(Endpoint(base_url=fake.base_url, model="m", api="chat"))
    fake.script(FakeReply.error(400, "This model's maximum context length is 4096 tokens. However, ..."))

    status, response = await post(client, proxy, gym_body(route.key))

    assert status == 200
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert route.calls[0].context_overflow and route.error is None


async def test_unconvertible_request_is_refused_with_400(
    proxy: RoutingProxy, fake: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    route = proxy.open_route(Endpoint(base_url=fake.base_url, model="m", api="chat"))
    body = gym_body(route.key)
    body["input"].append({"type": "web_search_call", "id": "ws_1", "status": "completed"})

    status, reply = await post(client, proxy, body)

    assert status == 400 and reply["error"]["kind"] == "conversion"
    assert isinstance(route.error, UpstreamError) and route.error.kind == "conversion"
    assert fake.requests == []


async def test_api_key_never_appears_in_recorded_calls(
    proxy: RoutingProxy, fake: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    key = "sk-very-secret-0123456789"
    endpoint = Endpoint(base_url=fake.base_url, model="m", api_key=key, api="chat")
    route = proxy.open_route(endpoint)
    fake.script(FakeReply.say("ok"), FakeReply.error(401, f"invalid api key {key}"))

    ok, _ = await post(client, proxy, gym_body(route.key))
    failed, body = await post(client, proxy, gym_body(route.key))

    assert (ok, failed) == (200, STATUS_UPSTREAM_FAILED)
    assert all(r.authorization == f"Bearer {key}" for r in fake.requests)  # the upstream did get it
    recorded = json.dumps([c.to_dict() for c in route.calls])
    assert key not in recorded and "***" in recorded
    assert key not in json.dumps(body) and key not in repr(route) and key not in repr(endpoint)


# -- recording, token data -------------------------------------------------------------------


async def test_tool_call_rollout_records_token_ids_and_logprobs_contiguously(
    proxy: RoutingProxy, client: aiohttp.ClientSession
) -> None:
    async with FakeUpstream("vllm", token_ids=True) as fake:
        endpoint = Endpoint(
            base_url=fake.base_url,
            model="m",
            api="chat",
            sampling_args={"logprobs": True, "extra_body": {"return_token_ids": True}},
        )
        route = proxy.open_route(endpoint)
        fake.script(
            FakeReply.call_tools(("get_weather", {"city": "Paris"}), ("get_time", {}), reasoning="Two tools."),
            FakeReply.say("Sunny, noon.", reasoning="Done."),
        )
        body = gym_body(route.key, "Weather?")
        tools = [{"type": "function", "name": n, "parameters": {"type": "object"}} for n in ("get_weather", "get_time")]
        body["tools"] = tools

        # Play the Gym agent: send, append outputs and tool results, send again.
        status1, first = await post(client, proxy, body)
        body["input"] += first["output"] + [
            {"type": "function_call_output", "call_id": item["call_id"], "output": "42"}
            for item in first["output"]
            if item["type"] == "function_call"
        ]
        status2, second = await post(client, proxy, body)

        calls = route.calls
        assert (status1, status2) == (200, 200)
        assert [item["type"] for item in first["output"]] == ["reasoning", "function_call", "function_call"]
        assert all(c.has_tokens and c.completion_logprobs is not None for c in calls)
        assert len(calls[0].completion_token_ids or []) == len(calls[0].completion_logprobs or [])
        assert first["output"][-1]["generation_token_ids"] == calls[0].completion_token_ids
        assert second["output"][-1]["prompt_token_ids"] == calls[1].prompt_token_ids
        assert check_contiguity(calls)
        # Training fields Gym sends back on earlier items never go upstream.
        assert "prompt_token_ids" not in json.dumps(fake.requests[1].body)
        assert fake.requests[1].body["messages"][2]["tool_calls"][1]["function"]["name"] == "get_time"


def _call(index: int, prompt: list[int], completion: list[int]) -> PolicyCall:
    return PolicyCall(
        index=index,
        response_json=b'{"output": []}',
        status=200,
        latency_s=0.0,
        attempts=1,
        started_at=0.0,
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        completion_logprobs=[0.0] * len(completion),
    )


def test_contiguity_check_passes_on_a_good_sequence_and_fails_on_a_broken_one() -> None:
    good = [_call(0, [1, 2], [3]), _call(1, [1, 2, 3, 4], [5]), _call(2, [1, 2, 3, 4, 5, 6], [7])]
    broken = [_call(0, [1, 2], [3]), _call(1, [1, 2, 9, 4], [5])]
    truncated = [_call(0, [1, 2], [3]), _call(1, [1, 2], [5])]
    missing = [_call(0, [1, 2], [3]), PolicyCall(1, 200, 0.0, 1, 0.0, response_json=b'{"output": []}')]

    assert check_contiguity(good).ok
    result = check_contiguity(broken)
    assert not result and result.broken_at == 1 and "position 2" in result.message
    assert not check_contiguity(truncated)
    assert not check_contiguity(missing)
    assert not check_contiguity([])


async def test_wait_for_calls_and_on_call_observe_recording(
    proxy: RoutingProxy, fake: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    seen: list[int] = []
    route = proxy.open_route(Endpoint(base_url=fake.base_url, model="m"), on_call=lambda c: seen.append(c.index))
    waiter = asyncio.create_task(route.wait_for_calls(2, timeout=5))

    for _ in range(2):
        await post(client, proxy, gym_body(route.key))
    calls = await waiter

    assert [c.index for c in calls] == [0, 1] and seen == [0, 1]
    assert route.usage["total_tokens"] == sum(c.usage["total_tokens"] for c in calls if c.usage)
    with pytest.raises(TimeoutError):
        await route.wait_for_calls(3, timeout=0.05)


async def test_function_upstream_replies_are_validated(proxy: RoutingProxy, client: aiohttp.ClientSession) -> None:
    def answer(endpoint: Endpoint, body: dict[str, Any]) -> dict[str, Any]:
        text = body["input"][-1]["content"]
        if text == "bad":
            return {"output": [{"type": "web_search_call", "id": "ws", "status": "completed"}]}
        item: dict[str, Any] = {"id": "m1", "type": "message", "role": "assistant", "status": "completed"}
        item["content"] = [{"type": "output_text", "text": text.upper(), "annotations": []}]
        return {"output": [item], "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2}}

    route = proxy.open_route(Endpoint(base_url="http://unused/v1", model="replay"), upstream=FunctionUpstream(answer))

    ok, response = await post(client, proxy, gym_body(route.key, "echo"))
    bad, _ = await post(client, proxy, gym_body(route.key, "bad"))

    assert ok == 200 and reply_text(response) == "ECHO" and response["model"] == "replay"
    assert response["usage"]["input_tokens_details"] == {"cached_tokens": 0}
    assert bad == STATUS_UPSTREAM_FAILED and "web_search_call" in str(route.error)


async def test_record_requests_false_drops_the_conversation(
    proxy: RoutingProxy, fake: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    route = proxy.open_route(Endpoint(base_url=fake.base_url, model="m"), record_requests=False)

    await post(client, proxy, gym_body(route.key))

    assert "input" not in route.calls[0].request and route.calls[0].request["model"] == "m"


# -- lifecycle -------------------------------------------------------------------------------


def test_proxy_lifecycle_is_idempotent_and_releases_the_port() -> None:
    proxy = RoutingProxy()
    proxy.start()
    proxy.start()
    port = proxy.port
    proxy.stop()
    proxy.stop()

    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # the port is free again
    with pytest.raises(RuntimeError):
        _ = proxy.port
    with pytest.raises(ConfigurationError):
        RoutingProxy(host="0.0.0.0")


def test_routes_opened_from_many_threads_get_distinct_keys(proxy: RoutingProxy) -> None:
    endpoint = Endpoint(base_url="http://127.0.0.1:9/v1", model="m")
    keys: list[str] = []

    def open_many() -> None:
        keys.extend(proxy.open_route(endpoint).key for _ in range(200))

    threads = [threading.Thread(target=open_many) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert len(set(keys)) == 800 and proxy.open_routes == 800
    assert all(len(k) >= 32 for k in keys)


def test_get_proxy_returns_one_shared_running_proxy() -> None:
    first = get_proxy()
    try:
        assert get_proxy() is first and first.running
    finally:
        first.stop()
