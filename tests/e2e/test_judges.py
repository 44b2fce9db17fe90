"""Judge models through the routing proxy, on the real nemo-gym stack (ng_run, the simpleqa and text_to_sql
resources servers, their simple agents) with local fake model servers on 127.0.0.1: the policy's calls
reach the policy's endpoint with the policy's key, the judge's calls the judge's endpoint with the
judge's key. simpleqa's judge asks in Chat Completions (its config's ``use_chat_completions_for_judge``),
text_to_sql's in Responses, and its judge is ``policy_model``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.e2e.policies import LocalServer, PolicyServer, message, user_text
from verifiers_nemo import ConfigurationError, Endpoint, NeMoGymHarness, NeMoGymTaskset

pytestmark = [pytest.mark.e2e]

POLICY_KEY, JUDGE_KEY = "policy-key-6c1d", "judge-key-9f4e"
ROWS = 5


async def answer_paris(body: dict[str, Any], request: web.Request) -> list[dict[str, Any]]:
    return [message("Paris")]


class ChatJudge(LocalServer):
    """Grades A (correct) when the gold target in simpleqa's judge prompt is Paris too, else B."""

    def __init__(self) -> None:
        self.calls = 0
        self.authorizations: set[str] = set()
        self.models: set[str] = set()

    async def _chat(self, request: web.Request) -> web.Response:
        self.calls += 1
        self.authorizations.add(request.headers.get("Authorization", ""))
        body = await request.json()
        self.models.add(body["model"])
        grade = "A" if body["messages"][-1]["content"].count("Paris") >= 2 else "B"
        return web.json_response(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": grade}}],
                "usage": {"prompt_tokens": 20, "completion_tokens": 1, "total_tokens": 21},
            }
        )

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._chat)


def _gym_environments() -> list[dict[str, str]]:
    """The environment of every process under ng_run (the Gym servers), read from /proc."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"app.py" not in cmdline:
                continue
            raw = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        found.append(dict(kv.split("=", 1) for kv in raw.decode(errors="replace").split("\0") if "=" in kv))
    return found


async def test_judge_calls_reach_the_judge_and_policy_calls_the_policy() -> None:
    tasks = NeMoGymTaskset("simpleqa", limit=ROWS)
    async with PolicyServer(answer_paris, "policy") as policy, ChatJudge() as judge:
        policy_ep = Endpoint(base_url=policy.base_url, model="pol", api_key=POLICY_KEY)
        judge_ep = Endpoint(base_url=judge.base_url, model="jud", api_key=JUDGE_KEY, name="the judge")
        async with NeMoGymHarness("simpleqa", judge=judge_ep, timeout=120) as harness:
            results = [r async for r in harness.run(tasks, policy_ep, concurrency=ROWS)]
            gym_envs = _gym_environments()
            judge_calls = harness.judge_calls()
            assert harness.judges.names == ("genrm_model",)
            assert harness.judge_label("genrm_model") == "the judge"

    assert [r.error for r in results] == [None] * ROWS
    expected = {i: float(tasks[i].row["expected_answer"] == "Paris") for i in range(ROWS)}
    assert {r.task_index: r.reward for r in results} == expected and sum(expected.values()) == 1
    assert policy.calls == ROWS and judge.calls == ROWS  # one policy call and one judge call per rollout
    assert policy.authorizations == {f"Bearer {POLICY_KEY}"}
    assert judge.authorizations == {f"Bearer {JUDGE_KEY}"} and judge.models == {"jud"}
    assert all(len(r.trace) == 1 for r in results)  # judge calls are not in the policy's trace
    calls = judge_calls["genrm_model"]
    assert len(calls) == ROWS and all(c.status == 200 and c.error is None for c in calls)
    assert sum(c.usage["total_tokens"] for c in calls) == 21 * ROWS  # judge usage, counted apart
    assert gym_envs and not any(JUDGE_KEY in v or POLICY_KEY in v for env in gym_envs for v in env.values())


async def test_a_policy_model_judge_follows_the_policy_when_no_judge_is_given() -> None:
    tasks = NeMoGymTaskset("text_to_sql", limit=2)

    async def policy_and_judge(body: dict[str, Any], request: web.Request) -> list[dict[str, Any]]:
        if "[[A=B]]" in user_text(body) or "[[A=B]]" in str(body["input"]):
            return [message("[[A=B]]")]
        return [message("```sql\nSELECT 1;\n```")]

    async with PolicyServer(policy_and_judge) as server:
        endpoint = Endpoint(base_url=server.base_url, model="pol", api_key=POLICY_KEY)
        async with NeMoGymHarness("text_to_sql", timeout=120) as harness:
            results = [r async for r in harness.run(tasks, endpoint, concurrency=2)]
            assert harness.judge_label("policy_model") == "the policy endpoint (no judge given)"
            assert len(harness.judge_calls()["policy_model"]) == 4  # its config judges twice (swapped)
    assert [r.error for r in results] == [None, None]
    assert [r.reward for r in results] == [1.0, 1.0]
    assert server.calls == 6


def test_an_env_whose_judge_is_not_the_policy_needs_a_judge() -> None:
    with pytest.raises(ConfigurationError, match=r"genrm_model.*--judge-base-url"):
        NeMoGymHarness("abstention").check()
