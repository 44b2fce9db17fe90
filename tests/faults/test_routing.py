"""1,000 concurrent rollouts over 8 distinct endpoints through the real stack: zero calls reach the
wrong endpoint, every reward is the right one, nothing is lost or counted twice."""

from __future__ import annotations

import time
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from tests.e2e.policies import PolicyServer
from tests.faults.helpers import COUNTER_ENV, IdentityPolicy, identity_rows, record_figures
from verifiers_nemo import Endpoint, NeMoGymHarness, NeMoGymTaskset

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="package")]

ROLLOUTS, UPSTREAMS, CONCURRENCY = 1000, 8, 256


async def test_thousand_concurrent_rollouts_over_eight_endpoints_are_never_cross_routed(
    harness: NeMoGymHarness, tmp_path: Path
) -> None:
    expected = identity_rows(tmp_path / "tasks.jsonl", ROLLOUTS, UPSTREAMS)
    tasks = NeMoGymTaskset(COUNTER_ENV, jsonl_path=tmp_path / "tasks.jsonl")
    policies = [IdentityPolicy(k, UPSTREAMS) for k in range(UPSTREAMS)]
    async with AsyncExitStack() as stack:
        servers = [await stack.enter_async_context(PolicyServer(p, name=p.name)) for p in policies]
        endpoints = [
            Endpoint(base_url=s.base_url, model=f"model-{k}", api_key=f"sk-upstream-{k}", name=s.name)
            for k, s in enumerate(servers)
        ]
        started = time.monotonic()
        results = [
            r
            async for r in harness.run(
                tasks, lambda t: endpoints[t.task_index % UPSTREAMS], concurrency=CONCURRENCY, timeout=120
            )
        ]
        wall = time.monotonic() - started

    indices = [r.task_index for r in results]
    lost = ROLLOUTS - len(set(indices))
    duplicated = len(indices) - len(set(indices))
    cross_routed = sum(p.cross_routed for p in policies)
    wrong_reward = [r.task_index for r in results if r.error is None and r.reward != expected[r.task_index]]
    wrong_identity = []
    for r in results:
        k = r.task_index % UPSTREAMS
        final = r.completion[-1]["content"] if r.completion else ""
        if (
            r.endpoint != f"upstream-{k}"
            or f"I am upstream-{k} (model model-{k}), serving task-{r.task_index}." != final
        ):
            wrong_identity.append(r.task_index)
    errors = [r for r in results if r.error is not None]
    record_figures(
        "1,000 concurrent rollouts over 8 endpoints",
        rollouts=len(results),
        concurrency=CONCURRENCY,
        cross_routed=cross_routed,
        wrong_identity=len(wrong_identity),
        wrong_reward=len(wrong_reward),
        rollouts_lost=lost,
        counted_twice=duplicated,
        errors=len(errors),
        wall_s=wall,
        rollouts_per_s=len(results) / wall,
    )
    assert errors == [], errors[0].error
    assert (lost, duplicated, cross_routed) == (0, 0, 0)
    assert wrong_reward == [] and wrong_identity == []
    for k, (policy, server) in enumerate(zip(policies, servers, strict=True)):
        assert server.calls == 2 * ROLLOUTS // UPSTREAMS  # increment, then say who it is
        assert set(policy.tasks) == set(range(k, ROLLOUTS, UPSTREAMS))
        assert server.authorizations == {f"Bearer sk-upstream-{k}"}
    for r in results:
        model = f"model-{r.task_index % UPSTREAMS}"
        assert [c.request["model"] for c in r.trace] == [model, model]
    assert harness.proxy.open_routes == 0
