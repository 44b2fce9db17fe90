"""The replay server answers judge calls from the judge I/O the recordings carry, apart from policy calls."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from verifiers_nemo import ReplayServer, Task
from verifiers_nemo._tasks.recorded import RecordedTasks


def message(text: str, role: str = "assistant") -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": role,
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def judge_response(text: str) -> dict[str, Any]:
    return {
        "id": "resp_recorded_judge",
        "object": "response",
        "created_at": 1757366251.0,
        "model": "recorded-judge-model",
        "status": "completed",
        "output": [message(text)],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
    }


def recorded_params(prompt: str) -> dict[str, Any]:
    """A judge request as Gym records it: explicit nulls and ``type: message`` a live request lacks."""
    return {
        "input": [{"role": "user", "content": prompt, "type": "message"}],
        "model": None,
        "temperature": None,
        "max_output_tokens": None,
        "tools": [],
    }


def recorded_row(prompt: str, answer: str, **verify_outputs: Any) -> dict[str, Any]:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": prompt}]},
        "response": {"id": "resp_policy", "output": [message(answer)]},
        "reward": 1.0,
        **verify_outputs,
    }


EVALUATIONS_ROW = recorded_row(
    "What is 2+2?",
    "4",
    judge_evaluations=[
        {"responses_create_params": recorded_params("Expected: 4\nGenerated: 4"), "response": judge_response("[[A=B]]")}
    ],
)
PARAMS_ROW = recorded_row(
    "Summarise the report.",
    "It grew.",
    judge_responses_create_params=recorded_params("Grade this summary: It grew."),
    judge_response=judge_response("score: 80"),
)
OUTPUT_ROW = recorded_row(
    "Capital of France?",
    "Paris",
    question="Capital of France?",
    extracted_answer="Paris",
    judge_output="Grade: A",
)
RUBRIC_ROW = recorded_row(
    "Write a haiku.",
    "Old pond...",
    rubric_evaluations=[{"judge_prompt": "Is this a haiku? Old pond...", "judge_response": "YES"}],
)


def task(index: int, row: dict[str, Any]) -> Task:
    return Task(index, 0, row, "agent", "env", str(index), f"rollouts.jsonl:{index + 1}", recorded=True)


@pytest.fixture
def replay() -> Iterator[ReplayServer]:
    rows = [EVALUATIONS_ROW, PARAMS_ROW, OUTPUT_ROW, RUBRIC_ROW]
    with ReplayServer.from_tasks([task(i, row) for i, row in enumerate(rows)]) as upstream:
        yield upstream


def ask_judge(replay: ReplayServer, prompt: str, **extra: Any) -> httpx.Response:
    endpoint = replay.judge_endpoint("judge_model")
    body = {"model": "any-judge", "temperature": 0.0, "input": [{"role": "user", "content": prompt}], **extra}
    return httpx.post(f"{endpoint.base_url}/responses", json=body, headers=endpoint.extra_headers)


def test_judge_endpoint_reaches_the_same_server_apart_from_policy_calls(replay: ReplayServer) -> None:
    endpoint = replay.judge_endpoint("genrm_model")

    assert endpoint.api == "responses"
    assert endpoint.base_url.startswith(replay.url)
    assert endpoint.base_url != replay.endpoint_for(task(0, EVALUATIONS_ROW)).base_url


def test_judge_request_gets_the_recorded_judge_evaluation_whatever_its_model_and_sampling(
    replay: ReplayServer,
) -> None:
    reply = ask_judge(replay, "Expected: 4\nGenerated: 4", max_output_tokens=64)

    assert reply.status_code == 200
    assert reply.json() == judge_response("[[A=B]]")


def test_judge_request_gets_the_recorded_judge_response_of_a_single_judge_call(replay: ReplayServer) -> None:
    reply = ask_judge(replay, "Grade this summary: It grew.")

    assert reply.json() == judge_response("score: 80")


def test_text_only_recording_answers_the_prompt_that_holds_its_question_and_answer(replay: ReplayServer) -> None:
    reply = ask_judge(replay, "Question: Capital of France?\nGold: Paris\nPredicted: Paris\nGrade it.")

    assert reply.status_code == 200
    body = reply.json()
    assert body["object"] == "response" and body["status"] == "completed"
    assert body["output"][0]["content"][0]["text"] == "Grade: A"


def test_text_only_recording_answers_a_chat_completions_judge_request(replay: ReplayServer) -> None:
    endpoint = replay.judge_endpoint()
    prompt = "Question: Capital of France?\nPredicted: Paris"
    body = {"model": "any-judge", "messages": [{"role": "user", "content": prompt}]}

    reply = httpx.post(f"{endpoint.base_url}/chat/completions", json=body)

    assert reply.status_code == 200
    assert reply.json()["choices"][0]["message"] == {"role": "assistant", "content": "Grade: A"}


def test_text_only_recordings_of_one_question_are_told_apart_by_the_most_specific_answer() -> None:
    rows = [
        recorded_row("2*21?", "4", question="2*21?", extracted_answer="4", judge_output="wrong"),
        recorded_row("2*21?", "42", question="2*21?", extracted_answer="42", judge_output="right"),
    ]
    with ReplayServer.from_tasks([task(i, row) for i, row in enumerate(rows)]) as replay:
        reply = ask_judge(replay, "Question: 2*21?\nPredicted: 42")

    assert reply.json()["output"][0]["content"][0]["text"] == "right"


def test_rubric_recording_answers_the_same_user_prompt(replay: ReplayServer) -> None:
    reply = ask_judge(
        replay,
        "ignored",
        input=[
            {"role": "system", "content": "Be strict."},
            {"role": "user", "content": RUBRIC_ROW["rubric_evaluations"][0]["judge_prompt"]},
        ],
    )

    assert reply.json()["output"][0]["content"][0]["text"] == "YES"


def test_judge_request_no_recording_has_is_refused(replay: ReplayServer) -> None:
    reply = ask_judge(replay, "Expected: 5\nGenerated: 4")

    assert reply.status_code == 404
    error = reply.json()["error"]
    assert error["type"] == "replay_unknown_judge_input"
    assert "judge request" in error["message"] and "no recording has" in error["message"]


def test_policy_calls_are_unaffected_by_judge_recordings(replay: ReplayServer) -> None:
    endpoint = replay.endpoint_for(task(0, EVALUATIONS_ROW))
    policy = {"model": "replay", "input": [{"role": "user", "content": "What is 2+2?"}]}
    judge_on_policy_path = {"model": "replay", "input": [{"role": "user", "content": "Expected: 4\nGenerated: 4"}]}

    reply = httpx.post(f"{endpoint.base_url}/responses", json=policy, headers=endpoint.extra_headers)
    refused = httpx.post(f"{replay.url}/v1/responses", json=judge_on_policy_path)

    assert reply.json()["output"] == [message("4")]
    assert refused.status_code == 404 and refused.json()["error"]["type"] == "replay_unknown_input"
    assert replay.judge_requests == 0


def test_recorded_tasks_rebuilt_from_the_dataset_keep_their_judge_calls(tmp_path: Path) -> None:
    dataset = tmp_path / "example.jsonl"
    dataset.write_text(json.dumps({"responses_create_params": EVALUATIONS_ROW["responses_create_params"], "gold": "4"}))

    restored = RecordedTasks([dataset]).restore(task(0, EVALUATIONS_ROW))

    assert "judge_evaluations" not in restored.row and restored.row["gold"] == "4"
    with ReplayServer.from_tasks([restored]) as replay:
        assert ask_judge(replay, "Expected: 4\nGenerated: 4").status_code == 200


def test_a_policy_call_naming_no_recording_is_matched_on_its_input_and_model_outputs_however_gym_wrote_them() -> None:
    call = {"type": "function_call", "call_id": "c1", "name": "add", "arguments": '{"a": 2}', "id": None}
    recorded = recorded_row("What is 2+2?", "4")
    recorded["responses_create_params"]["input"][0] |= {"type": "message", "name": None}  # as Gym records it
    tool_result = {"type": "function_call_output", "call_id": "c1", "output": '{"sum": 4}', "id": None}
    recorded["response"]["output"] = [call, tool_result, message("4")]
    asked = [{"role": "user", "content": "What is 2+2?"}]  # a dataset row's input; no row header
    with ReplayServer.from_tasks([task(0, recorded)]) as replay:
        first = httpx.post(f"{replay.url}/v1/responses", json={"model": "replay", "input": asked})
        then = {"type": "function_call_output", "call_id": "c1", "output": '{"sum":4}'}  # the agent's own serialisation
        second = httpx.post(f"{replay.url}/v1/responses", json={"model": "replay", "input": [*asked, call, then]})

    assert first.status_code == 200 and first.json()["output"] == [call]
    assert second.status_code == 200 and second.json()["output"] == [message("4")]
