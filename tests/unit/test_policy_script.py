"""A policy script answers as the model (``eval --policy-script FILE.py[:NAME]``, ``FunctionUpstream.from_policy``):
what the function sees, what it may return, how it is served, and the one-line refusals."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from verifiers_nemo import ConfigurationError, Endpoint, FunctionUpstream
from verifiers_nemo._cli import main
from verifiers_nemo._policy_script import (
    ScriptPolicyServer,
    chat_reply,
    load_policy_function,
    responses_reply,
    split_policy_spec,
)

SCRIPT = Path(__file__).parent / "policy_scripts" / "weather_policy.py"
TOOL = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}
ASKED = {"input": [{"role": "user", "content": "Weather in Lima?"}], "tools": [TOOL]}
CALLED = {
    "input": [
        {"role": "user", "content": "Weather in Lima?"},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Lima"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "mild"},
    ],
    "tools": [TOOL],
}


def test_a_spec_names_a_file_and_a_function_which_defaults_to_policy() -> None:
    assert split_policy_spec("my.py:answer") == (Path("my.py"), "answer")
    assert split_policy_spec("my.py") == (Path("my.py"), "policy")
    assert split_policy_spec("/a:b/my.py") == (Path("/a:b/my.py"), "policy")  # a colon of the path is not NAME


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("nowhere.py", "is no file. Fix: give a Python file and the function in it that answers as the model"),
        (f"{SCRIPT}:missing", "defines no function 'missing' (its functions: both, broken, odd, policy, shout)"),
        (f"{SCRIPT}:", "ends in a colon. Fix: name the function after the colon, FILE.py:NAME"),
    ],
)
def test_a_script_that_cannot_answer_is_refused_in_one_line_with_the_fix(spec: str, says: str) -> None:
    with pytest.raises(ConfigurationError, match="Fix:") as caught:
        load_policy_function(spec)
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_a_script_that_fails_to_import_is_refused_naming_its_line(tmp_path: Path) -> None:
    script = tmp_path / "bad.py"
    script.write_text("x = 1\nimport not_a_module_anywhere\n")

    with pytest.raises(ConfigurationError, match=r"importing .*bad.py failed: ModuleNotFoundError: .*\(bad.py:2\)"):
        load_policy_function(str(script))


def test_text_and_tool_calls_become_replies_the_openai_types_accept() -> None:
    answer = ["Checking.", {"name": "get_weather", "arguments": {"city": "Lima"}}]

    response = Response.model_validate(responses_reply(answer))
    chat = ChatCompletion.model_validate(chat_reply(answer))

    assert [item.type for item in response.output] == ["message", "function_call"]
    assert json.loads(response.output[1].arguments) == {"city": "Lima"}  # type: ignore[union-attr]
    assert chat.choices[0].message.content == "Checking."
    assert chat.choices[0].finish_reason == "tool_calls"
    assert chat.choices[0].message.tool_calls[0].function.name == "get_weather"  # type: ignore[index]


def test_anything_else_returned_is_a_type_error_naming_what_a_script_returns() -> None:
    with pytest.raises(TypeError, match=r"returns text, a tool call .* not int 42"):
        responses_reply(42)


def _post(server: ScriptPolicyServer, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async def go() -> tuple[int, dict[str, Any]]:
        async with aiohttp.ClientSession() as session, session.post(server.base_url + path, json=body) as reply:
            return reply.status, await reply.json()

    return asyncio.run(go())


def test_the_server_answers_responses_calls_with_the_conversation_and_tools_in_chat_form() -> None:
    with ScriptPolicyServer(load_policy_function(str(SCRIPT))) as server:
        first = _post(server, "/responses", ASKED)
        second = _post(server, "/responses", CALLED)
        chat = _post(server, "/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})

    assert first[0] == 200 and first[1]["output"][0]["name"] == "get_weather"
    assert second[1]["output"][0]["content"][0]["text"] == "It is mild."
    assert chat[1]["choices"][0]["message"]["content"] == "It is hi."
    assert server.calls == 3


def test_a_script_that_raises_answers_500_naming_its_file_and_line(caplog: pytest.LogCaptureFixture) -> None:
    with ScriptPolicyServer(load_policy_function(f"{SCRIPT}:broken")) as server:
        status, body = _post(server, "/responses", ASKED)

    assert status == 500 and body["error"]["type"] == "policy_script_error"
    assert "IndexError" in body["error"]["message"] and "weather_policy.py:" in body["error"]["message"]
    assert any("the policy script raised" in r.getMessage() for r in caplog.records)


def test_a_function_upstream_from_a_policy_takes_sync_async_and_one_argument_functions() -> None:
    endpoint = Endpoint(base_url="http://unused/v1", model="script")

    async def answer(name: str, body: dict[str, Any]) -> dict[str, Any]:
        upstream = FunctionUpstream.from_policy(load_policy_function(f"{SCRIPT}:{name}"))
        async with aiohttp.ClientSession() as session:
            return (await upstream.create_response(session, endpoint, dict(body))).response

    one_argument = asyncio.run(answer("shout", {"input": "hello"}))
    two_items = asyncio.run(answer("both", ASKED))

    assert one_argument["output"][0]["content"][0]["text"] == "HELLO"
    assert [item["type"] for item in two_items["output"]] == ["message", "function_call"]


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--policy-script", "nowhere.py"], "is no file. Fix:"),
        (["--policy-script", str(SCRIPT), "--policy", "replay"], "--policy-script answers as the model: drop --policy"),
        (["--policy", "script"], "--policy script needs --policy-script FILE.py[:NAME] (the function that answers"),
        (["--policy-script", str(SCRIPT), "-b", "http://h:1/v1"], "a policy script is the model; drop -b"),
        (["--policy-script", str(SCRIPT), "-k", "KEY"], "a policy script needs no key; drop -k"),
        (["--policy-script", str(SCRIPT), "--ray"], "Ray actors elsewhere cannot call it: drop --ray"),
        (
            ["--policy-script", str(SCRIPT), "--client-type", "train"],
            "--client-type train samples from an engine's token route, which a policy script has none of: drop it",
        ),
    ],
)
def test_the_eval_command_refuses_a_policy_script_that_cannot_run_before_anything_starts(
    flags: list[str], says: str, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)

    code, output = _cli(["eval", "example_single_tool_call", *flags], capsys)

    assert code == 2 and says in output
    assert not (tmp_path / "outputs").exists()
