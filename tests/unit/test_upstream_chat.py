"""Responses <-> Chat Completions conversion (no server), checked against Gym's own schemas."""

from __future__ import annotations

import importlib
import json
from typing import Any

import pytest

from verifiers_nemo import UpstreamConversionError, UpstreamError
from verifiers_nemo._protocol import finish_response, input_to_messages, responses_to_chat_request
from verifiers_nemo._protocol.gym_schema import validate_policy_reply
from verifiers_nemo._upstreams import chat_to_responses_reply

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        "strict": True,
    },
    {
        "type": "function",
        "name": "get_time",
        "parameters": {"type": "object", "properties": {}},
        "strict": None,
    },
]


def chat_reply(message: dict[str, Any], finish_reason: str = "stop", **extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "real-model",
        "choices": [{"index": 0, "finish_reason": finish_reason, "message": {"role": "assistant", **message}}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17},
        **extra,
    }


def gym_validate(response: dict[str, Any]) -> Any:
    """Check ``response`` against the Gym schema we guarantee (any openai), and against nemo-gym's
    own response model where nemo-gym is installed (returning its parsed model, else ``None``)."""
    validate_policy_reply(response)
    try:
        openai_utils = importlib.import_module("nemo_gym.openai_utils")
    except ImportError:
        return None
    return openai_utils.NeMoGymResponse.model_validate(response)


def gym_request(body: dict[str, Any]) -> None:
    """Check that a test's input is a request nemo-gym can send (where nemo-gym is installed)."""
    try:
        openai_utils = importlib.import_module("nemo_gym.openai_utils")
    except ImportError:
        return
    openai_utils.NeMoGymResponseCreateParamsNonStreaming.model_validate(body)


# -- requests --------------------------------------------------------------------------------


def test_text_request_maps_developer_to_system_and_instructions_first() -> None:
    body = {
        "model": "real-model",
        "instructions": "You are terse.",
        "input": [
            {"role": "developer", "content": "Answer in French."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello"}]},
        ],
        "max_output_tokens": 32,
        "temperature": 0.3,
        "top_logprobs": None,
        "metadata": {"row": "1"},
        "store": False,
    }

    chat = responses_to_chat_request(body)

    assert chat == {
        "model": "real-model",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "system", "content": "Answer in French."},
            {"role": "user", "content": "Hello"},
        ],
        "max_tokens": 32,
        "temperature": 0.3,
    }


def test_string_input_and_unknown_sampling_args_pass_through() -> None:
    chat = responses_to_chat_request(
        {"model": "m", "input": "Hi", "top_k": 20, "return_token_ids": True, "logprobs": True},
        max_tokens_field="max_completion_tokens",
    )

    assert chat["messages"] == [{"role": "user", "content": "Hi"}]
    assert (chat["top_k"], chat["return_token_ids"], chat["logprobs"]) == (20, True, True)


def test_tools_and_tool_choice_convert_to_chat_tools() -> None:
    body = {
        "model": "m",
        "input": "Hi",
        "tools": TOOLS,
        "tool_choice": {"type": "function", "name": "get_time"},
    }
    gym_request(body)

    chat = responses_to_chat_request({**body, "parallel_tool_calls": False})

    assert chat["tools"][0] == {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city.",
            "parameters": TOOLS[0]["parameters"],
            "strict": True,
        },
    }
    assert chat["tools"][1]["function"] == {"name": "get_time", "parameters": TOOLS[1]["parameters"]}
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "get_time"}}
    assert chat["parallel_tool_calls"] is False


def test_tool_choice_without_tools_is_dropped() -> None:
    chat = responses_to_chat_request({"model": "m", "input": "Hi", "tools": [], "tool_choice": "auto"})

    assert "tools" not in chat and "tool_choice" not in chat


def test_multiple_function_calls_group_into_one_assistant_message_with_tool_results() -> None:
    items = [
        {"role": "user", "content": "Weather and time?"},
        {"id": "rs_1", "type": "reasoning", "summary": [{"type": "summary_text", "text": "Need two tools."}]},
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Checking.", "annotations": []}],
        },
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {
            "type": "function_call",
            "call_id": "c2",
            "name": "get_time",
            "arguments": "{}",
            "prompt_token_ids": [1, 2],
            "generation_token_ids": [3],
            "generation_log_probs": [-0.5],
        },
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "c2", "output": "noon"},
        {"role": "assistant", "content": "Done."},
    ]
    gym_request({"input": items})

    messages = input_to_messages(items)

    assert messages == [
        {"role": "user", "content": "Weather and time?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                },
                {"id": "c2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
            ],
            "reasoning_content": "Need two tools.",
            "reasoning": "Need two tools.",
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "noon"},
        {"role": "assistant", "content": "Done."},
    ]


def test_tool_calls_only_turn_has_null_content_and_reasoning_field_is_configurable() -> None:
    items = [
        {"role": "user", "content": "x"},
        {
            "id": "rs",
            "type": "reasoning",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "raw"}],
        },
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
    ]

    [_, assistant] = input_to_messages(items, reasoning_fields=("reasoning_content",))

    assert assistant["content"] is None and assistant["reasoning_content"] == "raw"
    assert "reasoning" not in assistant


def test_new_reasoning_starts_a_new_assistant_turn() -> None:
    items = [
        {"role": "user", "content": "x"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"id": "rs", "type": "reasoning", "summary": [{"type": "summary_text", "text": "again"}]},
        {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{}"},
    ]

    messages = input_to_messages(items)

    assert [len(m.get("tool_calls", [])) for m in messages] == [0, 1, 1]
    assert messages[2]["reasoning_content"] == "again"


def test_images_keep_their_parts() -> None:
    content = [
        {"type": "input_text", "text": "What is this?"},
        {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "low"},
    ]

    [message] = input_to_messages([{"role": "user", "content": content}])

    assert message["content"] == [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}},
    ]


def test_reasoning_effort_and_json_schema_format_convert() -> None:
    body = {
        "model": "m",
        "input": "x",
        "reasoning": {"effort": "low"},
        "text": {"format": {"type": "json_schema", "name": "answer", "schema": {"type": "object"}, "strict": True}},
    }

    chat = responses_to_chat_request(body)

    assert chat["reasoning_effort"] == "low"
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": {"type": "object"}, "strict": True},
    }


@pytest.mark.parametrize(
    "body",
    [
        {"input": [{"type": "web_search_call", "id": "w", "status": "completed"}]},
        {"input": "x", "tools": [{"type": "web_search"}]},
        {"input": "x", "previous_response_id": "resp_1"},
        {"input": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]},
    ],
    ids=["item", "tool", "previous_response_id", "content-part"],
)
def test_requests_chat_cannot_express_are_conversion_errors(body: dict[str, Any]) -> None:
    with pytest.raises(UpstreamError) as info:
        responses_to_chat_request({"model": "m", **body})

    assert isinstance(info.value, UpstreamConversionError)
    assert info.value.kind == "conversion" and info.value.type == "upstream_conversion"


# -- replies ---------------------------------------------------------------------------------


def test_text_reply_becomes_a_gym_valid_response() -> None:
    request = {"model": "real-model", "input": "Hi", "temperature": 0.5, "metadata": {"row": "3"}}

    reply = chat_to_responses_reply(chat_reply({"content": "Hello!"}), request)

    response = reply.response
    gym_validate(response)
    assert response["model"] == "real-model" and response["status"] == "completed"
    assert response["temperature"] == 0.5 and response["metadata"] == {"row": "3"}
    [message] = response["output"]
    assert message["type"] == "message" and message["content"][0]["text"] == "Hello!"
    assert response["usage"] == {
        "input_tokens": 12,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 17,
    }
    assert (response["tool_choice"], response["parallel_tool_calls"], response["tools"]) == ("auto", True, [])


def test_multiple_tool_calls_with_reasoning_become_items_in_order() -> None:
    message = {
        "content": None,
        "reasoning_content": "Two lookups.",
        "tool_calls": [
            {
                "id": "call_a",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
            },
            {"id": "call_b", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
        ],
    }
    request = {"model": "real-model", "input": "x", "tools": TOOLS, "tool_choice": "required"}

    response = chat_to_responses_reply(chat_reply(message, "tool_calls"), request).response

    gym_validate(response)
    assert [item["type"] for item in response["output"]] == ["reasoning", "function_call", "function_call"]
    assert response["output"][0]["summary"] == [{"type": "summary_text", "text": "Two lookups."}]
    calls = response["output"][1:]
    assert [(c["call_id"], c["name"], c["arguments"]) for c in calls] == [
        ("call_a", "get_weather", '{"city":"Oslo"}'),
        ("call_b", "get_time", "{}"),
    ]
    assert response["tools"] == TOOLS and response["tool_choice"] == "required"


def test_round_trip_reply_back_into_request_preserves_the_turn() -> None:
    message = {
        "content": "Let me check.",
        "reasoning": "Think first.",
        "tool_calls": [{"id": "call_a", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
    }
    response = chat_to_responses_reply(chat_reply(message, "tool_calls"), {"model": "m", "input": "x"}).response
    items = [{"role": "user", "content": "x"}, *response["output"]]
    items.append({"type": "function_call_output", "call_id": "call_a", "output": "ok"})

    messages = input_to_messages(items, reasoning_fields=("reasoning",))

    assert messages[1] == {"role": "assistant", **message}
    assert messages[2] == {"role": "tool", "tool_call_id": "call_a", "content": "ok"}


def _call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


@pytest.mark.parametrize(
    "message",
    [
        {"content": None, "tool_calls": [_call("call_0", "increment_counter", '{"count": 1}')]},
        {"content": "I will add both.", "tool_calls": [_call("call_0", "f", "{}"), _call("call_1", "f", '{"a": 2}')]},
        {"content": None, "reasoning_content": "\nNext I add 1.\n", "tool_calls": [_call("call_0", "g", "{}")]},
        {"content": "The count is ready.", "reasoning_content": "All done."},
        {"content": "\n\n  spaced  \n", "tool_calls": [_call("call_0", "g", '{"x": [\n]}')]},
        {"content": ""},
    ],
    ids=["call-only", "text-and-parallel-calls", "thinking-then-call", "thinking-then-answer", "whitespace", "empty"],
)
def test_a_training_client_reply_echoes_back_as_the_message_it_sampled(message: dict[str, Any]) -> None:
    """What verifiers' training client answers (its `serialize_completion`: content None when there is no text,
    `reasoning_content`, call ids `call_0`...) comes back, once the Gym agent sends its output items on with the
    tool results, as the same message: the fields verifiers hashes to match a turn to what was sampled (content,
    None and "" alike; reasoning_content; each call's id, name and arguments; each result's call id)."""
    finish = "tool_calls" if message.get("tool_calls") else "stop"
    response = chat_to_responses_reply(chat_reply(message, finish), {"model": "m", "input": "x"}).response
    gym_validate(response)
    calls = message.get("tool_calls") or []
    items = [{"role": "user", "content": "x"}, *response["output"]]
    for i, call in enumerate(calls):
        items.append({"type": "function_call_output", "call_id": call["id"], "output": f"result {i}"})

    echoed, *results = input_to_messages(items)[1:]

    def hashed(m: dict[str, Any]) -> tuple[Any, ...]:
        tool_calls = [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in m.get("tool_calls") or []]
        return m.get("content") or "", m.get("reasoning_content"), tool_calls

    assert echoed["role"] == "assistant" and hashed(echoed) == hashed(message)
    assert echoed.get("content") == message["content"]  # even None against ""
    assert results == [{"role": "tool", "tool_call_id": c["id"], "content": f"result {i}"} for i, c in enumerate(calls)]


def test_length_finish_reason_makes_the_response_incomplete() -> None:
    response = chat_to_responses_reply(chat_reply({"content": "Once upon"}, "length"), {"model": "m"}).response

    gym_validate(response)
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}


def test_reasoning_only_reply_has_no_empty_message_and_empty_reply_has_one() -> None:
    reasoning_only = chat_to_responses_reply(chat_reply({"content": "", "reasoning_content": "hmm"}), {}).response
    empty = chat_to_responses_reply(chat_reply({"content": None}), {"model": "m"}).response

    assert [i["type"] for i in reasoning_only["output"]] == ["reasoning"]
    assert [i["type"] for i in empty["output"]] == ["message"]
    assert empty["output"][0]["content"][0]["text"] == ""


def test_usage_details_are_carried_when_present() -> None:
    data = chat_reply({"content": "x"})
    data["usage"] |= {
        "prompt_tokens_details": {"cached_tokens": 8},
        "completion_tokens_details": {"reasoning_tokens": 2},
    }

    usage = chat_to_responses_reply(data, {"model": "m"}).response["usage"]

    assert usage["input_tokens_details"] == {"cached_tokens": 8}
    assert usage["output_tokens_details"] == {"reasoning_tokens": 2}


def test_vllm_token_ids_and_logprobs_are_read_and_attached_as_gym_training_fields() -> None:
    data = chat_reply({"content": "ab"}, prompt_token_ids=[1, 2, 3])
    data["choices"][0]["token_ids"] = [7, 8]
    data["choices"][0]["logprobs"] = {
        "content": [
            {"token": "a", "logprob": -0.1, "top_logprobs": []},
            {"token": "b", "logprob": -0.2, "top_logprobs": []},
        ]
    }

    reply = chat_to_responses_reply(data, {"model": "m"})

    assert (reply.prompt_token_ids, reply.completion_token_ids, reply.completion_logprobs) == (
        [1, 2, 3],
        [7, 8],
        [-0.1, -0.2],
    )
    item = reply.response["output"][-1]
    assert (item["prompt_token_ids"], item["generation_token_ids"], item["generation_log_probs"]) == (
        [1, 2, 3],
        [7, 8],
        [-0.1, -0.2],
    )
    gym_validate(reply.response)


def test_training_fields_make_nemo_gym_parse_its_training_item() -> None:
    openai_utils = pytest.importorskip("nemo_gym.openai_utils")
    data = chat_reply({"content": "ab"}, prompt_token_ids=[1, 2, 3])
    data["choices"][0]["token_ids"] = [7, 8]
    data["choices"][0]["logprobs"] = {"content": [{"token": "a", "logprob": -0.1}, {"token": "b", "logprob": -0.2}]}

    response = chat_to_responses_reply(data, {"model": "m"}).response

    validated = openai_utils.NeMoGymResponse.model_validate(response)
    assert type(validated.output[-1]).__name__ == "NeMoGymResponseOutputMessageForTraining"


def test_token_ids_from_token_id_strings_and_message_fields() -> None:
    as_strings = chat_reply({"content": "ab", "prompt_token_ids": [5]})
    as_strings["choices"][0]["logprobs"] = {
        "content": [
            {"token": "token_id:11", "logprob": -1.0, "top_logprobs": []},
            {"token": "token_id:12", "logprob": -2.0, "top_logprobs": []},
        ]
    }
    nemo_style = chat_reply(
        {
            "content": "ab",
            "prompt_token_ids": [5],
            "generation_token_ids": [21],
            "generation_log_probs": [-3.0],
        }
    )

    a = chat_to_responses_reply(as_strings, {"model": "m"})
    b = chat_to_responses_reply(nemo_style, {"model": "m"})

    assert (a.prompt_token_ids, a.completion_token_ids, a.completion_logprobs) == (
        [5],
        [11, 12],
        [-1.0, -2.0],
    )
    assert (b.prompt_token_ids, b.completion_token_ids, b.completion_logprobs) == ([5], [21], [-3.0])


def test_no_token_data_means_no_training_fields() -> None:
    reply = chat_to_responses_reply(chat_reply({"content": "x"}), {"model": "m"})

    assert reply.prompt_token_ids is None and "prompt_token_ids" not in reply.response["output"][-1]


@pytest.mark.parametrize(
    "data",
    [
        {"choices": []},
        {**chat_reply({"content": "x"}), "choices": [{"index": 0, "finish_reason": "abort", "message": {}}]},
        chat_reply({"content": None, "tool_calls": [{"id": "c", "type": "custom", "custom": {"name": "x"}}]}),
        "not an object",
    ],
    ids=["missing-fields", "bad-choice", "custom-tool-call", "string"],
)
def test_invalid_chat_replies_are_protocol_errors(data: Any) -> None:
    with pytest.raises(UpstreamError) as info:
        chat_to_responses_reply(data, {"model": "m"})

    assert info.value.kind == "protocol"


def test_finish_response_fills_echo_fields_and_usage_details() -> None:
    data = {
        "output": [
            {"id": "m", "type": "message", "role": "assistant", "status": "completed", "content": []},
        ],
        "usage": {"input_tokens": 1, "output_tokens": 2, "total_tokens": 3, "input_tokens_details": None},
    }

    response = finish_response(data, {"model": "real", "tools": TOOLS, "tool_choice": "auto"})

    gym_validate(response)
    assert response["model"] == "real" and response["tools"] == TOOLS
    assert response["usage"]["input_tokens_details"] == {"cached_tokens": 0}
    assert json.dumps(response)  # plain JSON, ready for the agent
