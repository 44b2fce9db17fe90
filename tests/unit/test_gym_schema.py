"""The policy-reply contract: what we hand a Gym agent is what nemo-gym 0.4.0 accepts, whatever
openai is installed here. Tests marked ``needs_nemo_gym`` compare with nemo-gym's own
``NeMoGymResponse`` and run where nemo-gym is importable (the project's .venv); the others run
everywhere, with any openai."""

from __future__ import annotations

import copy
import importlib
import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.unit.saved_vllm import load
from verifiers_nemo._protocol import finish_response, incomplete_response, prepare_responses_reply
from verifiers_nemo._protocol.gym_schema import GymSchemaError, drop_uncarried_fields, validate_policy_reply
from verifiers_nemo._upstreams import chat_to_responses_reply

try:
    _gym = importlib.import_module("nemo_gym.openai_utils")
except ImportError:  # another interpreter holds nemo-gym; the agreement tests cannot run here
    _gym = None
needs_nemo_gym = pytest.mark.skipif(_gym is None, reason="compares with nemo-gym's own schema; needs nemo_gym")


def ours_accepts(reply: Any) -> bool:
    try:
        validate_policy_reply(copy.deepcopy(reply))
    except GymSchemaError:
        return False
    return True


def gym_accepts(reply: Any) -> bool:
    from pydantic import ValidationError

    assert _gym is not None
    try:
        _gym.NeMoGymResponse.model_validate(copy.deepcopy(reply))
    except ValidationError:
        return False
    return True


def gym_carries(reply: dict[str, Any]) -> None:
    """What nemo-gym 0.4.0's simple agent does with a policy reply: validate it, append its output
    to the next request's input and send that (``model_dump(exclude_unset=True)`` + orjson)."""
    import orjson

    assert _gym is not None
    response = _gym.NeMoGymResponse.model_validate(copy.deepcopy(reply))
    body = _gym.NeMoGymResponseCreateParamsNonStreaming(input=[{"role": "user", "content": "hi"}])
    next_body = body.model_copy(update={"input": body.input + list(response.output)})
    orjson.dumps(next_body.model_dump(exclude_unset=True))
    orjson.dumps(response.model_dump(exclude_unset=True))


# -- replies ---------------------------------------------------------------------------------

REQUEST = load("resp_req.json")


def prepared(name: str) -> dict[str, Any]:
    """A saved vLLM Responses reply as the passthrough hands it to Gym."""
    data = load(name)
    prepare_responses_reply(data)
    return finish_response(data, REQUEST)


def converted(name: str) -> dict[str, Any]:
    """A saved vLLM Chat Completion as the conversion hands it to Gym."""
    return chat_to_responses_reply(load(name), REQUEST).response


def rich_reply() -> dict[str, Any]:
    """A reply using the less common parts of the schema."""
    return {
        "id": "resp_1",
        "created_at": 1700000000,
        "object": "response",
        "model": "m",
        "status": "completed",
        "output": [
            {"id": "rs_1", "type": "reasoning", "summary": [{"type": "summary_text", "text": "hm"}]},
            {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [
                    {
                        "type": "output_text",
                        "text": "see",
                        "annotations": [
                            {"type": "url_citation", "url": "https://x", "title": "x", "start_index": 0, "end_index": 3}
                        ],
                    },
                    {"type": "refusal", "refusal": "no"},
                ],
            },
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        ],
        "parallel_tool_calls": False,
        "tool_choice": {"type": "function", "name": "f"},
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": True}],
        "text": {"format": {"type": "json_schema", "name": "a", "schema": {"type": "object"}}},
        "reasoning": {"effort": "low"},
        "metadata": {"row": "1"},
        "incomplete_details": None,
        "usage": {
            "input_tokens": 3,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 2},
            "output_tokens": 1,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 4,
        },
    }


GOOD: dict[str, Any] = {
    "vllm-responses": lambda: prepared("responses.json"),
    "vllm-responses-token-messages": lambda: prepared("responses_msgs.json"),
    "vllm-responses-tool-call": lambda: prepared("responses_toolcall.json"),
    "vllm-responses-raw-with-logprobs": lambda: load("responses_msgs.json"),
    "vllm-chat": lambda: converted("chat.json"),
    "vllm-chat-tool-call-with-training-fields": lambda: converted("chat_toolcall.json"),
    "vllm-chat-length-mid-tool-call": lambda: converted("chat_required.json"),
    "context-overflow": lambda: incomplete_response(REQUEST),
    "rich": rich_reply,
}


def _set(path: tuple[Any, ...], value: Any) -> Any:
    def mutate(reply: dict[str, Any]) -> dict[str, Any]:
        target: Any = reply
        for key in path[:-1]:
            target = target[key]
        if value is _DELETE:
            del target[path[-1]]
        else:
            target[path[-1]] = value
        return reply

    return mutate


_DELETE = object()
BAD: dict[str, Any] = {
    "no-id": _set(("id",), _DELETE),
    "created-at-text": _set(("created_at",), "soon"),
    "chat-object": _set(("object",), "chat.completion"),
    "no-output": _set(("output",), _DELETE),
    "no-parallel-tool-calls": _set(("parallel_tool_calls",), _DELETE),
    "no-tools": _set(("tools",), _DELETE),
    "tool-choice-word": _set(("tool_choice",), "sometimes"),
    "tool-choice-without-name": _set(("tool_choice",), {"type": "function"}),
    "tool-without-name": _set(("tools",), [{"type": "function"}]),
    "unknown-tool": _set(("tools",), [{"type": "calculator"}]),
    "status-word": _set(("status",), "done"),
    "incomplete-reason": _set(("incomplete_details",), {"reason": "timeout"}),
    "metadata-number": _set(("metadata",), {"row": 1}),
    "json-schema-without-schema": _set(("text",), {"format": {"type": "json_schema", "name": "a"}}),
    "reasoning-effort": _set(("reasoning",), {"effort": "extreme"}),
    "error-code": _set(("error",), {"code": "oops", "message": "x"}),
    "web-search-item": _set(("output", 2), {"type": "web_search_call", "id": "w", "status": "completed"}),
    "message-without-id": _set(("output", 1, "id"), _DELETE),
    "text-without-annotations": _set(("output", 1, "content", 0, "annotations"), _DELETE),
    "text-not-a-string": _set(("output", 1, "content", 0, "text"), None),
    "function-arguments-object": _set(("output", 2, "arguments"), {"x": 1}),
    "function-without-call-id": _set(("output", 2, "call_id"), _DELETE),
    "reasoning-summary-text": _set(("output", 0, "summary"), "hm"),
    "usage-without-details": _set(("usage", "input_tokens_details"), _DELETE),
    "usage-null-reasoning-tokens": _set(("usage", "output_tokens_details", "reasoning_tokens"), None),
}


@pytest.mark.parametrize("name", GOOD)
def test_replies_we_build_pass_the_gym_schema_with_any_openai(name: str) -> None:
    validate_policy_reply(GOOD[name]())


def test_usage_without_cache_write_tokens_is_what_gym_accepts() -> None:
    reply = converted("chat.json")

    validate_policy_reply(reply)

    assert reply["usage"]["input_tokens_details"] == {"cached_tokens": 0}  # no cache_write_tokens


@pytest.mark.parametrize("name", BAD)
def test_broken_replies_are_refused_with_the_field_named(name: str) -> None:
    reply = BAD[name](rich_reply())

    with pytest.raises(GymSchemaError) as info:
        validate_policy_reply(reply)

    assert info.value.summary


def test_drop_uncarried_fields_removes_only_output_text_logprobs() -> None:
    reply = load("responses_msgs.json")
    before = json.loads(json.dumps(reply))

    drop_uncarried_fields(reply)

    part = reply["output"][0]["content"][0]
    assert "logprobs" not in part and part["text"] == before["output"][0]["content"][0]["text"]
    del before["output"][0]["content"][0]["logprobs"]
    assert reply == before


# -- agreement with nemo-gym ----------------------------------------------------------------


@needs_nemo_gym
@pytest.mark.parametrize("name", GOOD)
def test_nemo_gym_accepts_what_we_accept(name: str) -> None:
    reply = GOOD[name]()

    assert (ours_accepts(reply), gym_accepts(reply)) == (True, True)


@needs_nemo_gym
@pytest.mark.parametrize("name", BAD)
def test_nemo_gym_refuses_what_we_refuse(name: str) -> None:
    reply = BAD[name](rich_reply())

    assert (ours_accepts(reply), gym_accepts(reply)) == (False, False)


@needs_nemo_gym
@pytest.mark.parametrize("name", [n for n in GOOD if n != "vllm-responses-raw-with-logprobs"])
def test_gym_agent_can_carry_every_reply_we_hand_it(name: str) -> None:
    gym_carries(GOOD[name]())


@needs_nemo_gym
def test_gym_agent_cannot_carry_vllm_logprobs_which_is_why_they_are_dropped() -> None:
    reply = load("responses_msgs.json")

    with pytest.raises(TypeError, match="SerializationIterator"):
        gym_carries(reply)
    drop_uncarried_fields(reply)
    gym_carries(reply)


_VALUES = (None, 0, 1.5, "x", "", True, [], {}, [1], ["x"], [{}], {"a": 1}, "auto", "completed")


def _paths(node: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if path:
        yield path
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, (*path, key))
    elif isinstance(node, list):
        for index, value in enumerate(node[:2]):
            yield from _paths(value, (*path, index))


def _mutations(reply: dict[str, Any]) -> Iterator[tuple[tuple[Any, ...], dict[str, Any]]]:
    for path in _paths(reply):
        if "top_logprobs" in path[:-1] or (len(path) > 4 and path[-3] == "logprobs"):
            continue  # deep inside logprob entries: covered by the "logprob entries" rule below
        for value in (_DELETE, *_VALUES):
            yield path, _set(path, value)(copy.deepcopy(reply))


def _documented_stricter(path: tuple[Any, ...]) -> bool:
    """Where ``_gym_schema`` refuses on purpose what nemo-gym's union still accepts (its docstring)."""
    if path == ("instructions",):
        return True  # Gym also takes a list of input items
    if len(path) >= 2 and path[0] == "output":
        rest = path[2:]
        if "logprobs" in rest:
            return True  # Gym validates logprob entries lazily (and then cannot send them)
        if rest in (("type",), ("content",), ("role",)) or rest[-1:] == ("type",):
            return True  # the item or part then parses as an input-style or untyped one in Gym
        if rest and rest[0] in ("prompt_token_ids", "generation_token_ids", "generation_log_probs"):
            return True  # Gym drops malformed training fields silently
    return False


@needs_nemo_gym
@pytest.mark.parametrize(
    "name",
    [
        "vllm-responses-raw-with-logprobs",
        "vllm-responses-tool-call",
        "vllm-chat-tool-call-with-training-fields",
        "rich",
    ],
)
def test_mutated_replies_we_accept_are_accepted_by_nemo_gym(name: str) -> None:
    """Every key of the reply deleted or replaced by values of every JSON type: we never accept what
    Gym refuses, and refuse what Gym accepts only where the schema module says so."""
    lenient, undocumented = [], []
    checked = 0
    for path, mutated in _mutations(GOOD[name]()):
        ours, gym = ours_accepts(mutated), gym_accepts(mutated)
        checked += 1
        if ours and not gym:
            lenient.append(path)
        elif gym and not ours and not _documented_stricter(path):
            undocumented.append(path)

    assert checked > 200
    assert lenient == [], f"accepted what nemo-gym refuses at {sorted(set(lenient))[:10]}"
    assert undocumented == [], f"refused what nemo-gym accepts at {sorted(set(undocumented))[:10]}"


@needs_nemo_gym
def test_every_recorded_model_output_of_the_packaged_environments_passes_both_schemas() -> None:
    """The model outputs of nemo-gym's own recorded rollouts (what the replay policy serves)."""
    from pathlib import Path

    from verifiers_nemo._replay.recordings import written_by_agent

    assert _gym is not None
    recordings = sorted((Path(_gym.__file__).parents[1] / "resources_servers").glob("*/data/example_rollouts.jsonl"))
    refused: list[str] = []
    checked = 0
    for path in recordings:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if not line.lstrip().startswith("{"):
                continue  # blank lines, and the "<PLACEHOLDER ROW>" lines a few packages ship
            output = (json.loads(line).get("response") or {}).get("output") or []
            items = [item for item in output if isinstance(item, dict) and not written_by_agent(item)]
            reply = {
                "id": "resp_1",
                "created_at": 1,
                "object": "response",
                "model": "m",
                "output": items,
                "parallel_tool_calls": True,
                "tool_choice": "auto",
                "tools": [],
            }
            checked += 1
            if not (ours_accepts(reply) and gym_accepts(reply)):
                refused.append(f"{path.parents[1].name}:{number}")

    assert len(recordings) > 50 and checked > 200
    assert refused == []
