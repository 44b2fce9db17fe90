"""Replicas with health: a replica that does not connect (or times out) leaves the rotation at once, the call and
the rollout's later calls move to a live one, an HTTP error is an answer (the replica stays), the one that left is
probed and rejoins; the summary names it. Real proxy, real sockets on 127.0.0.1; probes are plain functions."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest

from tests.unit.fake_upstream import FakeReply, FakeUpstream, Frozen, Refuser
from verifiers_nemo import ConfigurationError, Endpoint, Replicas, RoutingProxy
from verifiers_nemo._cli.parser import build_parser
from verifiers_nemo._cli.settings import new_settings
from verifiers_nemo._eval import format_summary, run_metadata
from verifiers_nemo._routing import ROUTE_METADATA_KEY, STATUS_UPSTREAM_FAILED

SECRET = "sk-replica-secret-0123456789"


def endpoint(name: str, base_url: str | None = None) -> Endpoint:
    return Endpoint(base_url=base_url or f"http://127.0.0.1:9/{name}/v1", model="m", name=name, api_key=SECRET)


def until(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.005)


class SwitchProbe:
    """A probe that answers what ``alive`` says, counting the probes of each replica."""

    def __init__(self) -> None:
        self.alive: set[str] = set()
        self.probed: dict[str, int] = {}
        self._lock = threading.Lock()

    def __call__(self, e: Endpoint) -> bool:
        with self._lock:
            self.probed[e.label] = self.probed.get(e.label, 0) + 1
        return e.label in self.alive


# -- the health view ---------------------------------------------------------------------------------


def test_a_replica_reported_down_gets_no_rollout_until_its_probe_answers_then_rejoins() -> None:
    probe = SwitchProbe()
    with Replicas([endpoint("a"), endpoint("b")], probe=probe, probe_first=0.01, probe_max=0.02) as replicas:
        replicas.report_down(endpoint("a"), "connection: refused")

        picks = []
        for _ in range(4):
            lease = replicas.acquire()
            picks.append(lease.endpoint.name)
            lease.release()
        assert picks == ["b"] * 4
        until(lambda: probe.probed.get("a", 0) >= 2)  # probed again and again while it does not answer
        assert [name for name, _ in replicas.down()] == ["a"]

        probe.alive.add("a")
        until(lambda: not replicas.down())

        [outage] = replicas.outages()
        assert outage.replica == "a" and outage.reason == "connection: refused"
        assert outage.seconds is not None and outage.to_dict()["rejoined"] is True
        picks = [replicas.acquire().endpoint.name for _ in range(2)]
        assert sorted(picks) == ["a", "b"]  # back in the rotation


def test_fail_over_moves_the_rollout_and_its_count_to_the_least_loaded_live_replica() -> None:
    with Replicas([endpoint("a"), endpoint("b"), endpoint("c")], probe=SwitchProbe()) as replicas:
        on_a = replicas.acquire()
        on_b = replicas.acquire()
        assert (on_a.endpoint.name, on_b.endpoint.name) == ("a", "b")

        moved = on_a.fail_over(on_a.endpoint, "timeout: connection not established within 10 s")

        assert moved is not None and moved.name == "c"  # b has one in flight, c none
        assert on_a.endpoint.name == "c" and replicas.in_flight() == [0, 1, 1]
        on_a.release()
        on_a.release()  # idempotent
        assert replicas.in_flight() == [0, 1, 0]


def test_with_every_replica_down_a_rollout_still_starts_and_fail_over_says_none_is_left() -> None:
    with Replicas([endpoint("a"), endpoint("b")], probe=SwitchProbe()) as replicas:
        replicas.report_down("a", "connection: refused")  # by label, as a Ray worker's result names it
        lease = replicas.acquire()
        assert lease.endpoint.name == "b"

        assert lease.fail_over(lease.endpoint, "connection: refused") is None

        assert {name for name, _ in replicas.down()} == {"a", "b"}
        assert replicas.acquire().endpoint.name in {"a", "b"}  # placed anyway: its calls fail as they would alone


def test_old_news_of_a_replica_that_rejoined_since_is_ignored() -> None:
    probe = SwitchProbe()
    probe.alive.add("a")
    with Replicas([endpoint("a"), endpoint("b")], probe=probe, probe_first=0.01) as replicas:
        seen_at = time.time()
        replicas.report_down("a", "connection: refused", seen_at=seen_at)
        until(lambda: not replicas.down())

        replicas.report_down("a", "a call on a worker moved off it", seen_at=seen_at)

        assert not replicas.down() and len(replicas.outages()) == 1


def test_a_replica_still_down_when_the_run_ends_is_reported_so_for_the_time_until_then() -> None:
    replicas = Replicas([endpoint("a"), endpoint("b")], probe=SwitchProbe(), probe_first=60)
    replicas.report_down("b", "connection: refused")

    replicas.close()

    [outage] = replicas.outages()
    first = outage.to_dict()
    assert first["rejoined"] is False and first["replica"] == "b"
    assert outage.duration() == outage.duration(time.monotonic() + 100)  # stopped counting at close()


def test_an_empty_replica_list_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="empty list"):
        Replicas([])


# -- calls through the proxy ------------------------------------------------------------------------


def free_port_url() -> str:
    with socket.socket() as s:  # a port with nobody listening
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/v1"


@pytest.fixture
def proxy() -> Iterator[RoutingProxy]:
    with RoutingProxy(max_retries=3, backoff=0.01, backoff_max=0.02, upstream_timeout=60) as p:
        yield p


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def post(client: aiohttp.ClientSession, proxy: RoutingProxy, key: str) -> tuple[int, dict[str, Any]]:
    body = {"model": key, "metadata": {ROUTE_METADATA_KEY: key}, "input": [{"role": "user", "content": "hi"}]}
    async with client.post(f"{proxy.base_url}/responses", json=body) as resp:
        return resp.status, await resp.json()


def answered_by(response: dict[str, Any]) -> str:
    message = [item for item in response["output"] if item["type"] == "message"][-1]
    return json.loads(message["content"][0]["text"])["upstream"]


async def test_a_call_whose_replica_drops_the_connection_moves_at_once_and_the_later_calls_stay(
    proxy: RoutingProxy, client: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with Refuser() as dead, FakeUpstream("live") as live:
        a, b = endpoint("a", dead.base_url), endpoint("b", live.base_url)
        with Replicas([a, b], probe=SwitchProbe(), probe_first=60) as replicas:
            lease = replicas.acquire()
            assert lease.endpoint == a
            route = proxy.open_route(a, lease=lease)

            first = await post(client, proxy, route.key)
            second = await post(client, proxy, route.key)

            assert [status for status, _ in (first, second)] == [200, 200]
            assert [answered_by(reply) for _, reply in (first, second)] == ["live", "live"]
            assert dead.accepted == 1  # left at once: not retried there while another replica was live
            assert route.failed_over == ["a"] and route.endpoint == b and route.error is None
            assert [name for name, _ in replicas.down()] == ["a"]
            assert replicas.in_flight() == [0, 1]
            assert live.requests[0].authorization == f"Bearer {SECRET}"
            route.close()
    assert SECRET not in caplog.text and SECRET not in replicas.outages()[0].reason


@pytest.mark.parametrize("reply", [FakeReply.error(500, times=10), FakeReply.error(400, times=10)], ids=["500", "400"])
async def test_a_replica_that_answers_an_http_error_is_not_dead(
    proxy: RoutingProxy, client: aiohttp.ClientSession, reply: FakeReply
) -> None:
    async with FakeUpstream("erring") as erring, FakeUpstream("other") as other:
        erring.script(reply)
        a, b = endpoint("a", erring.base_url), endpoint("b", other.base_url)
        with Replicas([a, b], probe=SwitchProbe()) as replicas:
            route = proxy.open_route(a, lease=replicas.acquire())

            status, body = await post(client, proxy, route.key)

            assert status == STATUS_UPSTREAM_FAILED and body["error"]["type"] == "upstream_http"
            assert not replicas.down() and not route.failed_over and not other.requests
            route.close()


async def test_with_no_replica_left_the_call_fails_typed_after_the_usual_retries(
    proxy: RoutingProxy, client: aiohttp.ClientSession
) -> None:
    async with Refuser() as first, Refuser() as second:
        a, b = endpoint("a", first.base_url), endpoint("b", second.base_url)
        with Replicas([a, b], probe=SwitchProbe(), probe_first=60) as replicas:
            route = proxy.open_route(a, lease=replicas.acquire())

            status, body = await post(client, proxy, route.key)

            assert status == STATUS_UPSTREAM_FAILED and body["error"]["kind"] == "connection"
            assert (first.accepted, second.accepted) == (1, 4)  # the last one left gets 1 + max_retries
            assert {name for name, _ in replicas.down()} == {"a", "b"}
            route.close()


async def test_a_replica_that_answers_a_call_rejoins_without_waiting_for_its_probe(
    proxy: RoutingProxy, client: aiohttp.ClientSession
) -> None:
    async with FakeUpstream("back") as back:
        a, b = endpoint("a", back.base_url), endpoint("b", free_port_url())
        with Replicas([a, b], probe=SwitchProbe(), probe_first=60) as replicas:
            replicas.report_down(a, "connection: refused")
            replicas.report_down(b, "connection: refused")
            route = proxy.open_route(a, lease=replicas.acquire(prefer=a))

            status, reply = await post(client, proxy, route.key)

            assert status == 200 and answered_by(reply) == "back"
            assert [name for name, _ in replicas.down()] == ["b"]
            route.close()


async def test_a_replica_that_hangs_leaves_the_rotation_while_it_hangs_and_its_call_moves(
    proxy: RoutingProxy, client: aiohttp.ClientSession
) -> None:
    """The call's budget is 60 s; the hang watch finds the frozen replica (its call waits, GET /models gets no
    answer while the other replica is live), takes it out and sends the call to the live one, long before."""
    async with Frozen() as frozen, FakeUpstream("live") as live:
        a, b = endpoint("a", frozen.base_url), endpoint("b", live.base_url)
        with Replicas([a, b], probe_first=60, hang_after=0.3, hang_probe_timeout=0.5) as replicas:
            route = proxy.open_route(a, lease=replicas.acquire(prefer=a))

            status, reply = await asyncio.wait_for(post(client, proxy, route.key), 50)

            assert status == 200 and answered_by(reply) == "live"
            assert route.failed_over == ["a"] and route.error is None
            assert [name for name, _ in replicas.down()] == ["a"]
            (outage,) = replicas.outages()
            assert outage.reason.startswith("hung: 1 call(s) unanswered for") and "GET /models" in outage.reason
            later = await post(client, proxy, route.key)  # the rollout's next call: on the live one
            assert answered_by(later[1]) == "live" and frozen.accepted >= 1
            route.close()


async def test_a_slow_replica_that_answers_its_probe_is_never_taken_out(
    proxy: RoutingProxy, client: aiohttp.ClientSession
) -> None:
    """A long generation is not a hang: the replica's call waits well past hang_after, its probe answers, and the
    call stays where it is."""
    probe = SwitchProbe()
    probe.alive = {"a", "b"}
    async with FakeUpstream("slow") as slow, FakeUpstream("other") as other:
        slow.script(FakeReply.hang())
        a, b = endpoint("a", slow.base_url), endpoint("b", other.base_url)
        with Replicas([a, b], probe=probe, hang_after=0.2) as replicas:
            route = proxy.open_route(a, lease=replicas.acquire(prefer=a))
            waiting = asyncio.ensure_future(post(client, proxy, route.key))

            await asyncio.to_thread(until, lambda: probe.probed.get("a", 0) >= 3)

            assert not waiting.done() and not replicas.down() and not route.failed_over
            assert not other.requests and "b" not in probe.probed  # only the replica with a waiting call is asked
            waiting.cancel()
            route.close()


def test_a_replica_whose_calls_the_watch_never_sees_is_left_to_the_call_s_budget() -> None:
    """One replica (nowhere to move a call), or the watch turned off: nothing is watched."""
    task: Any = object()
    assert Replicas([endpoint("a")]).watch(endpoint("a"), task) is None
    assert Replicas([endpoint("a"), endpoint("b")], hang_after=None).watch(endpoint("a"), task) is None


# -- what the user reads ---------------------------------------------------------------------------


def test_the_summary_names_each_replica_that_was_down_and_for_how_long() -> None:
    settings = new_settings(build_parser().parse_args(["eval", "example_multi_step", "-b", "http://a/v1,http://b/v1"]))
    records = [{"task_index": i, "rollout_index": 0, "reward": 1.0, "metrics": {}, "error": None} for i in range(3)]
    outage = {"replica": "m@http://b/v1", "started_at": 0.0, "seconds": 12.5, "rejoined": False, "reason": "x"}
    sessions = [{"started_at": 0.0, "wall_s": 20.0, "replica_outages": [outage]}]

    metadata = run_metadata({"status": "finished"}, settings, None, 3, records, sessions)

    assert metadata["summary"]["replicas"] == [
        {"replica": "m@http://b/v1", "outages": 1, "seconds": 12.5, "still_down": True, "reason": "x"}
    ]
    text = format_summary(metadata)
    assert "m@http://b/v1 out of the rotation 1 time, 12.50s in all (still down at the end)" in text


async def test_the_progress_line_says_at_once_which_replica_is_down_and_for_how_long(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import io

    from verifiers_nemo._cli.progress import Progress

    down: list[tuple[str, float]] = []
    progress = Progress(stream=io.StringIO())  # not a terminal: plain lines
    progress.watch_model(lambda: (0, 0.0))
    progress.watch_replicas(lambda: list(down))
    progress.rollouts_starting(10, 0)
    try:
        down.append(("m@http://127.0.0.1:9/v1", 12.4))
        deadline = time.monotonic() + 20
        said = ""
        while "replica down" not in said:  # on the next tick, not 30 s later
            assert time.monotonic() < deadline, "no progress line named the replica"
            await asyncio.sleep(0.05)
            said += capsys.readouterr().err
        assert "replica down: m@http://127.0.0.1:9/v1 (12s)" in said
    finally:
        progress.close()
