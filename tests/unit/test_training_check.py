"""The training check's pure parts: a recording as the turns a model sampled, where a rollout's samples fork and
why, the per-environment tally and summary lines, and the flags that turn it on (``eval --client-type train``).
The parts that need verifiers, renderers and a real tokenizer run end to end in tests/e2e/test_training_check.py."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

import pytest

from verifiers_nemo._cli import build_parser
from verifiers_nemo._cli.settings import new_settings
from verifiers_nemo._eval.report import format_summary
from verifiers_nemo._eval.training import TrainingTally
from verifiers_nemo._exceptions import ConfigurationError
from verifiers_nemo._replay.recordings import Recording
from verifiers_nemo._training import RendererSpec, verifiers_env_config
from verifiers_nemo._training.forks import USER_TURN_HINT, first_fork, message_changes
from verifiers_nemo._training.turns import assistant_message, recorded_turns

CALL = {"type": "function_call", "call_id": "c1", "name": "add", "arguments": '{"n": 1}'}
RESULT = {"type": "function_call_output", "call_id": "c1", "output": "1"}
THINK = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "I add one."}]}
ANSWER = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done: 1"}]}


# -- a recording as model turns ----------------------------------------------------------------------------------


def test_a_recording_is_one_assistant_message_per_model_call() -> None:
    recording = Recording(input=[{"role": "user", "content": "add 1"}], output=[THINK, CALL, RESULT, ANSWER])

    turns = recorded_turns(recording)

    assert [t.message for t in turns] == [
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "I add one.",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"n": 1}'}}],
        },
        {"role": "assistant", "content": "Done: 1"},
    ]
    assert [t.cut for t in turns] == [False, False]


def test_a_recording_that_ran_out_of_tokens_ends_in_a_cut_turn() -> None:
    recording = Recording(input=[], output=[CALL, RESULT, ANSWER], incomplete_details={"reason": "max_output_tokens"})

    assert [t.cut for t in recorded_turns(recording)] == [False, True]


def test_parallel_calls_and_text_after_reasoning_are_one_turn() -> None:
    second = {**CALL, "call_id": "c2", "arguments": '{"n": 2}'}

    message = assistant_message([ANSWER, THINK, CALL, second])

    assert message["content"] == "Done: 1"
    assert message["reasoning_content"] == "I add one."
    assert [c["id"] for c in message["tool_calls"]] == ["c1", "c2"]


# -- forks ----------------------------------------------------------------------------------------------------------


@dataclass
class Node:
    """What first_fork reads of a verifiers message node."""

    message: dict[str, Any]
    token_ids: list[int]
    sampled: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def _conversation() -> tuple[Node, Node, Node]:
    system = Node({"role": "system", "content": "be brief"}, [1, 2, 3])
    user = Node({"role": "user", "content": "add 1"}, [4, 5])
    sampled = Node({"role": "assistant", "content": "", "reasoning_content": "r", "tool_calls": []}, [6, 7, 8, 9], True)
    return system, user, sampled


def test_a_rollout_with_one_path_has_no_fork() -> None:
    system, user, sampled = _conversation()

    assert first_fork([[system, user, sampled]]) is None


def test_the_same_message_with_other_tokens_is_a_retokenized_fork_at_the_first_differing_token() -> None:
    system, user, sampled = _conversation()
    tool = Node({"role": "tool", "content": "1", "tool_call_id": "c1"}, [10])
    restated = Node(dict(sampled.message), [6, 7, 99, 9])
    second = Node({"role": "assistant", "content": "Done"}, [11, 12], True)

    fork = first_fork([[system, user, sampled], [system, user, restated, tool, second]], decode=str)

    assert fork is not None
    assert (fork["turn"], fork["message"], fork["role"], fork["cause"]) == (2, 2, "assistant", "retokenized")
    assert fork["token"] == 3 + 2 + 2  # system, user, then the two tokens the re-render kept
    assert fork["sampled"] == str([1, 2, 3, 4, 5, 6, 7, 8, 9])  # up to 12 tokens each side of the fork
    assert fork["rendered"] == str([1, 2, 3, 4, 5, 6, 7, 99, 9, 10, 11, 12])
    assert USER_TURN_HINT not in fork["detail"]


def test_a_fork_at_a_new_user_turn_names_the_renderer_setting_that_continues_it() -> None:
    system, user, sampled = _conversation()
    restated = Node(dict(sampled.message), [6, 9])
    observation = Node({"role": "user", "content": "next"}, [13])
    second = Node({"role": "assistant", "content": "ok"}, [14], True)

    fork = first_fork([[system, user, sampled], [system, user, restated, observation, second]])

    assert fork is not None and fork["detail"].endswith(USER_TURN_HINT)
    assert '"thinking_retention": "all"' in fork["detail"]


def test_an_agent_that_sends_a_turn_back_changed_is_a_restated_fork_naming_the_change() -> None:
    system, user, sampled = _conversation()
    without_reasoning = Node({**sampled.message, "reasoning_content": None}, [6, 8, 9])
    second = Node({"role": "assistant", "content": "Done"}, [11], True)

    fork = first_fork([[system, user, sampled], [system, user, without_reasoning, second]])

    assert fork is not None and fork["cause"] == "restated"
    assert fork["detail"] == 'reasoning_content dropped ("r")'


@pytest.mark.parametrize(
    ("after", "change"),
    [
        ({"role": "user", "content": "x"}, "role assistant became user"),
        ({"role": "assistant", "content": "y"}, 'content "x" became "y"'),
        ({"role": "assistant", "content": "x", "reasoning_content": "why"}, 'reasoning_content added ("why")'),
        (
            {"role": "assistant", "content": "x", "tool_calls": [{"id": "c", "name": "f", "arguments": "{}"}]},
            'tool calls [] became [["c", "f", "{}"]]',
        ),
    ],
    ids=["role", "content", "reasoning", "tool-calls"],
)
def test_message_changes_are_said_field_by_field(after: dict[str, Any], change: str) -> None:
    assert message_changes({"role": "assistant", "content": "x"}, after) == [change]


def test_tool_call_arguments_that_differ_only_in_spacing_are_no_change() -> None:
    call = {"id": "c", "name": "f", "arguments": '{"a": 1, "b": 2}'}
    respaced = {**call, "arguments": '{"b":2,"a":1}'}

    assert (
        message_changes({"role": "assistant", "tool_calls": [call]}, {"role": "assistant", "tool_calls": [respaced]})
        == []
    )


# -- the tally and the summary ------------------------------------------------------------------------------------


def _record(env: str, task: int, branches: int, fork: dict[str, Any] | None = None, **more: Any) -> dict[str, Any]:
    training: dict[str, Any] = {"branches": branches, "samples": branches, "turns": 3, "tokens": 100, "loss_tokens": 25}
    if fork:
        training["fork"] = fork
    training.update(more)
    return {"env": env, "task_index": task, "rollout_index": 0, "training": training}


FORK = {"turn": 2, "message": 3, "role": "assistant", "token": 120, "cause": "retokenized", "detail": "again",
        "sampled": "<think>", "rendered": "Done"}  # fmt: skip


def test_the_tally_counts_samples_forks_and_unfaithful_turns_per_environment() -> None:
    tally = TrainingTally()
    for record in (
        _record("a", 0, 1),
        _record("a", 1, 1),
        _record("b", 2, 3, FORK),
        _record("b", 3, 1, replay_unfaithful=["turn 1: content reads back as ..."]),
        {"env": "b", "task_index": 4, "rollout_index": 0},  # a record of the eval client: no training figures
    ):
        tally.add(record)

    summary = tally.summary()

    assert summary is not None
    a, b = summary["by_env"]["a"], summary["by_env"]["b"]
    assert (a["rollouts"], a["samples_per_rollout"], a["one_sample"], a["forked"]) == (2, 1.0, 2, 0)
    assert (b["rollouts"], b["samples_per_rollout"], b["one_sample"], b["forked"]) == (2, 2.0, 1, 1)
    assert b["fork_causes"] == {"retokenized assistant": 1}
    assert b["fork_examples"] == [{"task_index": 2, **FORK}]
    assert b["replay_unfaithful"] == 1
    assert summary["overall"]["loss_token_share"] == 0.25
    assert TrainingTally().summary() is None


def test_the_summary_says_per_environment_samples_forks_and_where_the_first_fork_is() -> None:
    tally = TrainingTally()
    tally.add(_record("counter", 0, 1))
    tally.add(_record("game", 1, 2, FORK))
    failed = {**_record("game", 2, 0), "error": {"type": "upstream_http", "message": "the renderer cannot carry it"}}
    tally.add(failed)
    metadata = _metadata(tally.summary())
    env = {"rollouts": {"total": 1}, "reward": {"avg": 1.0}, "pass_at_k": {}, "errors_by_type": {}}
    metadata["summary"]["by_env"] = {
        "counter": {**env, "replay": {"compared": 1, "reproduced": 1, "mismatches": []}},
        "game": {**env, "replay": {"compared": 2, "reproduced": 1, "mismatches": []}},
    }

    text = format_summary(metadata)

    assert "Training     verifiers' training client · renderer qwen3 (Qwen/Qwen3-8B)" in text
    assert "counter: 1.00 samples/rollout · 1/1 one sample · 0 forked · 1/1 reproduced" in text
    assert "game: 1.00 samples/rollout · 0/2 one sample · 1 forked (50%) · 1/2 reproduced · 1 failed" in text
    assert "failed upstream_http x1, e.g.: the renderer cannot carry it" in text
    assert "first fork, e.g. task 1: turn 2, message 3 (assistant), token 120: retokenized: again" in text
    assert "sampled '<think>' · rendered again 'Done'" in text


def _metadata(training: dict[str, Any] | None) -> dict[str, Any]:
    rollouts = {"total": 2, "scored": 2, "errored": 0, "examples": 2}
    summary = {
        "rollouts": rollouts, "reward": dict.fromkeys(("avg", "std", "min", "max"), 1.0),
        "reward_by_rollout_index": [1.0],
        "pass_at_k": {}, "metrics": {}, "errors_by_type": {}, "usage": {}, "latency": {"mean_rollout_s": 1.0},
        "timing": {"wall_s": 1.0}, "training": training,
    }  # fmt: skip
    settings = {"policy": "replay", "rollouts_per_example": 1, "renderer": "qwen3", "renderer_model": "Qwen/Qwen3-8B"}
    return {"env": "counter,game", "model": "replay", "settings": settings, "counts": {"expected": 2, "missing": 0},
            "summary": summary}  # fmt: skip


# -- the flags ------------------------------------------------------------------------------------------------------


def _settings(*argv: str) -> Any:
    args: argparse.Namespace = build_parser().parse_args(["eval", *argv])
    return new_settings(args)


def test_the_training_client_flags_set_the_run_settings() -> None:
    settings = _settings(
        "example_multi_step", "--client-type", "train", "--renderer", "qwen3", "--renderer-model", "/models/qwen3",
        "--renderer-config", '{"thinking_retention": "all"}',
    )  # fmt: skip

    assert (settings.client_type, settings.renderer, settings.renderer_model) == ("train", "qwen3", "/models/qwen3")
    assert settings.renderer_config == {"thinking_retention": "all"}
    assert settings.api == "chat"  # the training client speaks Chat Completions


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--renderer", "qwen3"), "--renderer sets the training client's renderer: add --client-type train"),
        (("--client-type", "train"), "needs --renderer-model NAME_OR_DIR"),
        (("--client-type", "train", "--renderer-model", "d", "--ray"), "does not take --ray"),
        (("--client-type", "train", "--renderer-model", "d", "--api", "responses"), "drop --api responses"),
        (
            ("--client-type", "train", "-b", "http://127.0.0.1:8000/v1", "-m", "m", "--exact-tokens"),
            "does not take --exact-tokens",
        ),
        (("--client-type", "train", "-b", "http://127.0.0.1:8000/v1", "-m", "m", "--return-tokens"), "--return-tokens"),
        (("--generate-shape", "vllm-0.33"), "--generate-shape sets the training client's reply shape"),
        (
            ("--client-type", "train", "-b", "http://127.0.0.1:8000/v1", "-m", "m", "--generate-shape", "vllm-0.33"),
            "an engine at -b answers in its own",
        ),
    ],
    ids=[
        "renderer-alone",
        "replay-without-tokenizer",
        "ray",
        "responses",
        "exact-tokens",
        "return-tokens",
        "shape-alone",
        "shape-of-a-real-engine",
    ],
)
def test_training_client_flags_that_cannot_go_together_are_refused_naming_the_fix(
    argv: tuple[str, ...], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _settings("example_multi_step", *argv)


def test_a_real_engine_needs_no_renderer_model_its_model_names_the_tokenizer() -> None:
    settings = _settings(
        "example_multi_step", "--client-type", "train", "-b", "http://127.0.0.1:8000/v1", "-m", "Qwen/Qwen3-8B"
    )

    assert settings.policy == "endpoint" and settings.renderer_model is None


# -- verifiers' side of the config ----------------------------------------------------------------------------------


def test_renderer_names_become_verifiers_renderer_tables() -> None:
    assert RendererSpec("qwen3", "/m").client_fields() == {"renderer": {"name": "qwen3"}, "renderer_model_name": "/m"}
    assert RendererSpec("qwen3.5").as_config() == {"name": "qwen3.5"}
    custom = RendererSpec("docs/examples/hermes_chatml_renderer.py:HermesChatMLRenderer", config={"bridge": False})
    table = custom.as_config()
    assert table["name"] == "custom" and table["bridge"] is False
    assert table["import_path"].startswith("/") and table["import_path"].endswith(".py:HermesChatMLRenderer")
    assert RendererSpec("my_pkg.renderers.MyRenderer").as_config()["import_path"] == "my_pkg.renderers.MyRenderer"


def test_an_eval_environment_becomes_the_env_config_a_prime_rl_source_writes() -> None:
    judge = {"*": {"base_url": "http://127.0.0.1:8001/v1", "model": "judge", "api": "chat", "api_key_var": "J"}}

    config = verifiers_env_config("simpleqa", {"max_steps": 4, "gym_python": "/gym/python"}, recorded=True,
                                  timeout=60.0, judges=judge)  # fmt: skip

    assert config == {
        "taskset": {"id": "nemo-gym-env", "nemo_env": "simpleqa", "recorded": True, "gym_python": "/gym/python"},
        "agent": {
            "harness": {
                "id": "nemo-gym-env", "timeout": 60.0, "max_steps": 4, "judge_base_url": "http://127.0.0.1:8001/v1",
                "judge_model": "judge", "judge_api": "chat", "judge_api_key_var": "J",
            }
        },
    }  # fmt: skip
    with pytest.raises(ConfigurationError, match="one judge for every judge name"):
        verifiers_env_config("x", {}, recorded=False, timeout=1.0, judges={"genrm_model": judge["*"]})


def test_rollouts_a_text_renderer_cannot_carry_are_said_as_such_not_as_failures() -> None:
    from verifiers_nemo._upstreams.refusals import IMAGES_REFUSAL

    tally = TrainingTally()
    message = f"http://127.0.0.1:1/v1/chat/completions refused the request (HTTP 502): {IMAGES_REFUSAL.describe()}"
    tally.add({**_record("vision", 0, 0), "error": {"type": "upstream_http", "message": message}})
    summary = tally.summary()
    assert summary is not None

    vision = summary["by_env"]["vision"]
    assert vision["not_carried"] == {"images": 1} and "failed" not in vision
    text = format_summary(_metadata(summary))
    assert "vision: 0.00 samples/rollout · 0/1 one sample · 0 forked · 1 not carried (images: a text renderer" in text


# -- where a training client's call stands in its recording (the replay engine) -----------------------------


def test_a_call_continuing_an_earlier_prompt_gets_the_turn_after_it_and_a_fresh_context_the_first() -> None:
    """Each generate request carries its prompt's token IDs: a call whose prompt continues an earlier one's (a
    multi-turn agent) is the next turn; a call on a context of its own (langgraph's planners and workers call the
    model on fresh message lists) is answered with the first turn, as the eval's replay answers it; the same prompt
    sent again gets the same turn."""
    from verifiers_nemo._training.engine import RolloutNotes

    notes = RolloutNotes()
    assert notes.turn_for([1, 2, 3]) == 0
    assert notes.turn_for([1, 2, 3, 9, 9, 4]) == 1  # the first prompt, its completion, a tool result, a header
    assert notes.turn_for([1, 2, 3, 9, 9, 4, 8, 5]) == 2
    assert notes.turn_for([7, 7]) == 0  # a context of its own
    assert notes.turn_for([1, 2, 3, 9, 9, 4]) == 1  # sent again
    assert notes.turn_for([1, 2, 3, 6]) == 1  # a branch after the first turn (a re-rendered history) continues it
    assert RolloutNotes().turn_for(None) == 0 and RolloutNotes(calls=3).turn_for(None) == 3  # no token IDs: in order
