"""Gym stacks on Ray: a two-node ``ray.cluster_utils.Cluster`` in this process, Ray actors each owning a
real Gym stack (real ng_run, resources server, Gym agent), replay and a slow local policy on 127.0.0.1.
(The CLI's ``--ray ADDRESS`` on two nodes of their own, one of them dying mid-run: tests/e2e/test_multi_node.py.)"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.e2e.policies import PolicyServer, message
from tests.faults.helpers import pids_with_env
from tests.unit.fake_upstream import Frozen
from verifiers_nemo import Endpoint, NeMoGymPool, Replicas, load_environment

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

pytestmark = pytest.mark.e2e

ENVS = ("example_multi_step", "example_single_tool_call")
MARKER = f"VNR_RAY_TEST_{uuid.uuid4().hex}"


def session_pids(sid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_bytes()
            except OSError:
                continue
            fields = stat[stat.rfind(b")") + 2 :].split()
            if int(fields[3]) == sid and fields[0] != b"Z":
                pids.append(int(entry))
    return pids


async def until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout}s")
        await asyncio.sleep(0.2)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """Two Ray nodes of 2 CPUs each on this machine; the driver (this process) connected."""
    cluster = Cluster(initialize_head=True, connect=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def recorded(env: str) -> list[Any]:
    return list(load_environment(env, recorded=True).taskset)


@pytest.fixture(scope="module")
def replays() -> dict[str, list[Any]]:
    """Each environment's recorded tasks, task indexes made unique across the two (env i: i*100 + row)."""
    return {
        env: [dataclasses.replace(task, task_index=i * 100 + task.task_index) for task in recorded(env)]
        for i, env in enumerate(ENVS)
    }


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pool(cluster: Cluster, replays: dict[str, list[Any]]) -> AsyncIterator[NeMoGymPool]:
    """Both environments on the two nodes: two actors of the first (one can be killed), one of the second."""
    pool = NeMoGymPool(
        ENVS,
        ray=True,
        workers={ENVS[0]: 2, ENVS[1]: 1},
        actor_options={"runtime_env": {"env_vars": {MARKER: "1"}}},
        start_timeout=240,
    )
    pool.use_replay([t for tasks in replays.values() for t in tasks])
    await pool.astart()
    try:
        yield pool
    finally:
        await pool.aclose()


@pytest.mark.asyncio(loop_scope="module")
async def test_a_mixed_replay_over_actors_on_both_nodes_gives_each_environment_its_recorded_rewards(
    pool: NeMoGymPool, replays: dict[str, list[Any]], cluster: Cluster
) -> None:
    nodes = {node["NodeID"] for node in ray.nodes() if node["Alive"]}
    assert len(nodes) == 2
    assert {w["node_id"] for w in pool.workers if w["env"] == ENVS[0]} == nodes  # one actor on each node
    assert {w["node_id"] for w in pool.workers} == nodes

    mixed = sorted((t for tasks in replays.values() for t in tasks), key=lambda t: t.task_index % 100)  # interleaved
    results = [r async for r in pool.run(mixed, None, concurrency=8)]

    assert sorted(r.task_index for r in results) == sorted(t.task_index for t in mixed)
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    for env in ENVS:
        got = {r.task_index: r.reward for r in results if r.env == env}
        assert got == {t.task_index: float(t.recorded_reward) for t in replays[env]}, env
    assert sum(w["done"] for w in pool.workers) == len(mixed)
    assert {r.worker.split(":")[1] for r in results} == {n[:8] for n in nodes}  # type: ignore[union-attr]


@pytest.mark.asyncio(loop_scope="module")
async def test_killing_an_actor_mid_run_loses_no_rollout_and_leaves_none_of_its_gym_processes(
    pool: NeMoGymPool, replays: dict[str, list[Any]]
) -> None:
    async def slow(body: dict[str, Any], request: Any) -> list[dict[str, Any]]:
        await asyncio.sleep(2.0)
        return [message("done")]

    env = ENVS[0]
    tasks = [dataclasses.replace(replays[env][i % 5], rollout_index=i // 5) for i in range(8)]
    victim = next(h for h in pool.handles if h.env == env)
    sessions = await victim.gym_sessions()  # type: ignore[attr-defined]
    assert sessions and all(session_pids(s) for s in sessions)
    async with PolicyServer(slow) as policy:

        async def kill_soon() -> None:
            await until(lambda: policy.calls >= 8, 60, "8 rollouts in flight")
            ray.kill(victim.actor, no_restart=True)  # type: ignore[attr-defined]

        killing = asyncio.ensure_future(kill_soon())
        results = [r async for r in pool.run(tasks, Endpoint(base_url=policy.base_url, model="slow"), concurrency=8)]
        await killing

    assert sorted((r.task_index, r.rollout_index) for r in results) == sorted(
        (t.task_index, t.rollout_index) for t in tasks
    )  # each exactly once
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]  # retried on the other actor
    assert [w["alive"] for w in pool.workers if w["env"] == env].count(False) == 1
    await until(lambda: not any(session_pids(s) for s in sessions), 60, "the killed actor's Gym processes gone")


@pytest.mark.asyncio(loop_scope="module")
async def test_calls_an_actor_cannot_place_on_a_dead_replica_move_to_a_live_one_and_the_driver_leaves_it_too(
    pool: NeMoGymPool, replays: dict[str, list[Any]]
) -> None:
    async def answer(body: dict[str, Any], request: Any) -> list[dict[str, Any]]:
        return [message("done")]

    env = ENVS[1]
    tasks = [dataclasses.replace(replays[env][i % 5], rollout_index=10 + i // 5) for i in range(6)]
    with socket.socket() as s:  # a replica whose process is gone: nobody listens on its port
        s.bind(("127.0.0.1", 0))
        dead_url = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    async with PolicyServer(answer) as policy:
        dead, live = Endpoint(dead_url, "m", name="dead"), Endpoint(policy.base_url, "m", name="live")
        with Replicas([dead, live], probe=lambda e: False) as replicas:  # the dead one never answers its probe
            results = [r async for r in pool.run(tasks, replicas, concurrency=1)]

    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    assert results[0].failed_over == ["dead"] and results[0].endpoint == "live"  # the first went to dead, then moved
    assert all(not r.failed_over and r.endpoint == "live" for r in results[1:])  # the driver placed none there again
    assert [name for name, _ in replicas.down()] == ["dead"]
    assert policy.calls >= len(tasks)


@pytest.mark.asyncio(loop_scope="module")
async def test_calls_an_actor_placed_on_a_hung_replica_move_to_a_live_one_while_it_hangs(
    pool: NeMoGymPool, replays: dict[str, list[Any]]
) -> None:
    """A replica that accepts connections and never answers (a frozen engine), beside a live one: the actor's hang
    watch takes it out while it hangs (no answer to GET /models either) and the call waiting there moves to the live
    one, long before a call's budget (600 s); every rollout scores, and the driver leaves the hung replica too."""

    async def answer(body: dict[str, Any], request: Any) -> list[dict[str, Any]]:
        return [message("done")]

    env = ENVS[1]
    tasks = [dataclasses.replace(replays[env][i % 5], rollout_index=20 + i // 5) for i in range(6)]
    async with Frozen() as frozen, PolicyServer(answer) as policy:
        hung, live = Endpoint(frozen.base_url, "m", name="hung"), Endpoint(policy.base_url, "m", name="live")
        with Replicas([hung, live]) as replicas:
            started = time.monotonic()
            results = [r async for r in pool.run(tasks, replicas, concurrency=1)]
            took = time.monotonic() - started
            down = [name for name, _ in replicas.down()]

    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    assert results[0].failed_over == ["hung"] and results[0].endpoint == "live"  # the first waited there, then moved
    assert all(not r.failed_over and r.endpoint == "live" for r in results[1:])  # the driver placed none there again
    assert down == ["hung"] and frozen.accepted >= 1
    assert took < 300, f"moved only after {took:.0f}s: at a call's budget, not while it hung"


@pytest.mark.asyncio(loop_scope="module")
async def test_closing_the_pool_leaves_the_cluster_as_it_found_it(pool: NeMoGymPool, cluster: Cluster) -> None:
    sessions = [s for h in pool.handles if h.env == ENVS[1] for s in await h.gym_sessions()]  # type: ignore[attr-defined]
    assert pids_with_env(MARKER)

    await pool.aclose()

    assert ray.is_initialized()  # the driver's connection is the caller's
    await until(lambda: ray.available_resources().get("CPU") == 4.0, 60, "every CPU of the cluster free again")
    await until(lambda: not any(session_pids(s) for s in sessions), 60, "no Gym process of any actor")
    await until(lambda: not pids_with_env(MARKER), 60, "no process of the actors left")
