"""A Gym agent process SIGKILLed mid-batch: a /run the dead agent dropped is resubmitted once after the
restart, on a fresh route (one attempt per trace), or fails as gym_server_down; no rollout is lost
or counted twice, the stack restarts and later rollouts succeed. (The resources-server variant is
tests/e2e/test_harness.py::test_a_gym_server_killed_mid_batch_loses_no_rollout_and_the_stack_restarts.)"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web

from tests.e2e.policies import PolicyServer, counter_policy
from tests.e2e.test_stack import _listening_pid
from tests.faults.helpers import COUNTER_ENV, record_figures, tagged_counter_rows, until
from verifiers_nemo import Endpoint, NeMoGymHarness, NeMoGymTaskset, RolloutResult, get_environment

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="package")]

BATCH, CONCURRENCY, KILL_AFTER = 24, 8, 4


@dataclass
class AgentKill:
    expected: list[float]
    generation: int
    results: list[RolloutResult] = field(default_factory=list)
    submitted_at: dict[int, float] = field(default_factory=dict)
    killed_at: float = 0.0
    detected_s: float = 0.0
    later: list[RolloutResult] = field(default_factory=list)
    later_expected: list[float] = field(default_factory=list)
    generation_after: int = 0

    @property
    def started_after_kill(self) -> list[RolloutResult]:
        return [r for r in self.results if self.submitted_at[r.task_index] > self.killed_at]


@pytest_asyncio.fixture(scope="module", loop_scope="package")
async def agent_kill(harness: NeMoGymHarness, tmp_path_factory: pytest.TempPathFactory) -> AgentKill:
    """Kill the agent once 4 of 24 rollouts are done; then, once the stack has noticed, run 8 more."""
    tmp = tmp_path_factory.mktemp("agent-kill")
    run = AgentKill(tagged_counter_rows(tmp / "tasks.jsonl", BATCH), harness.stack.generation)
    tasks = NeMoGymTaskset(COUNTER_ENV, jsonl_path=tmp / "tasks.jsonl")
    run.later_expected = tagged_counter_rows(tmp / "later.jsonl", CONCURRENCY, seed=11)
    later_tasks = NeMoGymTaskset(COUNTER_ENV, jsonl_path=tmp / "later.jsonl")

    async def slow_counter(body: dict[str, Any], request: web.Request) -> Any:
        await asyncio.sleep(0.3)
        return await counter_policy(body, request)

    agent_port = int(harness.stack.agent_url().rsplit(":", 1)[1])
    dead_run_dir = harness.stack.launch.run_dir  # a dead stack's folder (its logs) is kept; tidied below
    async with PolicyServer(slow_counter) as server:
        endpoint = Endpoint(base_url=server.base_url, model="m")

        def pick(task: Any) -> Endpoint:
            run.submitted_at[task.task_index] = time.monotonic()
            return endpoint

        async for result in harness.run(tasks, pick, concurrency=CONCURRENCY):
            run.results.append(result)
            if len(run.results) == KILL_AFTER:
                os.kill(_listening_pid(agent_port), signal.SIGKILL)
                run.killed_at = time.monotonic()
        await until(lambda: harness.stack.is_dead(run.generation), 15, "the stack noticing the dead agent")
        run.detected_s = time.monotonic() - run.killed_at
        run.later = [r async for r in harness.run(later_tasks, endpoint, concurrency=CONCURRENCY)]
    run.generation_after = harness.stack.generation
    if run.generation_after != run.generation:
        shutil.rmtree(dead_run_dir, ignore_errors=True)
    down_after_kill = [r for r in run.started_after_kill if r.error is not None]
    record_figures(
        "Gym agent SIGKILLed mid-batch",
        faults_injected=1,
        rollouts=len(run.results),
        failed_gym_server_down=sum(r.error is not None for r in run.results),
        started_after_kill_and_failed=len(down_after_kill),
        death_detected_after_s=run.detected_s,
        later_rollouts_ok=sum(r.error is None for r in run.later),
        generation=f"{run.generation}->{run.generation_after}",
    )
    return run


async def test_killed_gym_agent_loses_nothing_and_the_stack_restarts(agent_kill: AgentKill) -> None:
    counts = Counter(r.task_index for r in agent_kill.results)
    down = [r for r in agent_kill.results if r.error is not None]
    assert sorted(counts) == list(range(BATCH)) and set(counts.values()) == {1}  # none lost, none twice
    # A /run the dead agent dropped is resubmitted once after the restart on a fresh route; a failure is typed.
    assert all(r.error.type == "gym_server_down" and r.reward is None for r in down), [
        (r.task_index, r.error, len(r.trace)) for r in down
    ]
    traces = [(r.task_index, len(r.trace)) for r in agent_kill.results if r.error is None]
    assert all(n == 4 for _, n in traces), traces  # one attempt per trace
    assert all(r.reward == agent_kill.expected[r.task_index] for r in agent_kill.results if r.error is None)
    assert agent_kill.generation_after == agent_kill.generation + 1
    assert [r.error for r in agent_kill.later] == [None] * CONCURRENCY
    assert sorted((r.task_index, r.reward) for r in agent_kill.later) == list(enumerate(agent_kill.later_expected))


async def test_rollouts_started_after_the_agent_died_wait_for_the_restart(agent_kill: AgentKill) -> None:
    # Before the probe-and-resubmit fix, 13 of 24 failed here. A rollout whose request races the death
    # itself (sent on a pooled connection as the agent dies, then seen dead by the monitor) can still fail,
    # typed; at most that handful, never the batch.
    failed_after = [r for r in agent_kill.started_after_kill if r.error is not None]
    assert all(r.error.type == "gym_server_down" for r in failed_after)
    assert len(failed_after) <= 2, [(r.task_index, r.error) for r in failed_after]
    assert sum(r.error is not None for r in agent_kill.results) <= CONCURRENCY


async def test_a_restart_that_fails_is_each_waiting_rollouts_typed_error_and_a_later_rollout_retries(
    tmp_path: Path,
) -> None:
    """The agent dies and its stack cannot come back (its config broke meanwhile, so ng_run refuses it): the
    rollouts waiting for the restart come back typed `gym_server_down`, naming the failed start; none raises,
    and they share one try instead of each starting the stack in turn. Once the config is whole again, the next
    rollout restarts the stack and succeeds."""
    packaged = get_environment(COUNTER_ENV).default_config.path
    config = tmp_path / packaged.name
    shutil.copy(packaged, config)
    expected = tagged_counter_rows(tmp_path / "tasks.jsonl", 6)
    tasks = NeMoGymTaskset(COUNTER_ENV, jsonl_path=tmp_path / "tasks.jsonl")
    harness = NeMoGymHarness(COUNTER_ENV, config_paths=[config], start_timeout=120)
    async with harness, PolicyServer(counter_policy) as server:
        endpoint = Endpoint(base_url=server.base_url, model="m")
        first = [r async for r in harness.run(list(tasks)[:1], endpoint)]
        assert first[0].error is None and first[0].reward == expected[0]
        generation = harness.stack.generation

        config.write_text(packaged.read_text().replace(f"name: {COUNTER_ENV}_resources_server", "name: gone"))
        os.kill(_listening_pid(int(harness.stack.agent_url().rsplit(":", 1)[1])), signal.SIGKILL)
        await until(lambda: harness.stack.is_dead(generation), 15, "the stack noticing the dead agent")
        started = time.monotonic()
        waiting = await asyncio.gather(*(harness.rollout(task, endpoint) for task in list(tasks)[1:5]))
        failed_s = time.monotonic() - started
        assert [r.error.type if r.error else None for r in waiting] == ["gym_server_down"] * 4
        assert all("could not be restarted" in r.error.message and r.reward is None for r in waiting)
        tries = harness.stack.generation - generation
        assert tries == 1, f"{tries} starts for 4 rollouts queued behind one restart"

        config.write_text(packaged.read_text())
        later = await harness.rollout(list(tasks)[5], endpoint)
        assert later.error is None and later.reward == expected[5], later.error
        assert harness.stack.running and harness.stack.generation == generation + 2
    record_figures(
        "Gym stack whose restart fails",
        rollouts_waiting=len(waiting),
        typed_gym_server_down=len(waiting),
        starts_tried=tries,
        failed_after_s=failed_s,
        later_rollout_ok=later.error is None,
    )


async def test_a_gym_server_that_hangs_costs_each_rollout_reaching_it_a_typed_timeout_and_nothing_else(
    tmp_path: Path,
) -> None:
    """SIGSTOP the resources server (alive, not answering): each rollout that reaches it ends as a ``timeout`` row
    at the rollout's own bound (none lost, none with a reward), nothing restarts the stack (its processes are all
    alive), and once the server answers again (SIGCONT) the next rollouts succeed on the same launch."""
    expected = tagged_counter_rows(tmp_path / "tasks.jsonl", 12)
    tasks = NeMoGymTaskset(COUNTER_ENV, jsonl_path=tmp_path / "tasks.jsonl")
    first, hung, after = [tasks[i] for i in range(4)], [tasks[i] for i in range(4, 8)], [tasks[i] for i in range(8, 12)]
    async with NeMoGymHarness(COUNTER_ENV, timeout=8) as harness, PolicyServer(counter_policy) as server:
        endpoint = Endpoint(base_url=server.base_url, model="m")
        await harness.astart()
        generation = harness.stack.generation
        resources = harness.stack.info().server_urls[f"{COUNTER_ENV}_resources_server"]
        pid = _listening_pid(int(resources.rsplit(":", 1)[1]))
        before = [r async for r in harness.run(first, endpoint, concurrency=4)]
        os.kill(pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            during = [r async for r in harness.run(hung, endpoint, concurrency=4)]
            waited = time.monotonic() - started
        finally:
            os.kill(pid, signal.SIGCONT)
        later = [r async for r in harness.run(after, endpoint, concurrency=4)]

        assert [r.reward for r in sorted(before, key=lambda r: r.task_index)] == expected[:4]
        assert sorted(r.task_index for r in during) == [4, 5, 6, 7]
        assert all(r.error is not None and r.error.type == "timeout" and r.reward is None for r in during), [
            (r.task_index, r.error) for r in during
        ]
        assert waited < 8 * 4, waited  # each bounded by its own timeout (they run side by side), not the run's
        assert harness.stack.generation == generation and not harness.stack.is_dead(generation)
        assert [r.reward for r in sorted(later, key=lambda r: r.task_index)] == expected[8:]
    record_figures("Gym resources server SIGSTOPped", rollouts_timed_out=len(during), waited_s=round(waited, 1))
