"""The replay engine's generate reply shapes (vLLM 0.31's, 0.32's, 0.33's with weight versions), the policy versions a
rollout's turns were sampled under as its trace records them, their tally and summary line, and the refusal that
ends a run when the training client cannot read the engine's shape. The shapes read by the real renderers, and the
versions recorded by the real verifiers, run end to end in tests/e2e/test_training_check.py."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from verifiers_nemo._eval.report import format_summary
from verifiers_nemo._eval.training import TrainingTally
from verifiers_nemo._training.policy_versions import policy_versions
from verifiers_nemo._training.reply_shapes import GENERATE_SHAPES, logprob_entries, weight_versions_key
from verifiers_nemo._upstreams.refusals import KNOWN_REFUSALS, run_ending

from .test_training_check import _metadata, _record

IDS = [151667, 13, 151668]


def _choice(shape: Any, ids: list[int]) -> dict[str, Any]:
    text = f'{{"token_ids": {ids}, "logprobs": {{"content": [{logprob_entries(shape, ids, -0.5)}]}}'
    return json.loads(text + weight_versions_key(shape, "7", len(ids)) + "}")


def test_the_oldest_shape_names_each_token_as_a_string_the_newer_ones_as_an_integer() -> None:
    assert GENERATE_SHAPES[0] == "vllm-0.31"
    old, v32, v33 = (_choice(shape, IDS) for shape in ("vllm-0.31", "vllm-0.32", "vllm-0.33"))

    assert [e["token"] for e in old["logprobs"]["content"]] == [f"token_id:{t}" for t in IDS]
    for choice in (v32, v33):
        assert [e["token_id"] for e in choice["logprobs"]["content"]] == IDS
        assert all("token" not in e and e["logprob"] == -0.5 for e in choice["logprobs"]["content"])


def test_only_vllm_0_33_says_which_weights_sampled_the_completion() -> None:
    assert "weight_versions" not in _choice("vllm-0.31", IDS) and "weight_versions" not in _choice("vllm-0.32", IDS)
    assert _choice("vllm-0.33", IDS)["weight_versions"] == [{"version": "7", "start": 0, "end": len(IDS)}]
    assert _choice("vllm-0.33", [])["weight_versions"] == []


@dataclass
class Span:
    version: str
    start: int
    end: int


@dataclass
class Node:
    weight_versions: list[Span] | None = None


@dataclass
class Call:
    node: int | None


@dataclass
class Trace:
    """What policy_versions reads of a verifiers trace: its calls in order, each pointing at its sampled node."""

    nodes: list[Node] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)


def _trace(*turns: list[str] | None) -> Trace:
    trace = Trace()
    for versions in turns:
        spans = None if versions is None else [Span(v, i, i + 1) for i, v in enumerate(versions)]
        trace.nodes += [Node(), Node(spans)]  # a prompt node, then the sampled one
        trace.calls.append(Call(len(trace.nodes) - 1))
    return trace


def test_a_rollout_records_the_span_of_versions_its_turns_were_sampled_under() -> None:
    record = policy_versions(_trace(["9"], ["9", "10"], ["10"], ["11"]))

    assert record == {"oldest": "9", "newest": "11", "versions": 3, "by_turn": [["9"], ["9", "10"], ["10"], ["11"]]}


def test_nothing_is_recorded_where_the_engine_labelled_nothing_and_unlabelled_turns_stay_empty() -> None:
    assert policy_versions(_trace(None, None)) is None
    assert policy_versions(Trace()) is None
    assert policy_versions(_trace(None, ["3"]))["by_turn"] == [[], ["3"]]


def test_versions_that_are_not_numbers_keep_the_order_the_turns_met_them() -> None:
    record = policy_versions(_trace(["step-b"], ["step-a"]))

    assert (record["oldest"], record["newest"]) == ("step-b", "step-a")


def test_the_summary_says_per_environment_which_versions_sampled_and_how_many_rollouts_crossed_one() -> None:
    tally = TrainingTally()
    tally.add(_record("counter", 0, 1, policy_versions=policy_versions(_trace(["4"], ["5"]))))
    tally.add(_record("counter", 1, 1, policy_versions=policy_versions(_trace(["3"], ["3"]))))
    tally.add(_record("counter", 2, 1))  # a rollout the engine left unlabelled
    tally.add(_record("game", 3, 1))

    summary = tally.summary()
    text = format_summary(_metadata(summary))

    assert summary is not None
    counter = summary["by_env"]["counter"]["policy_versions"]
    assert counter == {"labelled": 2, "oldest": "3", "newest": "5", "across_versions": 1}
    assert "policy_versions" not in summary["by_env"]["game"]
    assert "policy versions 3..5 (2/3 rollouts labelled) · 1 across versions" in text
    assert text.count("policy versions") == 1


def test_an_engine_shape_the_client_cannot_read_ends_the_run_naming_the_installed_versions_and_the_fix() -> None:
    # What verifiers 0.4.0's interception answers when renderers 0.1.12 meets vLLM 0.32's or 0.33's reply, as the
    # harness words it on the rollout.
    (shape,) = [r for r in KNOWN_REFUSALS if r.ends_run]
    message = f"http://127.0.0.1:1/v1/chat/completions refused the request (HTTP 502): {shape.describe()}"

    refusal = run_ending(message)

    assert refusal is shape
    line = refusal.describe()
    assert "\n" not in line and "(installed here: renderers " in line and ", verifiers " in line
    assert "renderers >= 0.1.13.dev17" in line and "prime-rl's inference server" in line


@pytest.mark.parametrize("refusal", [r for r in KNOWN_REFUSALS if not r.ends_run], ids=lambda r: r.phrase[:24])
def test_refusals_of_one_rollout_or_one_environment_do_not_end_the_run(refusal: Any) -> None:
    assert run_ending(refusal.describe()) is None
