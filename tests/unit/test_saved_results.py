"""A run's saved results read back as recordings (``eval --save-trace``, then ``-a jsonl_path=.../results.jsonl``):
what makes a result row a recording, and the refusals that say how to save one."""

from __future__ import annotations

import pytest

from verifiers_nemo._tasks.saved_results import as_recording
from verifiers_nemo._tasks.validation import RowError

GYM_ROW = {"responses_create_params": {"input": [{"role": "user", "content": "Weather in Lima?"}]}, "city": "Lima"}
FIRST = {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Lima"}'}
TOOL = {"type": "function_call_output", "call_id": "c1", "output": "mild"}
LAST = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Mild."}]}


def _result(**more: object) -> dict:
    return {"task_index": 0, "rollout_index": 0, "completion": [], "agent": "a_simple_agent", "reward": 1.0, **more}


def test_a_gym_row_is_left_as_it_is() -> None:
    row = {**GYM_ROW, "response": {"output": [LAST]}, "reward": 1.0}

    assert as_recording(row) is row


def test_a_result_with_gym_result_is_gym_s_own_record_with_its_agent() -> None:
    gym = {**GYM_ROW, "response": {"output": [FIRST, TOOL, LAST]}, "reward": 1.0}

    recording = as_recording(_result(gym_result=gym))

    assert recording == {**gym, "agent_ref": {"type": "responses_api_agents", "name": "a_simple_agent"}}


def test_a_result_keeps_the_fields_of_the_row_it_ran_on_which_gym_s_reply_may_not_echo() -> None:
    gym = {**GYM_ROW, "response": {"output": [LAST]}, "reward": 1.0}

    recording = as_recording(_result(gym_result=gym, row_fields={"city": "Lima", "secret": 7}))

    assert recording["secret"] == 7 and recording["city"] == "Lima"
    assert recording["response"] == gym["response"] and recording["reward"] == 1.0


def test_a_result_with_responses_calls_only_is_rebuilt_from_them() -> None:
    calls = [
        {"request": {**GYM_ROW["responses_create_params"], "model": "m"}, "response": {"output": [FIRST]}},
        {"request": {"input": [*GYM_ROW["responses_create_params"]["input"], FIRST, TOOL], "model": "m"},
         "response": {"id": "r2", "output": [LAST]}},
    ]  # fmt: skip

    recording = as_recording(_result(trace=calls))

    assert recording["responses_create_params"] == GYM_ROW["responses_create_params"]
    assert recording["response"] == {"id": "r2", "output": [FIRST, TOOL, LAST]} and recording["reward"] == 1.0


@pytest.mark.parametrize(
    ("row", "says"),
    [
        (_result(), "saved without --save-trace"),
        (_result(reward=None, error={"type": "timeout"}), "failed or has no reward"),
        (_result(trace=[{"request": {"messages": []}, "response": {"output": []}}]), "Chat Completions requests"),
    ],
)
def test_a_result_that_cannot_be_a_recording_is_refused_with_the_fix(row: dict, says: str) -> None:
    with pytest.raises(RowError, match=says) as caught:
        as_recording(row)
    assert caught.value.fix
