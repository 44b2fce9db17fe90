"""Environments of a user's own, written in temporary folders as Gym's guide has users write them:
``resources_servers/NAME/`` with ``app.py`` (a ``SimpleResourcesServer``), ``configs/NAME.yaml`` (the resources
server and a ``simple_agent``), ``data/example.jsonl``, ``data/example_rollouts.jsonl`` and ``requirements.txt``.

None of them is packaged with nemo-gym: the tests name them by path or through ``--gym-root``."""

from __future__ import annotations

import json
import textwrap
import uuid
from pathlib import Path
from typing import Any

CITIES = ("Paris", "Lima", "Oslo", "Cairo", "Quito")

WEATHER_APP = """
from fastapi import FastAPI
from pydantic import BaseModel

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseRunRequest,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)


class CityWeatherConfig(BaseResourcesServerConfig):
    pass


class CityRunRequest(BaseRunRequest):
    expected_city: str


class CityVerifyRequest(CityRunRequest, BaseVerifyRequest):
    pass


class CityVerifyResponse(BaseVerifyResponse):
    expected_city: str
    asked_city: str | None = None


class GetWeatherRequest(BaseModel):
    city: str


class GetWeatherResponse(BaseModel):
    city: str
    weather_description: str


class CityWeatherServer(SimpleResourcesServer):
    config: CityWeatherConfig

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/get_weather")(self.get_weather)
        return app

    async def get_weather(self, body: GetWeatherRequest) -> GetWeatherResponse:
        return GetWeatherResponse(city=body.city, weather_description=WEATHER_WORD + " in " + body.city)

    async def verify(self, body: CityVerifyRequest) -> CityVerifyResponse:
        asked = None
        for item in body.response.output:
            if item.type == "function_call" and item.name == "get_weather":
                asked = __import__("json").loads(item.arguments).get("city")
        reward = 1.0 if asked == body.expected_city else 0.0
        return CityVerifyResponse(**body.model_dump(), reward=reward, asked_city=asked)


WEATHER_WORD = "sunny"

if __name__ == "__main__":
    CityWeatherServer.run_webserver()
"""

TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "The city."}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}


def config_yaml(name: str, *, agent_name: str | None = None, extra_server_keys: str = "") -> str:
    agent = agent_name or f"{name}_simple_agent"
    return textwrap.dedent(
        f"""\
        {name}:
          resources_servers:
            {name}:
              entrypoint: app.py
              domain: agent
              verified: false
              description: A user's own tool environment{extra_server_keys}
        {agent}:
          responses_api_agents:
            simple_agent:
              entrypoint: app.py
              resources_server:
                type: resources_servers
                name: {name}
              model_server:
                type: responses_api_models
                name: policy_model
              datasets:
              - name: example
                type: example
                jsonl_fpath: resources_servers/{name}/data/example.jsonl
        """
    )


def task_row(city: str, agent: str) -> dict[str, Any]:
    return {
        "responses_create_params": {
            "input": [
                {"role": "developer", "content": "Answer with the weather tool."},
                {"role": "user", "content": f"What is the weather in {city}?"},
            ],
            "tools": [TOOL],
        },
        "expected_city": city,
        "agent_ref": {"type": "responses_api_agents", "name": agent},
    }


def recorded_rollout(row: dict[str, Any], asked: str, word: str = "sunny") -> dict[str, Any]:
    """A row as ``ng_collect_rollouts`` writes it: the task, the model's whole output, the reward."""
    call_id = f"call_{uuid.uuid4().hex[:12]}"
    output = [
        {
            "type": "function_call",
            "id": f"fc_{uuid.uuid4().hex[:12]}",
            "call_id": call_id,
            "name": "get_weather",
            "arguments": json.dumps({"city": asked}),
            "status": "completed",
        },
        {
            "type": "function_call_output",
            "call_id": call_id,
            "output": json.dumps({"city": asked, "weather_description": f"{word} in {asked}"}),
        },
        {
            "type": "message",
            "id": f"msg_{uuid.uuid4().hex[:12]}",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": f"It is {word} in {asked}.", "annotations": []}],
        },
    ]
    return {
        **row,
        "response": {
            "id": f"resp_{uuid.uuid4().hex[:12]}",
            "created_at": 1.0,
            "model": "recorded-model",
            "object": "response",
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [TOOL],
        },
        "reward": 1.0 if asked == row["expected_city"] else 0.0,
        "asked_city": asked,
    }


def write_weather_env(
    root: Path,
    name: str = "city_weather",
    *,
    requirements: str = "",
    app: str = WEATHER_APP,
    agent_name: str | None = None,
) -> Path:
    """A tool environment with a verifier reading a row field, in ``root/resources_servers/<name>``; its
    recordings: one wrong answer among five (reward 0.0), the rest right (1.0). Returns its folder."""
    folder = root / "resources_servers" / name
    (folder / "configs").mkdir(parents=True, exist_ok=True)
    (folder / "data").mkdir(exist_ok=True)
    (folder / "app.py").write_text(textwrap.dedent(app))
    (folder / "requirements.txt").write_text(requirements)
    (folder / "configs" / f"{name}.yaml").write_text(config_yaml(name, agent_name=agent_name))
    agent = agent_name or f"{name}_simple_agent"
    rows = [task_row(city, agent) for city in CITIES]
    (folder / "data" / "example.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    recordings = [recorded_rollout(r, "Atlantis" if i == 3 else r["expected_city"]) for i, r in enumerate(rows)]
    (folder / "data" / "example_rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recordings))
    return folder


def recorded_rewards(folder: Path) -> list[float]:
    lines = (folder / "data" / "example_rollouts.jsonl").read_text().splitlines()
    return [json.loads(line)["reward"] for line in lines if line.strip()]


JUDGED_APP = (
    WEATHER_APP.replace(
        "class CityWeatherConfig(BaseResourcesServerConfig):\n    pass",
        "class CityWeatherConfig(BaseResourcesServerConfig):\n    judge_model_server: ModelServerRef",
    )
    .replace(
        "from nemo_gym.base_resources_server import (",
        "from nemo_gym.config_types import ModelServerRef\nfrom nemo_gym.server_utils import get_response_json\n"
        "from nemo_gym.base_resources_server import (",
    )
    .replace(
        "        reward = 1.0 if asked == body.expected_city else 0.0\n",
        "        final = body.response.output[-1].content[0].text if body.response.output else ''\n"
        "        asking = f'Expected: {body.expected_city}. Answer: {final}'\n"
        "        question = {'input': [{'role': 'user', 'content': asking}]}\n"
        "        answer = await self.server_client.post(\n"
        "            server_name=self.config.judge_model_server.name, url_path='/v1/responses', json=question\n"
        "        )\n"
        "        verdict = (await get_response_json(answer))['output'][-1]['content'][0]['text']\n"
        "        reward = 1.0 if verdict.strip().lower() == 'yes' else 0.0\n",
    )
)
"""The weather environment scored by a judge model server of its config (``judge_model``), as Gym's judge
environments are: ``verify`` asks the judge whether the answer is about the expected city."""

JUDGE_ENTRY = """judge_model:
  responses_api_models:
    openai_model:
      entrypoint: app.py
      openai_base_url: ${oc.env:MY_JUDGE_BASE_URL,MISSING}
      openai_api_key: ${oc.env:MY_JUDGE_API_KEY,MISSING}
      openai_model: ${oc.env:MY_JUDGE_MODEL,MISSING}
"""


def write_judged_env(root: Path, name: str = "judged_weather") -> Path:
    """``write_weather_env`` scored by a judge (``JUDGED_APP``; the config's ``judge_model`` server)."""
    folder = write_weather_env(root, name, app=JUDGED_APP)
    config = folder / "configs" / f"{name}.yaml"
    server = "      description: A user's own tool environment"
    text = config.read_text().replace(
        server, server + "\n      judge_model_server:\n        type: responses_api_models\n        name: judge_model"
    )
    config.write_text(text + JUDGE_ENTRY)
    return folder


GUESS_APP = """
from fastapi import FastAPI, Request
from pydantic import BaseModel, Field

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseSeedSessionRequest,
    BaseSeedSessionResponse,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)
from nemo_gym.server_utils import SESSION_ID_KEY


class HiddenNumberConfig(BaseResourcesServerConfig):
    pass


class HiddenNumberSeedRequest(BaseSeedSessionRequest):
    secret: int


class GuessRequest(BaseModel):
    number: int


class GuessResponse(BaseModel):
    result: str


class HiddenNumberServer(SimpleResourcesServer):
    config: HiddenNumberConfig
    secrets: dict[str, int] = Field(default_factory=dict)
    solved: dict[str, bool] = Field(default_factory=dict)

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/guess")(self.guess)
        return app

    async def seed_session(self, request: Request, body: HiddenNumberSeedRequest) -> BaseSeedSessionResponse:
        session_id = request.session[SESSION_ID_KEY]
        self.secrets[session_id] = body.secret
        self.solved[session_id] = False
        return BaseSeedSessionResponse()

    async def guess(self, request: Request, body: GuessRequest) -> GuessResponse:
        session_id = request.session[SESSION_ID_KEY]
        secret = self.secrets[session_id]
        if body.number == secret:
            self.solved[session_id] = True
            return GuessResponse(result="correct")
        return GuessResponse(result="higher" if secret > body.number else "lower")

    async def verify(self, request: Request, body: BaseVerifyRequest) -> BaseVerifyResponse:
        session_id = request.session[SESSION_ID_KEY]
        reward = 1.0 if self.solved.pop(session_id, False) else 0.0
        self.secrets.pop(session_id, None)
        return BaseVerifyResponse(**body.model_dump(), reward=reward)


if __name__ == "__main__":
    HiddenNumberServer.run_webserver()
"""
"""A stateful environment as Gym's ``example_session_state_mgmt`` is written: ``/seed_session`` keeps the row's
hidden ``secret`` for the session (Gym's session cookie names it), the ``guess`` tool answers higher / lower /
correct against it across turns, and ``verify`` scores from the session's state (the verify request carries no
``secret``, so Gym's reply does not echo it)."""

GUESS_TOOL = {
    "type": "function",
    "name": "guess",
    "description": "Guess the hidden number; answers higher, lower or correct.",
    "parameters": {
        "type": "object",
        "properties": {"number": {"type": "integer"}},
        "required": ["number"],
        "additionalProperties": False,
    },
    "strict": True,
}
GUESS_SECRETS = (3, 7, 1, 9)
"""Four rows, one prompt: they differ only in the secret the model never sees."""

GUESS_POLICY = '''
import json

LOW, HIGH, TRIES = 1, 10, 3


def policy(messages, tools):
    """Binary search with three guesses, read back from the conversation."""
    low, high, tries = LOW, HIGH, 0
    last_guess = None
    for message in messages:
        for call in message.get("tool_calls") or ():
            last_guess = json.loads(call["function"]["arguments"])["number"]
            tries += 1
        if message["role"] == "tool":
            result = json.loads(message["content"])["result"]
            if result == "correct":
                return f"It is {last_guess}."
            low, high = (last_guess + 1, high) if result == "higher" else (low, last_guess - 1)
    if tries == TRIES:
        return "I give up."
    return {"name": "guess", "arguments": {"number": (low + high) // 2}}
'''
"""A policy script (``eval --policy-script``): found in three guesses for 3, 1 and 9, not for 7."""


def guess_rewards() -> list[float]:
    """What ``GUESS_POLICY`` scores on ``GUESS_SECRETS``, row by row."""
    rewards = []
    for secret in GUESS_SECRETS:
        low, high, found = 1, 10, False
        for _ in range(3):
            guess = (low + high) // 2
            if guess == secret:
                found = True
                break
            low, high = (guess + 1, high) if secret > guess else (low, guess - 1)
        rewards.append(1.0 if found else 0.0)
    return rewards


def write_guess_env(root: Path, name: str = "hidden_number") -> Path:
    """``GUESS_APP`` in ``root/resources_servers/<name>`` with its four rows (no recordings: a new environment).
    Returns its folder."""
    folder = root / "resources_servers" / name
    (folder / "configs").mkdir(parents=True, exist_ok=True)
    (folder / "data").mkdir(exist_ok=True)
    (folder / "app.py").write_text(textwrap.dedent(GUESS_APP))
    (folder / "requirements.txt").write_text("")
    (folder / "configs" / f"{name}.yaml").write_text(config_yaml(name))
    prompt = {
        "input": [{"role": "user", "content": "Find my hidden number between 1 and 10 with the guess tool."}],
        "tools": [GUESS_TOOL],
    }
    rows = [{"responses_create_params": prompt, "secret": secret} for secret in GUESS_SECRETS]
    (folder / "data" / "example.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder
