"""Judge models: the config rewrite that sends a resources server's judge calls to our placeholders, the
proxy's judge ports, the CLI's judge flags and ``judge=`` (fakes only; the real stack is
tests/e2e/test_judges.py)."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from verifiers_nemo import ConfigurationError, Endpoint, FunctionUpstream, RoutingProxy, get_environment
from verifiers_nemo._cli.parser import build_parser
from verifiers_nemo._cli.settings import judge_settings
from verifiers_nemo._gym import merged_configs
from verifiers_nemo._judge import JudgeEndpoints, judge_refs, plan_judges
from verifiers_nemo._routing.proxy import JUDGE_CALLS_KEPT

# -- the config rewrite ------------------------------------------------------------------------------


def test_a_judge_defined_in_the_config_is_renamed_to_a_placeholder_and_its_server_dropped(tmp_path: Path) -> None:
    original = get_environment("arena_judge").default_config.path  # defines an openai_model judge with a key
    plan = plan_judges([original], tmp_path)

    assert plan.targets == ("arena_judge_judge_model",)
    assert plan.placeholders == {"arena_judge_judge_model": "vnr_judge_arena_judge_judge_model"}
    rewritten = merged_configs(list(plan.config_paths))
    assert "arena_judge_judge_model" not in rewritten  # no Gym process holds the judge's URL or key
    assert [r.target for r in judge_refs(rewritten)] == ["vnr_judge_arena_judge_judge_model"]
    assert plan.config_paths[0].parent == tmp_path and plan_judges([original], tmp_path) == plan  # cached


def test_a_policy_judge_is_renamed_and_the_policy_left_alone(tmp_path: Path) -> None:
    plan = plan_judges([get_environment("text_to_sql").default_config.path], tmp_path)
    rewritten = merged_configs(list(plan.config_paths))
    assert plan.targets == ("policy_model",)
    assert [r.target for r in judge_refs(rewritten)] == ["vnr_judge_policy_model"]
    agent = rewritten["text_to_sql_simple_agent"]["responses_api_agents"]["simple_agent"]
    assert agent["model_server"]["name"] == "policy_model"


def test_an_env_without_judges_keeps_its_configs(tmp_path: Path) -> None:
    path = get_environment("example_multi_step").default_config.path
    assert plan_judges([path], tmp_path).config_paths == (path,) and not list(tmp_path.iterdir())


# -- judge ports of the proxy ------------------------------------------------------------------------


def _judge_answer(endpoint: Endpoint, body: dict[str, Any]) -> dict[str, Any]:
    item = {"id": "m1", "type": "message", "role": "assistant", "status": "completed"}
    item["content"] = [{"type": "output_text", "text": f"[[A=B]] by {body['model']}", "annotations": []}]
    return {"output": [item], "usage": {"input_tokens": 7, "output_tokens": 2, "total_tokens": 9}}


async def test_a_judge_port_answers_calls_without_a_route_key_and_closes_with_its_route() -> None:
    judge = {"input": [{"role": "user", "content": "grade this"}]}  # what a resources server sends
    with RoutingProxy() as proxy:
        route = proxy.open_judge_route(
            Endpoint(base_url="http://unused/v1", model="jud"), upstream=FunctionUpstream(_judge_answer)
        )
        async with aiohttp.ClientSession() as client:
            async with client.post(f"{route.url}/v1/responses", json=judge) as resp:
                answered = resp.status, await resp.json()
            async with client.post(f"{proxy.url}/v1/responses", json=judge) as resp:
                policy_port = resp.status  # the policy's port still wants a route key
        calls = route.take_calls()
        port = route.port
        route.close()
        assert port is not None
        refused = False
        for _ in range(50):  # the port closes on the proxy's loop, just after close()
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) != 0:
                    refused = True
                    break
            time.sleep(0.05)

    assert answered[0] == 200 and answered[1]["output"][0]["content"][0]["text"] == "[[A=B]] by jud"
    assert policy_port == 404
    assert len(calls) == 1 and calls[0].usage["total_tokens"] == 9 and route.take_calls() == []
    assert refused


async def test_a_judge_route_keeps_only_its_latest_calls_until_they_are_taken() -> None:
    with RoutingProxy() as proxy:
        route = proxy.open_judge_route(
            Endpoint(base_url="http://unused/v1", model="jud"), upstream=FunctionUpstream(_judge_answer)
        )
        kept = route.keep_calls
        route.keep_calls = 3  # JUDGE_CALLS_KEPT in a long run nobody takes its judge calls from
        async with aiohttp.ClientSession() as client:
            for n in range(5):
                body = {"input": [{"role": "user", "content": f"grade {n}"}]}
                async with client.post(f"{route.url}/v1/responses", json=body) as resp:
                    assert resp.status == 200
        calls = route.take_calls()
        route.close()

    assert kept == JUDGE_CALLS_KEPT
    assert [call.index for call in calls] == [2, 3, 4] and route.dropped_calls == 2


# -- judge= and the CLI flags ------------------------------------------------------------------------


def test_judge_mapping_serves_named_judges_and_the_rest_from_star() -> None:
    one, two = Endpoint(base_url="http://a/v1", model="a", api_key="ka"), Endpoint(base_url="http://b/v1", model="b")
    judges = JudgeEndpoints.of({"genrm_model": one, "*": two})
    assert judges.for_name("genrm_model") is one and judges.for_name("judge_model") is two
    assert JudgeEndpoints.of(one).for_name("anything") is one and not JudgeEndpoints.of(None)
    assert judges.secrets() == {"ka"}
    with pytest.raises(ConfigurationError, match="must be an Endpoint"):
        JudgeEndpoints.of({"x": "http://a/v1"})  # type: ignore[dict-item]


def _flags(*argv: str) -> dict[str, dict[str, Any]]:
    return judge_settings(build_parser().parse_args(["eval", "simpleqa", *argv]))


def test_judge_flags_name_a_default_judge_and_judges_by_name() -> None:
    judges = _flags(
        "--judge-base-url",
        "http://127.0.0.1:8001/v1",
        "--judge-model",
        "J",
        "--judge-api-key-var",
        "JUDGE_KEY",
        "--judge",
        "genrm_model=http://127.0.0.1:8002/v1,Qwen/Qwen3-8B",
    )
    assert judges == {
        "*": {"base_url": "http://127.0.0.1:8001/v1", "model": "J", "api": "responses", "api_key_var": "JUDGE_KEY"},
        "genrm_model": {
            "base_url": "http://127.0.0.1:8002/v1",
            "model": "Qwen/Qwen3-8B",
            "api": "responses",
            "api_key_var": "JUDGE_KEY",
        },
    }
    assert _flags() == {}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--judge-base-url", "http://h/v1"], "go together"),
        (["--judge", "genrm_model"], "expected NAME=URL,MODEL"),
        (["--judge-api-key-var", "K"], "need a judge"),
    ],
)
def test_judge_flags_that_do_not_name_a_judge_are_refused(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        _flags(*argv)
