"""NeMoGymTaskset: packaged and user JSONL tasks, checked row by row, with a chat-style view."""

from __future__ import annotations

import importlib.util
import json
import logging
import shutil
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from verifiers_nemo import ConfigurationError, NeMoGymTaskset, Task, TasksetError, get_environment, list_environments
from verifiers_nemo._tasks import SkippedRows
from verifiers_nemo._tasks.recorded import RecordedTasks
from verifiers_nemo._tasks.validation import NEMO_GYM_0_4_PARAMS, gym_params

_SPEC = importlib.util.find_spec("nemo_gym")
if _SPEC is None or _SPEC.origin is None:
    pytest.skip("nemo-gym is not installed in this interpreter", allow_module_level=True)
GYM_ROOT = Path(_SPEC.origin).parent.parent
COUNTER_ENV = "example_session_state_mgmt"
ENVIRONMENTS = list_environments(GYM_ROOT)


def taskset(nemo_env: str | None = None, **kwargs: Any) -> NeMoGymTaskset:
    return NeMoGymTaskset(nemo_env, root=GYM_ROOT, **kwargs)


def row(text: str = "hello", **extra: Any) -> dict[str, Any]:
    return {"responses_create_params": {"input": [{"role": "user", "content": text}]}, **extra}


def write_jsonl(path: Path, lines: list[Any]) -> Path:
    """Write dicts as JSON lines and strings as they are."""
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


# ---- packaged data


@pytest.mark.parametrize(
    "dataset",
    [d for e in ENVIRONMENTS for d in e.datasets if d.exists],
    ids=lambda d: f"{d.agent}:{d.name}",
)
def test_every_shipped_dataset_file_parses(dataset: Any) -> None:
    tasks = NeMoGymTaskset(jsonl_path=dataset.path, agent=dataset.agent, root=GYM_ROOT)

    assert len(tasks) > 0
    for task in tasks:
        assert isinstance(task.prompt, list)
        assert isinstance(task.tools, list)


@pytest.mark.parametrize("environment", ENVIRONMENTS, ids=lambda e: e.name)
def test_every_environment_loads_its_default_dataset_or_says_why(environment: Any) -> None:
    try:
        tasks = taskset(environment.name)
    except TasksetError as exc:
        assert environment.default_dataset is None
        assert str(environment.directory) in str(exc)
        assert "Fix:" in str(exc)
        return
    assert len(tasks) > 0
    assert tasks.env_name == environment.name
    assert all(task.agent_name in {a.name for a in environment.agents} for task in tasks)


@pytest.mark.parametrize(
    "environment",
    [e for e in ENVIRONMENTS if e.has_example_rollouts and e.default_agent],
    ids=lambda e: e.name,
)
def test_every_shipped_recording_loads_with_its_reward(environment: Any) -> None:
    tasks = taskset(environment.name, recorded=True)

    assert len(tasks) > 0
    for task in tasks:
        assert task.recorded
        assert task.recorded_response is not None
        assert "reward" in task.row and task.recorded_reward == task.row["reward"]


def test_recorded_tasks_carry_the_recorded_response_and_reward() -> None:
    task = taskset("example_multi_step", recorded=True)[0]

    assert isinstance(task.recorded_reward, float)
    assert task.recorded_response is not None
    assert task.recorded_response["output"]
    assert task.agent_name == "example_multi_step_simple_agent"


def test_recorded_tasks_are_runnable_with_the_fields_their_resources_server_needs_from_the_dataset() -> None:
    """The counter environment's recordings keep only input, response and reward; its /seed_session needs
    initial_count: each recorded task gets the fields of the dataset row with its input, and keeps the recording."""
    dataset = {
        json.dumps(r["responses_create_params"]["input"][0]["content"]): r
        for r in map(json.loads, get_environment(COUNTER_ENV, GYM_ROOT).default_dataset.path.read_text().splitlines())
    }

    tasks = list(taskset(COUNTER_ENV, recorded=True))

    assert len(tasks) == 5
    for task in tasks:
        assert set(task.recorded_row) == {"responses_create_params", "response", "reward"}  # the file's line
        original = dataset[json.dumps(task.prompt[0]["content"])]
        sent = task.gym_row()
        for field in ("initial_count", "expected_count"):
            assert sent[field] == original[field]
        assert sent["responses_create_params"]["input"] == task.recorded_row["responses_create_params"]["input"]
        assert task.recorded_response == task.recorded_row["response"]
        assert task.recorded_reward == task.recorded_row["reward"]


def test_recordings_of_a_file_are_restored_from_the_named_environment_and_unmatched_ones_run_as_recorded(
    tmp_path: Path,
) -> None:
    recorded = taskset(COUNTER_ENV, recorded=True)[0].recorded_row
    unmatched = row("a task no dataset row has", response={"output": []}, reward=1.0)
    path = write_jsonl(tmp_path / "mine.jsonl", [recorded, unmatched])

    first, second = taskset(COUNTER_ENV, jsonl_path=path, recorded=True)

    assert "initial_count" in first.gym_row() and first.recorded_row == recorded
    assert second.row == unmatched and second.recorded_row is None
    assert "reward" not in second.gym_row() and "response" not in second.gym_row()


def test_a_recording_takes_the_first_dataset_row_of_its_input_across_the_environment_s_files(tmp_path: Path) -> None:
    example = write_jsonl(tmp_path / "example.jsonl", [row("a", gold=1), row("b", gold=2), row("a", gold=3)])
    train = write_jsonl(tmp_path / "train.jsonl", ["", row("c", gold=4), "not json", row("b", gold=5)])
    recording = Task(0, 0, row("c", reward=1.0), "agent", "env", "0", "rollouts.jsonl:1", recorded=True)
    restorer = RecordedTasks([example, train, example])

    restored = {text: restorer.restore(replace(recording, row=row(text, reward=1.0))) for text in "abcd"}

    assert {text: t.row.get("gold") for text, t in restored.items()} == {"a": 1, "b": 2, "c": 4, "d": None}
    assert restored["d"].recorded_row is None  # no row has its input: the recording as it is


def test_rows_that_share_a_prompt_give_each_recording_the_row_whose_fields_it_carries(tmp_path: Path) -> None:
    """Four games with one prompt and a hidden secret: a recording that keeps its row's fields (``--save-trace``
    does) gets that row back, not the first row with its prompt."""
    games = [row("guess my number", secret=n, game=n) for n in (3, 7, 1, 9)]
    restorer = RecordedTasks([write_jsonl(tmp_path / "example.jsonl", games)])
    recording = Task(0, 0, row("guess my number"), "agent", "env", "0", "rollouts.jsonl:1", recorded=True)

    restored = [restorer.restore(replace(recording, row={**game, "reward": 1.0})) for game in reversed(games)]

    assert [t.gym_row()["secret"] for t in restored] == [9, 1, 7, 3]
    assert restorer.ambiguous == 0


def test_a_recording_with_fewer_fields_takes_the_row_that_agrees_then_its_gym_task_index(tmp_path: Path) -> None:
    games = [row("p", secret=n, level="easy" if n < 5 else "hard") for n in (3, 7, 1, 9)]
    restorer = RecordedTasks([write_jsonl(tmp_path / "example.jsonl", games)])
    recording = Task(0, 0, row("p"), "agent", "env", "0", "rollouts.jsonl:1", recorded=True)

    hard = restorer.restore(replace(recording, row=row("p", level="hard", reward=0.0)))
    at_index = restorer.restore(replace(recording, row=row("p", level="hard", _ng_task_index=3, reward=0.0)))
    disagreeing = restorer.restore(replace(recording, row=row("p", secret=1, level="hard", reward=0.0)))

    assert hard.gym_row()["secret"] == 7  # the first of the two that agree
    assert at_index.gym_row()["secret"] == 9  # Gym's own index of the row it ran
    assert disagreeing.gym_row()["secret"] in (1, 7, 9)  # one field off either way: a guess, and said so
    assert restorer.ambiguous == 2


def test_recordings_that_cannot_tell_rows_with_one_prompt_apart_are_said_to_be_ambiguous_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    games = [row("guess my number", secret=n) for n in (3, 7)]
    restorer = RecordedTasks([write_jsonl(tmp_path / "example.jsonl", [*games, row("other", secret=5)])])
    recording = Task(0, 0, row("guess my number", reward=1.0), "agent", "env", "0", "rollouts.jsonl:1", recorded=True)

    with caplog.at_level(logging.WARNING):
        first, second = restorer.restore(recording), restorer.restore(recording)
        restorer.restore(replace(recording, row=row("other", reward=1.0)))  # one row: no guess

    assert first.gym_row()["secret"] == second.gym_row()["secret"] == 3
    assert restorer.ambiguous == 2
    warnings = [r.getMessage() for r in caplog.records if "share their prompt" in r.getMessage()]
    assert len(warnings) == 1 and "Fix: replay runs saved with --save-trace" in warnings[0]


def test_a_dataset_file_changed_after_its_rows_were_found_is_an_error_saying_so(tmp_path: Path) -> None:
    example = write_jsonl(tmp_path / "example.jsonl", [row("a", gold=1)])
    restorer = RecordedTasks([example])
    recording = Task(0, 0, row("a", reward=1.0), "agent", "env", "0", "rollouts.jsonl:1", recorded=True)
    assert restorer.restore(recording).row["gold"] == 1

    write_jsonl(example, [row("a", gold=2), row("z")])

    with pytest.raises(TasksetError, match=r"example.jsonl changed since .* Fix:"):
        restorer.restore(recording)


def test_plain_tasks_have_no_recorded_output() -> None:
    task = taskset("example_multi_step")[0]

    assert not task.recorded
    assert task.recorded_response is None
    assert task.recorded_reward is None


def test_stale_agent_names_in_packaged_recordings_run_on_the_environment_agent() -> None:
    task = taskset("aalcr", recorded=True)[0]

    assert task.row["agent_ref"]["name"] == "aalcr_benchmark_simple_agent"  # raw row untouched
    assert task.agent_name == "aalcr_simple_agent"
    assert task.gym_row()["agent_ref"]["name"] == "aalcr_simple_agent"


def test_packaged_rows_naming_another_configs_agent_run_on_the_datasets_agent() -> None:
    tasks = taskset("structured_outputs")

    assert tasks[0].row["agent_ref"]["name"] == "structured_outputs_v4_simple_agent"
    assert tasks.agents == ("structured_outputs_simple_agent",)


def test_gym_row_drops_nulls_verify_outputs_and_the_recorded_gym_stamps_and_stamps_its_own_indices() -> None:
    task = taskset("example_multi_step", recorded=True)[0]
    raw_params = task.row["responses_create_params"]
    assert any(value is None for value in raw_params.values())

    sent = task.gym_row()

    assert all(value is not None for value in sent["responses_create_params"].values())
    assert sent["responses_create_params"]["input"] == raw_params["input"]
    assert "response" not in sent and "reward" not in sent
    # the recording's own stamps go; this rollout's indices are stamped as Gym's collector stamps them
    assert {key: sent[key] for key in sent if key.startswith("_ng_")} == {
        "_ng_task_index": task.task_index,
        "_ng_rollout_index": task.rollout_index,
    }
    assert "response" in task.row  # the raw row is left as read


def test_dataset_picks_another_named_dataset() -> None:
    tasks = taskset("example_multi_step", dataset="example")

    assert tasks.path.name == "example.jsonl"


def test_a_dataset_gym_downloads_is_reported_with_where_to_get_it() -> None:
    with pytest.raises(TasksetError) as caught:
        taskset("example_multi_step", dataset="train")

    message = str(caught.value)
    assert "resources_servers/example_multi_step/data/train.jsonl" in message
    assert "not shipped" in message and "gitlab" in message
    assert "Fix:" in message and "jsonl_path=" in message


def test_unknown_dataset_name_lists_the_datasets() -> None:
    with pytest.raises(ConfigurationError, match="validation"):
        taskset("example_multi_step", dataset="valid")


def test_placeholder_recordings_are_refused_with_the_reason() -> None:
    with pytest.raises(TasksetError, match="placeholder") as caught:
        taskset("tavily_search", recorded=True)
    assert "example_rollouts.jsonl" in str(caught.value)


def test_unknown_environment_is_an_error_naming_close_ones() -> None:
    with pytest.raises(ConfigurationError, match="example_multi_step"):
        taskset("example_multi_stp")


def test_schema_read_from_nemo_gym_matches_the_built_in_copy() -> None:
    assert gym_params(GYM_ROOT) == NEMO_GYM_0_4_PARAMS


# ---- the normalised view


def test_prompt_is_chat_messages_with_developer_as_system() -> None:
    input_items = [
        {"role": "developer", "content": "be brief"},
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}],
        },
        {"type": "reasoning", "summary": []},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "42"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "done"}]},
    ]
    task = Task(0, 0, {"responses_create_params": {"input": input_items}}, "a", None, "0", "f:1")

    assert task.prompt == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "a\nb"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
        {"role": "assistant", "content": "done"},
    ]


def test_a_string_input_is_one_user_message() -> None:
    task = Task(0, 0, {"responses_create_params": {"input": "hi"}}, "a", None, "0", "f:1")

    assert task.prompt == [{"role": "user", "content": "hi"}]


def test_images_stay_as_chat_content_parts() -> None:
    task = taskset("circle_click")[0]

    parts = next(m["content"] for m in task.prompt if isinstance(m["content"], list))
    assert {p["type"] for p in parts} <= {"text", "image_url"}
    assert any(p["type"] == "image_url" and p["image_url"]["url"] for p in parts)


def test_tools_are_given_in_chat_completions_form() -> None:
    raw_tool = {
        "type": "function",
        "name": "get",
        "description": "d",
        "parameters": {"type": "object"},
        "strict": True,
    }
    task = Task(0, 0, {"responses_create_params": {"input": "x", "tools": [raw_tool]}}, "a", None, "0", "f:1")

    assert task.tools == [
        {
            "type": "function",
            "function": {"name": "get", "description": "d", "parameters": {"type": "object"}, "strict": True},
        }
    ]


def test_extras_are_the_other_top_level_fields() -> None:
    task = taskset("example_multi_step")[0]

    assert "responses_create_params" not in task.extras and "agent_ref" not in task.extras
    assert set(task.extras) == set(task.row) - {"responses_create_params", "agent_ref"}


def test_example_id_comes_from_the_row_else_its_position(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", [row(id="alpha"), row(task_id=7), row()])

    tasks = NeMoGymTaskset(jsonl_path=path, agent="a")

    assert [t.example_id for t in tasks] == ["alpha", "7", "2"]


# ---- repeats, limit, shuffle


def test_repeats_give_every_rollout_a_stable_task_and_rollout_index(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", [row("a"), row("b")])

    tasks = NeMoGymTaskset(jsonl_path=path, agent="a", rollouts_per_task=3)

    assert len(tasks) == 6 and tasks.num_rows == 2
    assert [(t.task_index, t.rollout_index) for t in tasks] == [
        (0, 0),
        (0, 1),
        (0, 2),
        (1, 0),
        (1, 1),
        (1, 2),
    ]
    assert tasks[4] == tasks[4] and tasks[4].row == tasks[3].row
    assert len({*tasks, *tasks}) == 6
    assert tasks[-1].task_index == 1 and tasks[-1].rollout_index == 2
    assert [t.rollout_index for t in tasks[1:3]] == [1, 2]


def test_limit_stops_reading_at_the_limit(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", [row("a"), row("b"), row("c"), "{this line is garbage"])

    tasks = NeMoGymTaskset(jsonl_path=path, agent="a", limit=3)

    assert [t.prompt[0]["content"] for t in tasks] == ["a", "b", "c"]


def test_shuffle_is_deterministic_for_a_seed(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", [row(str(i)) for i in range(50)])

    def order(**kwargs: Any) -> list[str]:
        return [t.example_id for t in NeMoGymTaskset(jsonl_path=path, agent="a", shuffle=True, **kwargs)]

    assert order(seed=1) == order(seed=1)
    assert order(seed=1) != order(seed=2)
    assert sorted(order(seed=1), key=int) == [str(i) for i in range(50)]
    assert [t.task_index for t in NeMoGymTaskset(jsonl_path=path, agent="a", shuffle=True)] == list(range(50))


def test_shuffle_with_limit_samples_from_the_whole_file_deterministically(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", [row(str(i)) for i in range(1000)])

    def sample(seed: int) -> list[str]:
        return [t.example_id for t in NeMoGymTaskset(jsonl_path=path, agent="a", shuffle=True, limit=10, seed=seed)]

    assert sample(3) == sample(3)
    assert len(set(sample(3))) == 10
    assert max(int(i) for i in sample(3)) > 100  # not just the first rows


# ---- Hugging Face datasets


def test_to_dataset_has_prompt_example_id_task_and_info() -> None:
    tasks = taskset("example_multi_step")

    dataset = tasks.to_dataset()

    assert set(dataset.column_names) == {"prompt", "example_id", "task", "info"}
    assert len(dataset) == tasks.num_rows
    first = dataset[0]
    info = json.loads(first["info"])
    assert first["task"] == "example_multi_step"
    assert first["prompt"][0]["role"] == "system"
    assert info["row"] == tasks[0].row
    assert info["agent"] == "example_multi_step_simple_agent"
    assert info["task_index"] == 0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"nemo_env": "example_multi_step"},
        {"nemo_env": "example_multi_step", "recorded": True, "rollouts_per_task": 2},
        {"nemo_env": "circle_click"},
        {"nemo_env": "workplace_assistant", "shuffle": True, "seed": 5, "limit": 3},
    ],
    ids=["plain", "recorded-repeated", "images", "shuffled-limited"],
)
def test_from_dataset_rebuilds_an_equal_taskset(kwargs: dict[str, Any]) -> None:
    tasks = taskset(**kwargs)

    rebuilt = NeMoGymTaskset.from_dataset(tasks.to_dataset())

    assert rebuilt == tasks
    assert list(rebuilt) == list(tasks)
    assert rebuilt.recorded == tasks.recorded


def test_a_recorded_taskset_s_dataset_keeps_the_recordings_as_read_and_rebuilds_them_runnable() -> None:
    tasks = taskset(COUNTER_ENV, recorded=True)

    dataset = tasks.to_dataset()
    rebuilt = NeMoGymTaskset.from_dataset(dataset, root=GYM_ROOT)

    assert [json.loads(info)["row"] for info in dataset["info"]] == [t.recorded_row for t in tasks]
    assert list(rebuilt) == list(tasks) and "initial_count" in rebuilt[0].gym_row()


def test_from_dataset_refuses_rows_without_info() -> None:
    with pytest.raises(ConfigurationError, match="to_dataset"):
        NeMoGymTaskset.from_dataset([{"prompt": []}])


# ---- bad input: one clear error naming file, line and fix


BAD_ROWS = {
    "malformed JSON": ('{"responses_create_params": {"input": [}', "malformed JSON", "complete JSON object"),
    "not an object": ("[1, 2]", "not an object", "one JSON object per line"),
    "no responses_create_params": ({"input": "hi"}, "no 'responses_create_params'", "add"),
    "no input": (
        {"responses_create_params": {"tools": []}},
        "has no 'input'",
        "add responses_create_params.input",
    ),
    "unknown key": (
        {"responses_create_params": {"input": "hi", "max_output_token": 5}},
        "'max_output_token'",
        "did you mean 'max_output_token' -> 'max_output_tokens'?",
    ),
    "openai-only key": (
        {"responses_create_params": {"input": "hi", "prompt_cache_key": "k"}},
        "valid for OpenAI, not in this nemo-gym",
        "remove them",
    ),
    "agent_ref not an object": (row(agent_ref="x"), "not an object with a name", "agent_ref"),
}


@pytest.mark.parametrize(("bad", "problem", "fix"), BAD_ROWS.values(), ids=BAD_ROWS.keys())
def test_a_bad_row_is_one_error_naming_file_line_and_fix(tmp_path: Path, bad: Any, problem: str, fix: str) -> None:
    path = write_jsonl(tmp_path / "tasks.jsonl", [row("ok"), "", bad])

    with pytest.raises(TasksetError) as caught:
        NeMoGymTaskset(jsonl_path=path, agent="a")

    message = str(caught.value)
    assert message.startswith(f"{path}:3: ")
    assert problem in message
    assert "Fix:" in message and fix in message


def test_an_agent_ref_the_environment_does_not_define_is_an_error(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "tasks.jsonl", [row(agent_ref={"name": "someone_else"})])

    with pytest.raises(TasksetError) as caught:
        taskset("example_multi_step", jsonl_path=path)

    message = str(caught.value)
    assert message.startswith(f"{path}:1: ")
    assert "'someone_else' is not an agent of environment 'example_multi_step'" in message
    assert "Fix: use one of its agents (example_multi_step_simple_agent)" in message


def test_rows_without_agent_ref_need_an_agent(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "tasks.jsonl", [row()])

    with pytest.raises(TasksetError, match=r"tasks.jsonl:1: the row has no agent_ref .*Fix: .*agent="):
        NeMoGymTaskset(jsonl_path=path)


def test_rows_take_the_agent_argument_or_their_own_agent_ref(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "tasks.jsonl", [row(), row(agent_ref={"name": "example_multi_step_simple_agent"})])

    tasks = taskset("example_multi_step", jsonl_path=path, agent="example_multi_step_simple_agent")

    assert [t.agent_name for t in tasks] == ["example_multi_step_simple_agent"] * 2
    assert tasks.env_name == "example_multi_step"


def test_an_agent_argument_the_environment_does_not_define_is_an_error() -> None:
    with pytest.raises(ConfigurationError, match="example_multi_step_simple_agent"):
        taskset("example_multi_step", agent="nobody")


def test_an_empty_file_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("\n  \n")

    with pytest.raises(TasksetError) as caught:
        NeMoGymTaskset(jsonl_path=path, agent="a")

    assert str(caught.value).startswith(f"{path}: the file is empty")
    assert "Fix:" in str(caught.value)


def test_a_missing_file_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "nope.jsonl"

    with pytest.raises(TasksetError) as caught:
        NeMoGymTaskset(jsonl_path=path, agent="a")

    assert str(caught.value).startswith(f"{path}: no such file")
    assert "Fix:" in str(caught.value)


def test_recorded_rows_must_carry_response_and_reward(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "rollouts.jsonl", [row(response={}, reward=1.0), row(reward=0.0)])

    with pytest.raises(TasksetError, match=r"rollouts.jsonl:2: the row has no recorded 'response'.*Fix:"):
        NeMoGymTaskset(jsonl_path=path, agent="a", recorded=True)


def test_skip_leaves_bad_rows_out_counts_them_and_warns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = write_jsonl(tmp_path / "tasks.jsonl", [row("a"), "garbage", {"x": 1}, row("b")])

    with caplog.at_level(logging.WARNING, logger="verifiers_nemo"):
        tasks = NeMoGymTaskset(jsonl_path=path, agent="a", on_error="skip")

    assert [t.prompt[0]["content"] for t in tasks] == ["a", "b"]
    assert tasks.skipped.count == 2
    assert tasks.skipped.reasons[0].startswith("line 2: malformed JSON")
    assert tasks.skipped.reasons[1].startswith("line 3: the row has no 'responses_create_params'")
    assert "skipped 2 bad row(s)" in caplog.text
    assert not NeMoGymTaskset(jsonl_path=path, agent="a", limit=1).skipped
    assert NeMoGymTaskset(jsonl_path=path, agent="a", limit=1).skipped == SkippedRows()


def test_skip_with_nothing_left_is_an_error(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "tasks.jsonl", ["garbage", "[]"])

    with pytest.raises(TasksetError, match="no usable rows, all 2 were skipped"):
        NeMoGymTaskset(jsonl_path=path, agent="a", on_error="skip")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "nemo_env= .* or jsonl_path="),
        ({"dataset": "example"}, "pass nemo_env= too"),
        ({"nemo_env": "example_multi_step", "dataset": "example", "recorded": True}, "one source"),
        ({"jsonl_path": "x.jsonl", "limit": 0}, "limit must be a positive integer"),
        ({"jsonl_path": "x.jsonl", "rollouts_per_task": 0}, "rollouts_per_task must be a positive integer"),
        ({"jsonl_path": "x.jsonl", "on_error": "ignore"}, "on_error must be"),
    ],
)
def test_contradictory_or_invalid_arguments_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        NeMoGymTaskset(root=GYM_ROOT, **kwargs)


def test_environment_without_an_agent_explains_there_is_nothing_to_load() -> None:
    environment = get_environment("gdpval", root=GYM_ROOT)

    for kwargs in ({}, {"recorded": True}):
        with pytest.raises(TasksetError, match="defines no agent") as caught:
            taskset("gdpval", **kwargs)
        assert str(environment.directory) in str(caught.value)


# ---- which nemo-gym release's rows: the Gym runtime named once, as the harness finds its own

ENV_OF_TWO_RELEASES = "example_single_tool_call"


@pytest.fixture
def other_release(tmp_path: Path) -> tuple[str, Path]:
    """A second Gym runtime (interpreter, root) whose packaged recordings of one environment differ from the
    installed release's, as 0.7.0's do from 0.4.0's: an interpreter (this one, run with another root first on its
    path) that finds a nemo-gym 0.7.0 there. No stack: only the files a taskset reads."""
    root = tmp_path / "site-packages"
    (root / "nemo_gym").mkdir(parents=True)
    (root / "nemo_gym" / "__init__.py").write_text("")
    shutil.copy(GYM_ROOT / "nemo_gym" / "openai_utils.py", root / "nemo_gym" / "openai_utils.py")
    (root / "nemo_gym-0.7.0.dist-info").mkdir()
    (root / "nemo_gym-0.7.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: nemo-gym\nVersion: 0.7.0\n"
    )
    source = GYM_ROOT / "resources_servers" / ENV_OF_TWO_RELEASES
    target = root / "resources_servers" / ENV_OF_TWO_RELEASES
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(GYM_ROOT / "responses_api_agents" / "simple_agent", root / "responses_api_agents" / "simple_agent")
    recordings = [json.loads(line) for line in (source / "data" / "example_rollouts.jsonl").open()]
    for recording in recordings[:2]:
        recording["reward"] = 1.0 - recording["reward"]  # 0.7.0 records 0.0 where 0.4.0 has 1.0 (rows 0 and 1)
    write_jsonl(target / "data" / "example_rollouts.jsonl", recordings[:4])
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{root}" exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    return str(python), root.resolve()


def rewards(tasks: NeMoGymTaskset) -> list[float | None]:
    return [task.recorded_reward for task in tasks]


def test_a_taskset_reads_the_packaged_rows_of_the_gym_runtime_it_names(other_release: tuple[str, Path]) -> None:
    python, root = other_release
    installed = NeMoGymTaskset(ENV_OF_TWO_RELEASES, recorded=True)
    named = NeMoGymTaskset(ENV_OF_TWO_RELEASES, recorded=True, gym_python=python)

    assert rewards(named) != rewards(installed)[:4] and len(named) == 4
    assert named.gym_root == root and named.env is not None and named.env.root == root
    assert all(task.source.startswith(str(root)) for task in named)
    assert installed.gym_root == GYM_ROOT.resolve() and named.gym_python == python
    rebuilt = NeMoGymTaskset.from_dataset(named.to_dataset(), gym_python=python)
    assert rebuilt.gym_root == root and rebuilt.env is not None and rebuilt.env.root == root


def test_the_gym_runtime_variable_counts_when_set_after_a_first_taskset(
    other_release: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    python, root = other_release
    monkeypatch.delenv("VERIFIERS_NEMO_GYM_PYTHON", raising=False)
    before = NeMoGymTaskset(ENV_OF_TWO_RELEASES, recorded=True)  # this interpreter's nemo-gym

    monkeypatch.setenv("VERIFIERS_NEMO_GYM_PYTHON", python)  # as a notebook sets it after a first cell
    after = NeMoGymTaskset(ENV_OF_TWO_RELEASES, recorded=True)

    assert before.gym_root == GYM_ROOT.resolve() and after.gym_root == root and len(after) == 4


def test_a_harness_given_the_taskset_runs_the_tasksets_gym_runtime(other_release: tuple[str, Path]) -> None:
    """Named once: the harness takes the taskset's runtime (nothing starts)."""
    from verifiers_nemo import NeMoGymHarness

    python, root = other_release
    for kwargs in ({"gym_python": python}, {"gym_version": "0.4"}, {}):
        tasks = NeMoGymTaskset(ENV_OF_TWO_RELEASES, recorded=True, **kwargs)
        harness = NeMoGymHarness(taskset=tasks)
        assert (harness.options.gym_python, harness.options.gym_version) == (tasks.gym_python, tasks.gym_version)
        assert harness.options.root().resolve() == tasks.gym_root, kwargs
    assert NeMoGymHarness(taskset=NeMoGymTaskset(ENV_OF_TWO_RELEASES, gym_python=python)).options.root() == root


def test_a_harness_naming_another_release_than_its_tasksets_is_refused(other_release: tuple[str, Path]) -> None:
    """The defect this guards: a 0.7 harness given 0.4's recorded rows reproduced 3 of 5 rewards, silently."""
    from verifiers_nemo import NeMoGymHarness

    python, root = other_release
    with pytest.raises(ConfigurationError, match=r"0\.4\.0.*0\.7\.0.*Name the Gym runtime once"):
        NeMoGymHarness(taskset=NeMoGymTaskset(ENV_OF_TWO_RELEASES, recorded=True), gym_python=python)
    with pytest.raises(ConfigurationError, match=r"0\.7\.0.*0\.4\.0"):
        NeMoGymHarness(taskset=NeMoGymTaskset(ENV_OF_TWO_RELEASES, gym_python=python), gym_python=sys.executable)
    same = NeMoGymHarness(taskset=NeMoGymTaskset(ENV_OF_TWO_RELEASES, gym_python=python), gym_python=python)
    assert same.options.root() == root


def test_load_environment_reads_the_rows_of_the_runtime_its_harness_runs(other_release: tuple[str, Path]) -> None:
    from verifiers_nemo import load_environment

    python, root = other_release
    env = load_environment(ENV_OF_TWO_RELEASES, recorded=True, gym_python=python)

    assert env.taskset.gym_root == root and rewards(env.taskset) == rewards(
        NeMoGymTaskset(ENV_OF_TWO_RELEASES, recorded=True, gym_python=python)
    )
    assert env.harness.options.gym_python == python and env.harness.options.root() == root


def test_root_and_a_gym_runtime_together_are_refused(other_release: tuple[str, Path]) -> None:
    python, _ = other_release
    with pytest.raises(ConfigurationError, match="not both"):
        NeMoGymTaskset(ENV_OF_TWO_RELEASES, root=GYM_ROOT, gym_python=python)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_load_environment_names_its_own_argument_when_rollouts_per_example_is_bad(bad: object) -> None:
    from verifiers_nemo import load_environment

    with pytest.raises(ConfigurationError, match=r"^rollouts_per_example must be a positive integer, not "):
        load_environment(ENV_OF_TWO_RELEASES, rollouts_per_example=bad)  # type: ignore[arg-type]
