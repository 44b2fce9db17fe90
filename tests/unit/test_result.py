"""Mapping a Gym agent's /run answer onto RolloutResult: reward, metrics, completion, usage."""

from __future__ import annotations

import math

import pytest

from verifiers_nemo import ConfigurationError, GymEpisodeFailed, InvalidResult, NeMoGymHarness, RolloutResult
from verifiers_nemo._harness import split_sampling_args
from verifiers_nemo._protocol import output_to_messages, sum_usage
from verifiers_nemo._result import extract_metrics, is_retryable_failure, map_gym_result, parse_reward
from verifiers_nemo._routing import ROUTE_METADATA_KEY, strip_route


@pytest.mark.parametrize(("value", "expected"), [(1, 1.0), (0.25, 0.25), ("0.5", 0.5), (" 1 ", 1.0), (-2, -2.0)])
def test_reward_is_a_number_or_a_numeric_string(value, expected) -> None:
    assert parse_reward(value) == expected


@pytest.mark.parametrize("value", [True, False, None, "yes", [1], {"r": 1}, math.nan])
def test_anything_else_as_reward_is_an_invalid_result(value) -> None:
    with pytest.raises(InvalidResult):
        parse_reward(value)


def test_numeric_and_bool_top_level_fields_other_than_reward_are_metrics() -> None:
    gym_result = {"reward": 1.0, "accuracy": 0.5, "hit": True, "name": "x", "nested": {"a": 1}, "n": 3}
    assert extract_metrics(gym_result) == {"accuracy": 0.5, "hit": 1.0, "n": 3.0}


def test_identifiers_and_the_mask_flag_are_not_metrics() -> None:
    gym_result = {"reward": 0.0, "question_id": 2, "index": 4, "task_idx": 1, "id": 9, "mask_sample": True, "f1": 0.5}
    assert extract_metrics(gym_result) == {"f1": 0.5}


def test_a_sample_gym_masks_keeps_its_reward_and_failure_but_is_not_scored() -> None:
    result = RolloutResult(task_index=0, rollout_index=0)
    gym_result = {
        "reward": 0.0,
        "mask_sample": True,
        "failure_kind": "judge_failed",
        "failure_reason": "judge endpoint unreachable",
        "response": {"output": []},
    }
    map_gym_result(result, gym_result, "vnr-key", "m")

    assert result.masked and result.reward == 0.0 and result.error is None and not result.scored
    row = result.to_dict()
    assert (row["masked"], row["failure_kind"], row["failure_reason"]) == (
        True,
        "judge_failed",
        "judge endpoint unreachable",
    )
    assert "mask_sample" not in result.metrics


def test_a_failure_kind_is_kept_when_the_sample_is_not_masked() -> None:
    result = RolloutResult(task_index=0, rollout_index=0)
    map_gym_result(result, {"reward": 1.0, "failure_kind": "partial_tool_error"}, "vnr-key", "m")
    assert result.scored and not result.masked and result.to_dict()["failure_kind"] == "partial_tool_error"


def test_an_episode_gym_reports_failed_is_an_error_row_with_its_partial_completion_never_a_reward() -> None:
    result = RolloutResult(task_index=0, rollout_index=0)
    gym_result = {
        "reward": 0.0,
        "_ng_failure_class": "environment_server_failed",
        "_ng_failure_stage": "step",
        "_ng_failure_message": "sandbox lost",
        "_ng_failure_partial_response": {"output": [{"type": "message", "role": "assistant", "content": "half"}]},
    }
    map_gym_result(result, gym_result, "vnr-key", "m")

    assert isinstance(result.error, GymEpisodeFailed) and result.reward is None and not result.scored
    assert "environment_server_failed at step: sandbox lost" in str(result.error)
    assert result.completion == [{"role": "assistant", "content": "half"}]
    assert result.to_dict()["error"]["type"] == "gym_episode_failed"
    assert is_retryable_failure(gym_result)
    assert not is_retryable_failure({**gym_result, "_ng_failure_terminal": True})


def test_a_masked_sample_with_a_failure_class_is_scored_as_gym_masks_it_not_an_error() -> None:
    result = RolloutResult(task_index=0, rollout_index=0)
    gym_result = {"reward": 0.0, "mask_sample": True, "_ng_failure_class": "judge_failed", "response": {"output": []}}
    map_gym_result(result, gym_result, "vnr-key", "m")
    assert result.error is None and result.masked and not is_retryable_failure(gym_result)


def test_output_becomes_chat_messages_with_tool_calls_results_and_reasoning_apart() -> None:
    output = [
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "sf"}'},
        {"type": "function_call", "call_id": "c2", "name": "get_time", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "c2", "output": "noon"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sunny at noon."}]},
    ]
    messages = output_to_messages(output)
    assert messages[0]["role"] == "assistant" and messages[0]["reasoning_content"] == "think"
    assert [c["function"]["name"] for c in messages[0]["tool_calls"]] == ["get_weather", "get_time"]
    assert messages[1] == {"role": "tool", "tool_call_id": "c1", "content": "sunny"}
    assert messages[2] == {"role": "tool", "tool_call_id": "c2", "content": "noon"}
    assert messages[3] == {"role": "assistant", "content": "Sunny at noon."}


def test_usage_is_summed_over_calls_with_details() -> None:
    usage = {
        "input_tokens": 10,
        "output_tokens": 2,
        "total_tokens": 12,
        "input_tokens_details": {"cached_tokens": 4},
        "output_tokens_details": {"reasoning_tokens": 1},
    }
    assert sum_usage([usage, None, usage]) == {
        "input_tokens": 20,
        "output_tokens": 4,
        "total_tokens": 24,
        "cached_tokens": 8,
        "reasoning_tokens": 2,
    }


def test_route_key_is_removed_from_the_gym_result() -> None:
    key = "vnr-secret-route"
    result = {
        "responses_create_params": {"model": key, "metadata": {ROUTE_METADATA_KEY: key}},
        "response": {"model": key, "metadata": {ROUTE_METADATA_KEY: key, "keep": "me"}},
    }
    strip_route(result, key, "real-model")
    assert key not in repr(result)
    assert result["responses_create_params"] == {"model": "real-model", "metadata": None}
    assert result["response"]["metadata"] == {"keep": "me"}


def test_sampling_args_split_into_gym_params_and_upstream_extras() -> None:
    gym, extra = split_sampling_args({"temperature": 0.7, "max_tokens": 64, "top_k": 20, "logprobs": True, "x": None})
    assert gym == {"temperature": 0.7, "max_output_tokens": 64}
    assert extra == {"top_k": 20, "logprobs": True}


def test_an_errored_result_has_no_reward_and_serialises_its_error() -> None:
    result = RolloutResult(task_index=3, rollout_index=1, error=InvalidResult("reward is a bool"))
    row = result.to_dict()
    assert row["reward"] is None and row["error"] == {"type": "invalid_result", "message": "reward is a bool"}
    assert not result.ok


def test_environment_scored_by_a_judge_model_given_no_judge_is_refused_before_anything_starts() -> None:
    harness = NeMoGymHarness("aalcr")
    with pytest.raises(ConfigurationError, match=r"judge model .*no judge endpoint was given. Pass --judge-base-url"):
        harness.start()
    assert not harness.started
