"""Bad input and bad answers on the running stack: tasks for an agent the stack lacks, and Gym results
whose reward is not a number (or that are not JSON). Each is a typed error on its rollout, never a
reward of 0, and the rest of the batch completes."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web

from tests.e2e.policies import PolicyServer, counter_policy
from tests.faults.helpers import COUNTER_ENV, record_figures, tagged_counter_rows
from verifiers_nemo import Endpoint, NeMoGymHarness, NeMoGymTaskset

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="package")]


async def test_tasks_for_an_agent_the_stack_lacks_are_typed_errors_naming_its_agents(
    harness: NeMoGymHarness, tmp_path: Path
) -> None:
    expected = tagged_counter_rows(tmp_path / "tasks.jsonl", 4)
    own = list(NeMoGymTaskset(COUNTER_ENV, jsonl_path=tmp_path / "tasks.jsonl"))
    foreign = list(NeMoGymTaskset("example_multi_step", limit=2))  # another environment's tasks
    async with PolicyServer(counter_policy) as server:
        endpoint = Endpoint(base_url=server.base_url, model="m")
        results = [r async for r in harness.run([*foreign, *own], endpoint, concurrency=6)]

    wrong = [r for r in results if r.agent == "example_multi_step_simple_agent"]
    right = [r for r in results if r.agent != "example_multi_step_simple_agent"]
    record_figures(
        "tasks for an agent the stack lacks",
        rollouts=len(results),
        typed_errors=sum(r.error is not None and r.error.type == "gym_agent" for r in wrong),
        others_ok=sum(r.error is None for r in right),
    )
    assert len(wrong) == 2 and len(right) == 4
    for r in wrong:
        assert r.error is not None and r.error.type == "gym_agent" and r.reward is None
        assert f"{COUNTER_ENV}_simple_agent" in r.error.message  # names the agents it has
        assert r.trace == []  # no policy call was made for it
    assert sorted((r.task_index, r.reward) for r in right) == list(enumerate(expected))
    assert harness.proxy.open_routes == 0


# What the mangling agent does to the real agent's answer, by task index.
MANGLE: dict[int, Any] = {0: "high", 1: True, 2: None, 3: "0.75", 4: [1.0], 5: math.nan, 6: "not json"}


class ManglingAgent:
    """Stands between the harness and the real Gym agent and spoils the reward of each answer."""

    def __init__(self, agent_url: str) -> None:
        self.agent_url = agent_url
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    async def _run(self, request: web.Request) -> web.Response:
        body = await request.json()
        assert self._session is not None
        async with self._session.post(self.agent_url + "/run", json=body) as reply:
            result = await reply.json()
        index = int(body["id"].rsplit("-", 1)[1])
        mangled = MANGLE[index]
        if mangled == "not json":
            return web.Response(text="<html>502 Bad Gateway</html>", content_type="text/html")
        if mangled is None:
            del result["reward"]
        else:
            result["reward"] = mangled
        return web.Response(text=json.dumps(result, allow_nan=True), content_type="application/json")

    async def __aenter__(self) -> ManglingAgent:
        self._session = aiohttp.ClientSession()
        app = web.Application()
        app.router.add_post("/run", self._run)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None and self._session is not None
        await self._runner.cleanup()
        await self._session.close()


@pytest_asyncio.fixture(loop_scope="package")
async def mangling_agent(harness: NeMoGymHarness) -> AsyncIterator[ManglingAgent]:
    async with ManglingAgent(harness.stack.agent_url()) as agent:
        yield agent


async def test_a_reward_that_is_not_a_number_is_an_invalid_result_never_a_zero(
    harness: NeMoGymHarness, mangling_agent: ManglingAgent, tmp_path: Path
) -> None:
    tagged_counter_rows(tmp_path / "tasks.jsonl", len(MANGLE))
    tasks = NeMoGymTaskset(COUNTER_ENV, jsonl_path=tmp_path / "tasks.jsonl")
    # A second harness on the same (shared) stack, whose agent's /run goes through the mangler.
    mangled = NeMoGymHarness(COUNTER_ENV, proxy=harness.proxy, agent_urls={tasks[0].agent_name: mangling_agent.url})
    async with mangled, PolicyServer(counter_policy) as server:
        results = [r async for r in mangled.run(tasks, Endpoint(base_url=server.base_url, model="m"), concurrency=7)]

    by_index = {r.task_index: r for r in results}
    invalid = [i for i, r in by_index.items() if r.error is not None and r.error.type == "invalid_result"]
    record_figures(
        "rewards that are not numbers",
        faults_injected=len(MANGLE) - 1,
        invalid_result_errors=len(invalid),
        counted_as_zero=sum(r.reward == 0 for r in results),
        rollouts_lost=len(MANGLE) - len(by_index),
    )
    assert sorted(invalid) == [0, 1, 2, 4, 5, 6]
    for index in invalid:
        r = by_index[index]
        assert r.reward is None and len(r.trace) == 4  # the policy calls are kept for inspection
    assert by_index[3].error is None and by_index[3].reward == 0.75  # a numeric string is a number
    assert "string that is not a number" in by_index[0].error.message
    assert "bool" in by_index[1].error.message and "no reward" in by_index[2].error.message
    assert "NaN" in by_index[5].error.message and "invalid JSON" in by_index[6].error.message


class FailingEpisodes:
    """Stands in front of the real Gym agent and answers some runs with nemo-gym 0.7's failure rows (what
    `single_agent_turn_legacy` relays from an environment server's `failure`), by task index and attempt."""

    def __init__(self, agent_url: str) -> None:
        self.agent_url = agent_url
        self.url = ""
        self.attempts: dict[int, list[int]] = {}
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    async def _run(self, request: web.Request) -> web.Response:
        body = await request.json()
        index = int(body["id"].rsplit("-", 1)[1])
        attempt = body.get("_ng_attempt_index", 0)
        self.attempts.setdefault(index, []).append(attempt)
        failure = {"_ng_failure_class": "environment_server_failed", "_ng_failure_stage": "agent_turn"}
        if index == 0 and attempt < 2:  # fails twice, then the episode runs
            return web.json_response({**failure, "_ng_failure_terminal": False, "_ng_failure_message": "flaky"})
        if index == 1:
            return web.json_response({**failure, "_ng_failure_terminal": True, "_ng_failure_message": "bad task"})
        if index == 2:
            return web.json_response({**failure, "_ng_failure_terminal": False, "_ng_failure_message": "down"})
        assert self._session is not None
        async with self._session.post(self.agent_url + "/run", json=body) as reply:
            result = await reply.json()
        if index == 3:  # Gym's judge failsafe: a masked sample that also names its failure class
            result |= {"mask_sample": True, "failure_kind": "judge_failed", "_ng_failure_class": "judge_failed"}
        return web.json_response(result)

    async def __aenter__(self) -> FailingEpisodes:
        self._session = aiohttp.ClientSession()
        app = web.Application()
        app.router.add_post("/run", self._run)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None and self._session is not None
        await self._runner.cleanup()
        await self._session.close()


async def test_an_episode_gym_failed_is_tried_again_unless_terminal_and_ends_typed(
    harness: NeMoGymHarness, tmp_path: Path
) -> None:
    """Gym's failure rows (`_ng_failure_class`): one it did not call terminal is run again, with the next
    `_ng_attempt_index`, up to Gym's 3 tries; a terminal one once. What still fails is a typed gym_episode_failed
    row (no reward, Gym's message and stage); a masked judge failure stays a masked sample."""
    expected = tagged_counter_rows(tmp_path / "tasks.jsonl", 5)
    tasks = NeMoGymTaskset(COUNTER_ENV, jsonl_path=tmp_path / "tasks.jsonl")
    async with FailingEpisodes(harness.stack.agent_url()) as agent:
        failing = NeMoGymHarness(COUNTER_ENV, proxy=harness.proxy, agent_urls={tasks[0].agent_name: agent.url})
        async with failing, PolicyServer(counter_policy) as server:
            endpoint = Endpoint(base_url=server.base_url, model="m")
            results = {r.task_index: r async for r in failing.run(tasks, endpoint, concurrency=5)}

    assert agent.attempts == {0: [0, 1, 2], 1: [0], 2: [0, 1, 2], 3: [0], 4: [0]}
    assert results[0].error is None and results[0].reward == expected[0]  # the third try ran
    for index, words in ((1, "(terminal): bad task"), (2, ": down")):
        error = results[index].error
        assert error is not None and error.type == "gym_episode_failed" and results[index].reward is None
        assert error.message.startswith("environment_server_failed at agent_turn") and words in error.message
        assert results[index].gym_result["_ng_failure_class"] == "environment_server_failed"  # Gym's row kept
    assert results[3].error is None and results[3].masked and results[3].failure_kind == "judge_failed"
    assert results[4].error is None and results[4].reward == expected[4]
    assert harness.proxy.open_routes == 0
