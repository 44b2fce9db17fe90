"""NeMoGymHarness on the real stack (example_session_state_mgmt) with scripted local policies."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from tests.e2e.docs_python import doc_block, run_here
from tests.e2e.policies import PolicyServer, counter_policy, hang_forever, response
from verifiers_nemo import Endpoint, FunctionUpstream, NeMoGymHarness, NeMoGymTaskset

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]
ENV = "example_session_state_mgmt"


def _counter_rows(path: Path, count: int, seed: int = 7) -> list[float]:
    """``count`` counter tasks; every third one expects a wrong count, so its reward must be 0."""
    from verifiers_nemo import get_environment

    example = json.loads(get_environment(ENV).default_dataset.path.read_text().splitlines()[0])
    rng = random.Random(seed)
    expected = []
    with open(path, "w") as f:
        for i in range(count):
            a, b, start = rng.randint(1, 99), rng.randint(1, 99), rng.randint(0, 50)
            right = i % 3 != 0
            row = {
                "responses_create_params": {
                    "input": [{"role": "user", "content": f"add {a} then add {b} then get the count"}],
                    "tools": example["responses_create_params"]["tools"],
                },
                "initial_count": start,
                "expected_count": start + a + b + (0 if right else 1),
                "id": f"counter-{i}",
            }
            f.write(json.dumps(row) + "\n")
            expected.append(1.0 if right else 0.0)
    return expected


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def harness() -> AsyncIterator[NeMoGymHarness]:
    async with NeMoGymHarness(ENV, timeout=60) as h:
        yield h


async def test_hundred_concurrent_rollouts_keep_their_sessions_and_routes(harness, tmp_path: Path) -> None:
    expected = _counter_rows(tmp_path / "tasks.jsonl", 100)
    tasks = NeMoGymTaskset(ENV, jsonl_path=tmp_path / "tasks.jsonl")
    servers = [PolicyServer(counter_policy, name=f"upstream-{i}") for i in range(4)]
    for server in servers:
        await server.__aenter__()
    try:
        endpoints = [
            Endpoint(base_url=s.base_url, model=f"model-{i}", api_key=f"sk-key-{i}", name=s.name)
            for i, s in enumerate(servers)
        ]
        assignment = {}

        def pick(task):
            assignment[task.task_index] = endpoints[task.task_index % 4]
            return assignment[task.task_index]

        results = [r async for r in harness.run(tasks, pick, concurrency=32)]
    finally:
        for server in servers:
            await server.__aexit__(None, None, None)

    assert sorted(r.task_index for r in results) == list(range(100))
    for r in results:
        assert r.error is None, r.error
        assert r.reward == expected[r.task_index], (r.task_index, r.reward)
        endpoint = assignment[r.task_index]
        assert r.endpoint == endpoint.label
        assert len(r.trace) == 4
        assert all(call.request["model"] == endpoint.model for call in r.trace)
        assert r.usage["total_tokens"] == 60
        assert r.completion[-1]["role"] == "assistant" and "The count is" in r.completion[-1]["content"]
        assert [m["role"] for m in r.completion].count("tool") == 3
    for i, server in enumerate(servers):
        assert server.authorizations == {f"Bearer sk-key-{i}"}  # each upstream saw only its own key
        assert server.calls == 25 * 4
    assert harness.proxy.open_routes == 0


async def test_rollout_timeout_is_typed_and_closes_the_route(harness) -> None:
    task = NeMoGymTaskset(ENV)[0]
    started = time.monotonic()
    result = await harness.rollout(
        task,
        Endpoint(base_url="http://127.0.0.1:9/v1", model="m"),
        timeout=2,
        upstream=FunctionUpstream(lambda endpoint, body: hang_forever(body, None)),
    )
    assert result.error is not None and result.error.type == "timeout"
    assert result.reward is None
    assert time.monotonic() - started < 10
    assert harness.proxy.open_routes == 0


async def test_a_plain_function_answers_the_policy_calls_through_the_upstream_seam(harness, tmp_path) -> None:
    expected = _counter_rows(tmp_path / "tasks.jsonl", 6)
    tasks = NeMoGymTaskset(ENV, jsonl_path=tmp_path / "tasks.jsonl")
    calls: list[str] = []

    async def answer(endpoint: Endpoint, body: dict) -> dict:
        calls.append(endpoint.model)
        return response(body, await counter_policy(body, None))

    nowhere = Endpoint(base_url="http://127.0.0.1:9/v1", model="fn")  # never contacted
    results = [r async for r in harness.run(tasks, nowhere, upstream=FunctionUpstream(answer))]
    assert sorted((r.task_index, r.reward) for r in results) == list(enumerate(expected))
    assert len(calls) == 6 * 4 and set(calls) == {"fn"}


async def test_dead_upstream_is_a_typed_error_and_the_batch_completes(harness, tmp_path: Path) -> None:
    expected = _counter_rows(tmp_path / "tasks.jsonl", 8)
    tasks = NeMoGymTaskset(ENV, jsonl_path=tmp_path / "tasks.jsonl")
    dead = Endpoint(base_url="http://127.0.0.1:9/v1", model="m", name="dead")  # nothing listens on 9
    async with PolicyServer(counter_policy) as server:
        good = Endpoint(base_url=server.base_url, model="m", name="good")
        started = time.monotonic()
        results = [r async for r in harness.run(tasks, lambda t: dead if t.task_index < 3 else good, concurrency=8)]
    assert time.monotonic() - started < 60
    by_index = {r.task_index: r for r in results}
    for index in range(3):
        assert by_index[index].error is not None and by_index[index].error.type == "upstream_connection"
        assert by_index[index].reward is None
    for index in range(3, 8):
        assert by_index[index].error is None and by_index[index].reward == expected[index]


async def test_a_gym_server_killed_mid_batch_loses_no_rollout_and_the_stack_restarts(harness, tmp_path) -> None:
    """SIGKILL the resources server after 4 of 24 rollouts. Whether an in-flight rollout fails as
    ``gym_server_down`` or is resubmitted after the restart (and reproduces its reward) depends on how the death, the
    restart and its request race on this machine: either is right. What holds on any machine: every rollout is
    reproduced or a typed failure, none is lost or counted twice, the stack restarts once, and a rollout begun after
    the kill succeeds on the new launch."""
    from tests.e2e.test_stack import _listening_pid

    expected = _counter_rows(tmp_path / "tasks.jsonl", 24)
    tasks = NeMoGymTaskset(ENV, jsonl_path=tmp_path / "tasks.jsonl")

    async def slow_counter(body, request):
        await asyncio.sleep(0.5)  # rollouts of ~2 s: some are in flight at the kill
        return await counter_policy(body, request)

    stack = harness.stack
    generation, launch = stack.generation, stack.launch
    resources = f"{ENV}_resources_server"
    killed_pid = _listening_pid(int(stack.info().server_urls[resources].rsplit(":", 1)[1]))
    died = stack.death_future(generation)
    killed_at = None
    results = []
    started = time.monotonic()
    async with PolicyServer(slow_counter) as server:
        endpoint = Endpoint(base_url=server.base_url, model="m")
        async for result in harness.run(tasks, endpoint, concurrency=8):
            results.append(result)
            if len(results) == 4:
                os.kill(killed_pid, signal.SIGKILL)
                killed_at = time.time()  # the clock of PolicyCall.started_at; no rollout starts before this line
    assert time.monotonic() - started < 300  # bounded: nothing waits forever on the dead launch

    # none lost, none counted twice
    assert sorted((r.task_index, r.rollout_index) for r in results) == [(i, 0) for i in range(24)]
    for r in results:
        if r.error is None:  # reproduced, its trace the last attempt's alone (a retry shares none with a dead try)
            assert r.reward == expected[r.task_index], (r.task_index, r.reward)
            assert len(r.trace) == 4, (r.task_index, len(r.trace))
        else:  # or a typed failure, with no reward
            assert r.error.type == "gym_server_down" and r.reward is None, (r.task_index, r.error)
    assert all(r.error is None for r in results[:4])  # done before the kill

    # the death was seen, and the stack restarted once: a new launch, its resources server another process
    assert died.done()  # its reason names whichever process the monitor saw exit first
    assert stack.generation == generation + 1
    assert stack.launch is not launch and launch.stopped
    assert stack.running
    assert _listening_pid(int(stack.info().server_urls[resources].rsplit(":", 1)[1])) != killed_pid
    # At least 12 rollouts began after the kill (4 done, at most 8 in flight). Each failed (sent to the dead launch
    # before the harness saw the death: in flight there) or succeeded; without a resources server the old launch
    # finishes none, so a success whose calls all came after the kill ran on the new launch.
    after = [r for r in results if r.error is None and r.trace[0].started_at > killed_at]
    assert len(after) >= 12 - sum(r.error is not None for r in results), (
        "rollouts begun after the kill did not succeed on the restarted stack",
        [(r.task_index, r.error) for r in results],
    )
    assert after, "no rollout succeeded after the restart"
    assert harness.proxy.open_routes == 0


async def test_chat_endpoint_token_ids_reach_the_trace_and_are_contiguous(harness) -> None:
    from tests.unit.fake_upstream import FakeReply, FakeUpstream
    from verifiers_nemo import check_contiguity

    task = NeMoGymTaskset(ENV)[0]
    async with FakeUpstream("vllm", token_ids=True) as fake:
        fake.script(
            FakeReply.call_tools(("increment_counter", {"count": 1})),
            FakeReply.call_tools(("get_counter_value", {})),
            FakeReply.say("done", reasoning="counted"),
        )
        endpoint = Endpoint(
            base_url=fake.base_url,
            model="served-model",
            api="chat",
            sampling_args={"logprobs": True, "return_token_ids": True},
        )
        result = await harness.rollout(task, endpoint, sampling_args={"temperature": 0.5, "max_tokens": 64})

    assert result.error is None, result.error
    assert len(result.trace) == 3
    assert all(call.has_tokens and call.completion_logprobs for call in result.trace)
    assert check_contiguity(result.trace), check_contiguity(result.trace).message
    sent = fake.requests[0].body
    assert sent["model"] == "served-model" and sent["temperature"] == 0.5
    assert sent["logprobs"] is True and "verifiers_nemo_route" not in json.dumps(sent)
    assert result.completion[-1]["content"] == "done" and result.completion[-1]["reasoning_content"] == "counted"


async def test_harnesses_of_one_environment_share_the_stack_across_threads_and_loops(harness, tmp_path) -> None:
    expected = _counter_rows(tmp_path / "tasks.jsonl", 6)
    tasks = NeMoGymTaskset(ENV, jsonl_path=tmp_path / "tasks.jsonl")
    second = NeMoGymHarness(ENV, timeout=60)
    async with PolicyServer(counter_policy) as server:
        endpoint = Endpoint(base_url=server.base_url, model="m")
        # run_sync runs its own event loop, here in another thread, against the same shared stack
        results = await asyncio.to_thread(second.run_sync, tasks, endpoint, concurrency=3)
    assert second.stack is harness.stack
    assert sorted(r.reward for r in results) == sorted(expected)
    await asyncio.to_thread(second.close)
    assert harness.stack.running  # the first harness still holds its reference


async def test_the_docs_python_replay_recipe_reproduces_every_recorded_reward(
    harness, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """The docs' replay recipe (Use from Python), as written, on this module's stack (same environment, same
    settings: shared)."""
    launch = harness.stack.launch
    with caplog.at_level(logging.INFO, logger="verifiers_nemo"):
        done = await run_here(doc_block("judge = replay.judge_endpoint()"))

    assert "5/5 rewards equal the recorded ones" in capsys.readouterr().out
    assert [r.error for r in done["results"]] == [None] * 5
    assert not [r for r in caplog.records if "ready in" in r.getMessage()]  # no stack of its own: it shared this one
    assert harness.stack.launch is launch


async def test_the_docs_training_data_loop_writes_its_file_as_the_results_come(
    harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The Training data guide's own loop (a TrainingDataWriter fed by harness.run), as written, on this module's
    stack, its vLLM URL a stand-in that returns token IDs: every rollout of every task is a row of its group, with its
    token samples."""
    import pyarrow.parquet as pq

    from tests.unit.fake_upstream import FakeUpstream

    monkeypatch.chdir(tmp_path)
    launch = harness.stack.launch
    async with FakeUpstream("vllm", token_ids=True) as fake:
        code = doc_block("TrainingDataWriter(").replace("http://gpu-node:8000/v1", fake.base_url)
        with caplog.at_level(logging.INFO, logger="verifiers_nemo"):
            done = await run_here(code)

    report = done["writer"].report
    assert (report.rows, report.rollouts, report.details["tasks"]) == (20, 20, 5), report
    rows = pq.read_table(tmp_path / "live.parquet").to_pylist()
    assert sorted((r["task_index"], r["rollout_index"]) for r in rows) == [(t, r) for t in range(5) for r in range(4)]
    for row in rows:
        assert (row["status"], row["group_size"], row["group_scored"]) == ("scored", 4, 4)
        assert row["model"] == "Qwen/Qwen3-8B"
        (sample,) = row["samples"]  # one call each: the stand-in answers in words
        assert sample["completion_mask"] == [1] * len(sample["completion_token_ids"]) and sample["prompt_token_ids"]
        assert row["advantage"] is not None and row["env"] == ENV
    assert all(call.body.get("return_token_ids") for call in fake.requests)
    assert not [r for r in caplog.records if "ready in" in r.getMessage()]  # no stack of its own: it shared this one
    assert harness.stack.launch is launch
