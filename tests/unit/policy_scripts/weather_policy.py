"""A policy script as a user writes one (``--policy-script weather_policy.py``): call the tool once, then answer."""


def policy(messages: list[dict], tools: list[dict]) -> str | dict:
    if messages[-1]["role"] == "tool" or not tools:
        return f"It is {messages[-1]['content']}."
    return {"name": tools[0]["function"]["name"], "arguments": {"city": "Lima"}}


def shout(messages: list[dict]) -> str:
    return messages[-1]["content"].upper()


async def both(messages: list[dict], tools: list[dict]) -> list:
    return ["Checking.", {"name": "get_weather", "arguments": '{"city": "Lima"}'}]


def broken(messages: list[dict], tools: list[dict]) -> str:
    return messages[99]["content"]


def odd(messages: list[dict], tools: list[dict]) -> int:
    return 42
