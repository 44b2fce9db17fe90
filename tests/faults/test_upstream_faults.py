"""Upstream faults through the real stack (Gym agent, resources server, proxy): 5xx/429 that heal and
that never heal, hangs, resets, garbage and schema-invalid replies. Each fault ends as a typed
per-rollout error within a bound, never as a lost rollout, a hang, or a reward of 0."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest

from tests.e2e.policies import PolicyServer, counter_policy
from tests.faults.helpers import (
    BACKOFF,
    BACKOFF_MAX,
    COUNTER_ENV,
    MAX_RETRIES,
    UPSTREAM_TIMEOUT,
    BrokenPolicy,
    FlakyPolicy,
    HangPolicy,
    record_figures,
    tagged_counter_rows,
    until,
)
from tests.unit.fake_upstream import FakeReply, FakeUpstream
from verifiers_nemo import Endpoint, NeMoGymHarness, NeMoGymTaskset
from verifiers_nemo._routing import STATUS_UPSTREAM_FAILED

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="package")]

# nemo-gym's own client retries these (429/502/503/504/520 forever): the agent must never get one.
GYM_RETRIED = {429, 500, 502, 503, 504, 520}
# Longest backoff the proxy may sleep over all retries of one call (before jitter shortens it).
MAX_BACKOFF_S = sum(min(BACKOFF_MAX, BACKOFF * 2**i) for i in range(MAX_RETRIES))
SLACK_S = 4.0  # Gym agent, resources server and process scheduling on a loaded 2-core machine


def _tasks(tmp_path: Path, count: int) -> tuple[NeMoGymTaskset, list[float]]:
    expected = tagged_counter_rows(tmp_path / "tasks.jsonl", count)
    return NeMoGymTaskset(COUNTER_ENV, jsonl_path=tmp_path / "tasks.jsonl"), expected


async def test_5xx_and_429_that_heal_are_retried_within_bounds_and_every_rollout_succeeds(
    harness: NeMoGymHarness, tmp_path: Path
) -> None:
    tasks, expected = _tasks(tmp_path, 24)
    flaky = FlakyPolicy(failures=2)
    async with PolicyServer(flaky) as server:
        endpoint = Endpoint(base_url=server.base_url, model="m")
        started = time.monotonic()
        results = [r async for r in harness.run(tasks, endpoint, concurrency=24)]
        wall = time.monotonic() - started

    lost = 24 - len({r.task_index for r in results})
    failed = [r for r in results if r.error is not None]
    record_figures(
        "upstream 500/429/503 x2 per call, then healed",
        faults_injected=sum(flaky.injected.values()),
        by_status=dict(flaky.injected),
        rollouts=len(results),
        rollouts_lost=lost,
        rollouts_failed=len(failed),
        wall_s=wall,
    )
    assert lost == 0 and len(results) == 24
    assert not failed, failed[0].error
    assert all(r.reward == expected[r.task_index] for r in results)
    assert set(flaky.injected) == {500, 429, 503}
    assert sum(flaky.injected.values()) == 24 * 4 * 2  # 4 policy calls a rollout, each refused twice
    for r in results:
        assert [(c.status, c.attempts) for c in r.trace] == [(200, 3)] * 4
        # two backoffs per call (at most 0.5 s and 1 s), four calls
        assert r.timing["policy_s"] <= 4 * (BACKOFF + 2 * BACKOFF) + SLACK_S
    assert harness.proxy.open_routes == 0


async def test_5xx_and_429_that_never_heal_are_typed_upstream_errors_in_bounded_time(
    harness: NeMoGymHarness, tmp_path: Path
) -> None:
    tasks, expected = _tasks(tmp_path, 24)
    broken = BrokenPolicy(retry_after="3600")  # a Retry-After of an hour must not stall a rollout
    async with PolicyServer(broken) as bad, PolicyServer(counter_policy) as good:
        bad_endpoint = Endpoint(base_url=bad.base_url, model="m", name="never-heals")
        good_endpoint = Endpoint(base_url=good.base_url, model="m", name="good")
        started = time.monotonic()
        results = [
            r
            async for r in harness.run(
                tasks, lambda t: bad_endpoint if t.task_index % 2 else good_endpoint, concurrency=24
            )
        ]
        wall = time.monotonic() - started

    by_index = {r.task_index: r for r in results}
    bad_results = [by_index[i] for i in range(1, 24, 2)]
    record_figures(
        "upstream 500/429/503 forever (Retry-After 3600)",
        faults_injected=sum(broken.injected.values()),
        rollouts=len(results),
        rollouts_lost=24 - len(by_index),
        typed_upstream_errors=sum(r.error is not None and r.error.type == "upstream_http" for r in bad_results),
        slowest_failed_rollout_s=max(r.timing["rollout_s"] for r in bad_results),
        bound_s=UPSTREAM_TIMEOUT + SLACK_S,
        wall_s=wall,
    )
    assert len(results) == 24 and sorted(by_index) == list(range(24))
    for r in bad_results:
        assert r.error is not None and r.error.type == "upstream_http", r.error
        assert r.reward is None  # never a silent 0
        (call,) = r.trace  # the agent got one definitive answer, not a retry loop
        assert call.status == STATUS_UPSTREAM_FAILED and call.status not in GYM_RETRIED
        assert call.upstream_status in {500, 429, 503}
        assert 1 <= call.attempts <= MAX_RETRIES + 1
        assert r.timing["rollout_s"] <= UPSTREAM_TIMEOUT + SLACK_S
    for index in range(0, 24, 2):
        assert by_index[index].error is None and by_index[index].reward == expected[index]
    assert wall <= 2 * (UPSTREAM_TIMEOUT + SLACK_S)
    assert sum(broken.injected.values()) <= 12 * (MAX_RETRIES + 1)


async def test_5xx_without_retry_after_uses_every_retry_within_the_backoff_bound(
    harness: NeMoGymHarness, tmp_path: Path
) -> None:
    tasks, _ = _tasks(tmp_path, 8)
    broken = BrokenPolicy(retry_after="0")
    async with PolicyServer(broken) as bad:
        results = [r async for r in harness.run(tasks, Endpoint(base_url=bad.base_url, model="m"), concurrency=8)]

    record_figures(
        "upstream 500/429/503 forever (no Retry-After)",
        faults_injected=sum(broken.injected.values()),
        rollouts_lost=8 - len(results),
        attempts_per_call=sorted({r.trace[0].attempts for r in results}),
        slowest_failed_rollout_s=max(r.timing["rollout_s"] for r in results),
        backoff_bound_s=MAX_BACKOFF_S,
    )
    assert len(results) == 8
    for r in results:
        assert r.error is not None and r.error.type == "upstream_http" and r.reward is None
        assert [(c.status, c.attempts) for c in r.trace] == [(STATUS_UPSTREAM_FAILED, MAX_RETRIES + 1)]
        assert r.trace[0].latency_s <= MAX_BACKOFF_S + 2.0
    assert sum(broken.injected.values()) == 8 * (MAX_RETRIES + 1)


async def test_hanging_upstream_hits_the_per_call_bound_and_nothing_stays_open(
    harness: NeMoGymHarness, tmp_path: Path
) -> None:
    tasks, _ = _tasks(tmp_path, 8)
    hang = HangPolicy()
    async with PolicyServer(hang) as server:
        started = time.monotonic()
        results = [r async for r in harness.run(tasks, Endpoint(base_url=server.base_url, model="m"), concurrency=8)]
        wall = time.monotonic() - started
        await until(lambda: hang.open == 0, 5, "the proxy closing its hung upstream calls")

    record_figures(
        "upstream hangs: per-call bound",
        faults_injected=hang.received,
        rollouts_lost=8 - len(results),
        typed_upstream_timeouts=sum(r.error is not None and r.error.type == "upstream_timeout" for r in results),
        per_call_bound_s=UPSTREAM_TIMEOUT,
        slowest_rollout_s=max(r.timing["rollout_s"] for r in results),
        upstream_calls_left_open=hang.open,
        wall_s=wall,
    )
    assert len(results) == 8
    for r in results:
        assert r.error is not None and r.error.type == "upstream_timeout" and r.reward is None
        assert f"within {UPSTREAM_TIMEOUT:g} s" in r.error.message
        assert UPSTREAM_TIMEOUT - 0.5 <= r.timing["rollout_s"] <= UPSTREAM_TIMEOUT + SLACK_S
    assert wall <= UPSTREAM_TIMEOUT + 2 * SLACK_S
    assert harness.proxy.open_routes == 0


async def test_hanging_upstream_hits_the_per_rollout_timeout_and_late_calls_go_nowhere(
    harness: NeMoGymHarness, tmp_path: Path
) -> None:
    tasks, expected = _tasks(tmp_path, 8)
    hang = HangPolicy()
    rollout_timeout = 2.0
    async with PolicyServer(hang) as server, PolicyServer(counter_policy) as good:
        hung = Endpoint(base_url=server.base_url, model="m", name="hangs")
        fine = Endpoint(base_url=good.base_url, model="m", name="good")
        started = time.monotonic()
        results = [
            r
            async for r in harness.run(
                tasks, lambda t: hung if t.task_index < 4 else fine, concurrency=8, timeout=rollout_timeout
            )
        ]
        wall = time.monotonic() - started
        await until(lambda: hang.open == 0, 5, "the proxy cancelling the timed-out rollouts' calls")
        received = hang.received

    by_index = {r.task_index: r for r in results}
    record_figures(
        "upstream hangs: per-rollout timeout",
        faults_injected=received,
        rollouts_lost=8 - len(by_index),
        typed_timeouts=sum(by_index[i].error is not None and by_index[i].error.type == "timeout" for i in range(4)),
        rollout_timeout_s=rollout_timeout,
        slowest_timed_out_rollout_s=max(by_index[i].timing["rollout_s"] for i in range(4)),
        upstream_calls_left_open=hang.open,
        wall_s=wall,
    )
    for index in range(4):
        r = by_index[index]
        assert r.error is not None and r.error.type == "timeout" and r.reward is None
        assert rollout_timeout <= r.timing["rollout_s"] <= rollout_timeout + 1.0
    for index in range(4, 8):
        assert by_index[index].error is None and by_index[index].reward == expected[index]
    assert wall <= rollout_timeout + SLACK_S
    assert received == 4  # one call per hung rollout: nothing retried it into another route
    assert harness.proxy.open_routes == 0


BROKEN_REPLIES = {
    # name: (scripted reply, the failure kind the trace records, attempts)
    "reset mid-body": (FakeReply.reset(times=10_000), "connection", MAX_RETRIES + 1),
    "invalid JSON": (FakeReply.garbage(times=10_000), "protocol", 1),
    "output not a list": (FakeReply.json({"id": "r", "output": "oops"}, times=10_000), "protocol", 1),
    "output item Gym rejects": (
        FakeReply.json(
            {"id": "r", "output": [{"type": "web_search_call", "id": "ws", "status": "done"}]}, times=10_000
        ),
        "protocol",
        1,
    ),
    "model not served (404)": (FakeReply.error(404, "The model `m` does not exist", times=10_000), "http", 1),
}


async def test_resets_garbage_and_schema_invalid_replies_are_typed_upstream_errors(
    harness: NeMoGymHarness, tmp_path: Path
) -> None:
    names = list(BROKEN_REPLIES)
    tasks, expected = _tasks(tmp_path, 2 * len(names) + 4)
    fakes = {name: FakeUpstream(name) for name in names}
    for fake in fakes.values():
        await fake.start()
    try:
        for name, (reply, _, _) in BROKEN_REPLIES.items():
            fakes[name].script(reply)
        async with PolicyServer(counter_policy) as good:
            endpoints = {name: Endpoint(base_url=f.base_url, model="m", name=name) for name, f in fakes.items()}
            fine = Endpoint(base_url=good.base_url, model="m", name="good")

            def pick(task):  # two rollouts per broken upstream, then four on a good one
                return endpoints[names[task.task_index // 2]] if task.task_index < 2 * len(names) else fine

            started = time.monotonic()
            results = [r async for r in harness.run(tasks, pick, concurrency=len(tasks))]
            wall = time.monotonic() - started
    finally:
        for fake in fakes.values():
            await fake.close()

    by_index = {r.task_index: r for r in results}
    errors = Counter()
    for index in range(2 * len(names)):
        name = names[index // 2]
        r = by_index[index]
        _, kind, attempts = BROKEN_REPLIES[name]
        assert r.error is not None and r.error.type == f"upstream_{kind}" and r.reward is None, (name, r.error)
        (call,) = r.trace
        assert (call.error.kind, call.attempts, call.status) == (kind, attempts, STATUS_UPSTREAM_FAILED), name
        assert r.timing["rollout_s"] <= UPSTREAM_TIMEOUT + SLACK_S, name
        errors[name] += 1
    for index in range(2 * len(names), len(tasks)):
        assert by_index[index].error is None and by_index[index].reward == expected[index]
    record_figures(
        "upstream resets / garbage / schema-invalid / model not served",
        faults_injected=sum(len(f.requests) for f in fakes.values()),
        typed_upstream_errors=dict(errors),
        rollouts_lost=len(tasks) - len(by_index),
        wall_s=wall,
    )
    assert len(results) == len(tasks)
