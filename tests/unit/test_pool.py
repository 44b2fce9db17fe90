"""Scaling out: the work queue, least-loaded endpoints and workers, retry of a lost worker's rollouts, and
the CLI's Ray flags (fake workers only; real Gym stacks on a real Ray cluster are tests/e2e/test_ray.py)."""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import Sequence
from typing import Any

import pytest

from verifiers_nemo import (
    ConfigurationError,
    Endpoint,
    GymServerDown,
    NeMoGymPool,
    Replicas,
    RolloutResult,
    Task,
    WorkerLost,
)
from verifiers_nemo._cli.parser import build_parser
from verifiers_nemo._cli.settings import new_settings
from verifiers_nemo._dispatch import EndpointPicker, stream_rollouts
from verifiers_nemo._eval import format_summary, run_metadata
from verifiers_nemo._eval.settings import MIX_STRIDE
from verifiers_nemo._scale.worker import RolloutCall


def task(index: int, env: str | None = "a", rollout: int = 0) -> Task:
    return Task(
        task_index=index,
        rollout_index=rollout,
        row={"responses_create_params": {"input": f"q{index}"}},
        agent_name=None,
        env=env,
        example_id=str(index),
        source=f"x.jsonl:{index + 1}",
    )


def endpoint(name: str) -> Endpoint:
    return Endpoint(base_url=f"http://127.0.0.1:9/{name}/v1", model="m", name=name)


# -- endpoints: least loaded first -------------------------------------------------------------------


def test_an_idle_list_of_endpoints_is_used_round_robin() -> None:
    pool = Replicas([endpoint("a"), endpoint("b"), endpoint("c")])
    picks = []
    for _ in range(6):
        lease = pool.acquire()
        picks.append(lease.endpoint.name)
        lease.release()
    assert picks == ["a", "b", "c", "a", "b", "c"]


def test_a_busy_endpoint_gets_no_new_rollout_until_the_others_are_as_busy() -> None:
    pool = Replicas([endpoint("a"), endpoint("b")])
    first = pool.acquire()  # a: 1 in flight, for a long time
    picks = [pool.acquire().endpoint.name for _ in range(3)]
    assert first.endpoint.name == "a"
    assert picks == ["b", "a", "b"]  # b catches up with a, then they alternate
    assert pool.in_flight() == [2, 2]


def test_an_empty_endpoint_list_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="empty list"):
        EndpointPicker([])


# -- the work queue ----------------------------------------------------------------------------------


async def test_the_stream_keeps_at_most_concurrency_in_flight_and_a_slow_rollout_holds_back_no_other() -> None:
    in_flight = 0
    peak = 0
    order: list[int] = []

    async def run_one(t: Task) -> RolloutResult:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.5 if t.task_index == 0 else 0.01)
        in_flight -= 1
        order.append(t.task_index)
        return RolloutResult(task_index=t.task_index, rollout_index=0)

    results = [r async for r in stream_rollouts([task(i) for i in range(20)], run_one, concurrency=3)]

    assert peak == 3
    assert sorted(r.task_index for r in results) == list(range(20))
    assert order[-1] == 0  # the other 19 went through the two free slots meanwhile


# -- the pool, over fake workers ---------------------------------------------------------------------


class FakeWorker:
    """A worker that answers after ``delay`` seconds, or dies (raises WorkerLost) on its ``die_at``-th call."""

    def __init__(self, env: str, name: str, *, delay: float = 0.02, die_at: int | None = None) -> None:
        self.env = env
        self.label = name
        self.delay = delay
        self.die_at = die_at
        self.calls: list[int] = []
        self.in_flight = 0
        self.peak = 0
        self.stopped = False
        self.started_with: tuple[Sequence[str], Any] | None = None

    async def start(self, secrets: Sequence[str], replay_tasks: Any) -> dict[str, Any]:
        self.started_with = (list(secrets), replay_tasks)
        return {"env": self.env, "judges": {"judge_model": "a judge"}}

    async def rollout(self, call: RolloutCall) -> RolloutResult:
        t, ep = call.task, call.endpoint
        self.calls.append(t.task_index)
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            await asyncio.sleep(self.delay)
            if self.die_at is not None and len(self.calls) >= self.die_at:
                raise WorkerLost(f"{self.label} died")
            result = RolloutResult(task_index=t.task_index, rollout_index=t.rollout_index, env=self.env)
            result.endpoint = ep.label if ep is not None else None
            result.reward = 1.0
            result.metrics = {"worker": float(self.label[-1])}
            return result
        finally:
            self.in_flight -= 1

    async def judge_calls(self) -> dict[str, list[Any]]:
        return {"judge_model": [self.label]}

    async def stop(self) -> None:
        self.stopped = True


class FakePool(NeMoGymPool):
    def __init__(self, workers: list[FakeWorker], envs: Sequence[str], **kwargs: Any) -> None:
        super().__init__(list(envs), **kwargs)
        self.fakes = workers

    async def _make_handles(self) -> list[Any]:
        return list(self.fakes)


async def test_each_task_runs_on_a_worker_of_its_own_environment() -> None:
    a, b = FakeWorker("a", "w1"), FakeWorker("b", "w2")
    async with FakePool([a, b], ["a", "b"]) as pool:
        tasks = [task(i, env="a" if i % 3 else "b") for i in range(12)]
        results = [r async for r in pool.run(tasks, endpoint("e"), concurrency=4)]

    assert sorted(a.calls) == [i for i in range(12) if i % 3]
    assert sorted(b.calls) == [i for i in range(12) if i % 3 == 0]
    assert {r.task_index: r.env for r in results} == {i: "a" if i % 3 else "b" for i in range(12)}
    assert a.stopped and b.stopped


async def test_a_task_of_an_environment_the_pool_does_not_run_is_refused() -> None:
    async with FakePool([FakeWorker("a", "w1")], ["a"]) as pool:
        with pytest.raises(ConfigurationError, match="'zzz', which this pool does not run"):
            await pool.rollout(task(0, env="zzz"), endpoint("e"))


async def test_rollouts_go_to_the_least_loaded_worker() -> None:
    fast, slow = FakeWorker("a", "w1", delay=0.01), FakeWorker("a", "w2", delay=0.3)
    async with FakePool([fast, slow], ["a"]) as pool:
        results = [r async for r in pool.run([task(i) for i in range(40)], endpoint("e"), concurrency=4)]
        done = [w["done"] for w in pool.workers]

    assert len(results) == 40
    assert slow.peak <= 2 and fast.peak <= 4
    assert len(fast.calls) > 3 * len(slow.calls)  # a work queue, not round-robin
    assert done == [len(fast.calls), len(slow.calls)]


async def test_the_rollouts_of_a_worker_that_dies_are_retried_once_on_another_and_none_is_lost_or_doubled() -> None:
    dying, healthy = FakeWorker("a", "w1", die_at=3, delay=0.05), FakeWorker("a", "w2", delay=0.05)
    async with FakePool([dying, healthy], ["a"]) as pool:
        results = [r async for r in pool.run([task(i) for i in range(20)], endpoint("e"), concurrency=6)]
        seats = pool.workers

    assert sorted(r.task_index for r in results) == list(range(20))  # each exactly once
    assert all(r.ok and r.reward == 1.0 for r in results)
    assert all(r.metrics["worker"] == 2.0 for r in results)  # every result came from the healthy worker
    assert len(dying.calls) >= 3
    assert not seats[0]["alive"] and seats[1]["alive"]


async def test_with_no_other_worker_left_a_lost_rollout_is_a_typed_worker_lost_row() -> None:
    dying = FakeWorker("a", "w1", die_at=1, delay=0.01)
    async with FakePool([dying], ["a"]) as pool:
        results = [r async for r in pool.run([task(i) for i in range(5)], endpoint("e"), concurrency=2)]

    assert sorted(r.task_index for r in results) == list(range(5))
    assert all(r.reward is None and isinstance(r.error, WorkerLost) for r in results)
    assert {r.error.type for r in results} == {"worker_lost"}  # type: ignore[union-attr]
    assert len(dying.calls) <= 2  # once dead it is sent nothing more


async def test_several_policy_endpoints_are_spread_least_loaded_first() -> None:
    workers = [FakeWorker("a", "w1", delay=0.05), FakeWorker("a", "w2", delay=0.05)]
    async with FakePool(workers, ["a"]) as pool:
        replicas = [endpoint("r1"), endpoint("r2"), endpoint("r3")]
        results = [r async for r in pool.run([task(i) for i in range(30)], replicas, concurrency=6)]

    counts = {name: sum(r.endpoint == name for r in results) for name in ("r1", "r2", "r3")}
    assert counts == {"r1": 10, "r2": 10, "r3": 10}


async def test_workers_get_the_secrets_and_their_own_environment_s_replay_tasks_and_judge_calls_are_gathered() -> None:
    a, b = FakeWorker("a", "w1"), FakeWorker("b", "w2")
    pool = FakePool([a, b], ["a", "b"], secrets=("sk-1",))
    pool.use_replay([task(0, env="a"), task(1, env="b"), task(2, env="a")])
    async with pool:
        results = [r async for r in pool.run([task(0, env="a"), task(1, env="b")], None, concurrency=2)]
        judge_calls = pool.judge_calls()

    assert a.started_with == (["sk-1"], [task(0, env="a"), task(2, env="a")])
    assert b.started_with == (["sk-1"], [task(1, env="b")])
    assert all(r.ok for r in results)
    assert sorted(judge_calls["judge_model"]) == ["w1", "w2"]


async def test_replay_without_use_replay_and_workers_without_ray_are_refused() -> None:
    async with FakePool([FakeWorker("a", "w1")], ["a"]) as pool:
        with pytest.raises(ConfigurationError, match="use_replay"):
            [r async for r in pool.run([task(0)], None)]
    with pytest.raises(ConfigurationError, match="needs Ray"):
        NeMoGymPool("a", workers=2)


def test_results_and_their_typed_errors_cross_process_boundaries() -> None:
    """What an actor sends back is pickled: a result keeps its error's type and message."""
    result = RolloutResult(task_index=3, rollout_index=1, env="a")
    result.error = GymServerDown("the agent died")
    back = pickle.loads(pickle.dumps(result))
    assert isinstance(back.error, GymServerDown) and back.error.to_dict() == result.error.to_dict()
    assert pickle.loads(pickle.dumps(endpoint("x"))) == endpoint("x")
    call = RolloutCall(task(0), endpoint("x"), {"temperature": 0.5}, 30.0, (endpoint("x"), endpoint("y")))
    assert pickle.loads(pickle.dumps(call)) == call  # what the pool sends an actor


# -- the CLI -----------------------------------------------------------------------------------------


def parse(*argv: str) -> Any:
    return build_parser().parse_args(["eval", *argv])


def test_ray_flags_become_settings_and_workers_without_ray_are_refused() -> None:
    settings = new_settings(parse("example_multi_step", "--ray", "--workers", "4", "--cpus-per-stack", "2"))
    assert (settings.ray, settings.workers, settings.cpus_per_stack) == ("local", 4, 2.0)
    assert new_settings(parse("example_multi_step", "--ray")).cpus_per_stack is None
    joined = new_settings(parse("example_multi_step", "--ray", "10.0.0.5:6379"))
    assert (joined.ray, joined.workers) == ("10.0.0.5:6379", None)
    assert new_settings(parse("example_multi_step")).ray is None
    with pytest.raises(ConfigurationError, match="add --ray"):
        new_settings(parse("example_multi_step", "--workers", "2"))


# -- a mix of environments in one eval ---------------------------------------------------------------


def test_an_env_list_is_a_mix_whose_task_indexes_say_which_environment_and_row() -> None:
    settings = new_settings(parse("example_multi_step, example_single_tool_call"))
    assert settings.env_names == ["example_multi_step", "example_single_tool_call"]
    assert settings.origin(3) == ("example_multi_step", 3)
    assert settings.origin(MIX_STRIDE + 4) == ("example_single_tool_call", 4)
    assert new_settings(parse("example_multi_step")).origin(MIX_STRIDE + 4) == ("example_multi_step", MIX_STRIDE + 4)
    with pytest.raises(ConfigurationError, match="name each environment once"):
        new_settings(parse("example_multi_step,example_multi_step"))
    with pytest.raises(ConfigurationError, match="name each environment once"):
        new_settings(parse("example_multi_step,"))


def test_the_summary_of_a_mix_is_per_environment_and_overall() -> None:
    settings = new_settings(parse("a_env,b_env"))
    records = [
        {"task_index": i, "rollout_index": 0, "env": "a_env", "reward": 1.0, "metrics": {}, "error": None}
        for i in range(3)
    ] + [
        {"task_index": MIX_STRIDE + i, "rollout_index": 0, "env": "b_env", "reward": 0.0, "metrics": {}, "error": None}
        for i in range(2)
    ]
    records.append(
        {
            "task_index": MIX_STRIDE + 2,
            "rollout_index": 0,
            "env": "b_env",
            "reward": None,
            "metrics": {},
            "error": {"type": "worker_lost", "message": "the actor died"},
        }
    )
    metadata = run_metadata({"status": "finished"}, settings, None, 6, records, [])

    by_env = metadata["summary"]["by_env"]
    assert {name: s["rollouts"]["total"] for name, s in by_env.items()} == {"a_env": 3, "b_env": 3}
    assert by_env["a_env"]["reward"]["avg"] == 1.0 and by_env["b_env"]["reward"]["avg"] == 0.0
    assert by_env["b_env"]["errors_by_type"] == {"worker_lost": 1}
    assert metadata["summary"]["reward"]["avg"] == pytest.approx(3 / 5)
    text = format_summary(metadata)
    assert "a_env: 3 rollouts · reward avg 1.000 · pass@1 1.000 · 0 errored" in text
    assert "b_env: 3 rollouts · reward avg 0.000 · pass@1 0.000 · 1 errored" in text


def test_b_takes_several_replicas_each_checked() -> None:
    from verifiers_nemo._eval import PreflightError, base_urls

    assert base_urls("http://127.0.0.1:8000/v1/, http://127.0.0.1:8001/v1") == [
        "http://127.0.0.1:8000/v1",
        "http://127.0.0.1:8001/v1",
    ]
    with pytest.raises(PreflightError, match="no http:// or https:// scheme"):
        base_urls("http://127.0.0.1:8000/v1,127.0.0.1:8001/v1")
    with pytest.raises(PreflightError, match="-b is empty"):
        base_urls(" , ")


def test_actors_per_environment_come_from_workers_the_cpu_budget_or_the_nodes() -> None:
    from verifiers_nemo._scale import RayPlacement

    nodes = [{"Resources": {"CPU": 8.0}}, {"Resources": {"CPU": 4.0}}]
    assert RayPlacement().count("a", nodes) == 2  # one per live node
    assert RayPlacement(workers=5).count("a", nodes) == 5
    assert RayPlacement(workers={"a": 3, "b": 1}).count("b", nodes) == 1
    assert RayPlacement(cpus_per_stack=2).count("a", nodes) == 6  # 12 CPUs / 2
    assert RayPlacement(cpus_per_stack=2).count("a", nodes, envs=2) == 3  # shared by two environments
    assert RayPlacement(cpus_per_stack=64).count("a", nodes) == 1
    with pytest.raises(ConfigurationError, match="positive integer"):
        RayPlacement(workers={"a": 0}).count("a", nodes)


# -- replicas of the policy across workers ---------------------------------------------------------------------------


class MovingWorker(FakeWorker):
    """A worker whose calls on replica ``a`` do not connect: each such rollout moves to ``b`` (as a worker's harness
    does) and says so in ``failed_over``; it records the replicas it was given."""

    def __init__(self, env: str, name: str) -> None:
        super().__init__(env, name, delay=0.0)
        self.given: list[tuple[str | None, Any]] = []

    async def rollout(self, call: RolloutCall) -> RolloutResult:
        ep = call.endpoint
        self.given.append((ep.name if ep is not None else None, call.replicas))
        result = await super().rollout(call)
        if ep is not None and ep.name == "a":
            result.failed_over, result.endpoint = [ep.label], "b"
        return result


async def test_workers_get_the_replicas_and_a_replica_a_worker_left_gets_no_more_rollouts() -> None:
    worker = MovingWorker("a", "w1")
    replicas = Replicas([endpoint("a"), endpoint("b")], probe=lambda e: False, probe_first=60)
    async with FakePool([worker], ["a"]) as pool:
        results = [r async for r in pool.run([task(i) for i in range(6)], replicas, concurrency=1)]

    assert all(r.reward == 1.0 for r in results)
    assert worker.given[0] == ("a", (endpoint("a"), endpoint("b")))  # the first went to a, with the whole list
    assert [name for name, _ in worker.given[1:]] == ["b"] * 5  # a left the eval's rotation when the worker left it
    assert [name for name, _ in replicas.down()] == ["a"] and "moved off it" in replicas.outages()[0].reason
    replicas.close()
