"""The judge dies or hangs: an environment of one's own whose ``verify`` asks a judge model server of its config
(``tests/own_envs.write_judged_env``), run through the real stack with a judge that refuses every connection or that
accepts them and never answers. What the product promises: every rollout comes back, each a typed failure with no
reward (never a silent 0), none lost, in bounded time (a judge call's budget); each judge call is recorded as failed
with its cause (what the summary's Judges row counts); the policy's own calls are untouched.

The rollout's own error is what the environment's ``verify`` did with the judge's error reply: this one reads the
reply's ``output`` and raises ``KeyError``, which the row names (with its file and line when the server's log has
the traceback by the time the row is written; nemo-gym 0.7's judge
environments mark such a sample ``judge_failed`` and masked instead)."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.policies import PolicyServer, function_call, message, tool_results, user_text
from tests.own_envs import write_judged_env
from tests.unit.fake_upstream import Frozen
from verifiers_nemo import Endpoint, NeMoGymHarness, NeMoGymTaskset, ProxyConfig

JUDGE_BUDGET_S = 4.0
"""Each judge call's whole budget here (``ProxyConfig(upstream_timeout=)``): what a hung judge costs a rollout."""


def _refusing_url() -> str:
    with socket.socket() as s:  # a port nobody listens on: the judge is down
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/v1"


async def _policy(body: dict[str, Any], request: Any) -> list[dict[str, Any]]:
    city = user_text(body).removeprefix("What is the weather in ").rstrip("?")
    if tool_results(body):
        return [message(f"It is sunny in {city}.")]
    return [function_call("get_weather", {"city": city})]


async def _run_with_judge(folder: Path, judge_url: str) -> tuple[list[Any], int, list[Any]]:
    tasks = NeMoGymTaskset(str(folder))
    proxy = ProxyConfig(upstream_timeout=JUDGE_BUDGET_S, max_retries=1, backoff=0.05, backoff_max=0.1)
    async with PolicyServer(_policy) as policy_server:
        policy = Endpoint(base_url=policy_server.base_url, model="pol")
        judge = Endpoint(base_url=judge_url, model="jud")
        async with NeMoGymHarness(str(folder), judge=judge, proxy=proxy, timeout=120) as harness:
            results = [r async for r in harness.run(tasks, policy, concurrency=5)]
            judge_calls = harness.judge_calls()["judge_model"]
        return results, policy_server.calls, judge_calls


@pytest.mark.parametrize("judge", ["dies", "hangs"])
async def test_a_judge_that_dies_or_hangs_makes_every_rollout_a_typed_failure_and_loses_none(
    tmp_path: Path, judge: str
) -> None:
    folder = write_judged_env(tmp_path)
    if judge == "dies":
        results, policy_calls, judge_calls = await asyncio.wait_for(_run_with_judge(folder, _refusing_url()), 240)
    else:
        async with Frozen() as frozen:
            results, policy_calls, judge_calls = await asyncio.wait_for(_run_with_judge(folder, frozen.base_url), 240)
        assert frozen.accepted >= 1

    assert sorted(r.task_index for r in results) == [0, 1, 2, 3, 4]  # none lost, none twice
    assert policy_calls == 10  # the policy's calls: two a rollout, all answered
    for r in results:
        assert r.reward is None and not r.scored and r.error is not None, (r.task_index, r.reward, r.error)
        assert r.error.type == "gym_agent" and "KeyError" in r.error.message, r.error.message  # verify's own exception
    assert len(judge_calls) == 5 and all(c.error is not None for c in judge_calls)
    kinds = {c.error.kind for c in judge_calls}
    assert kinds == ({"connection"} if judge == "dies" else {"timeout"}), kinds
    if judge == "hangs":  # each bounded by its budget, not by the rollout's 120 s
        assert all(c.latency_s < 3 * JUDGE_BUDGET_S for c in judge_calls), [c.latency_s for c in judge_calls]
