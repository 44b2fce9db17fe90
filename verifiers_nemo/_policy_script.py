"""A policy script: a Python function of yours answers as the model (``eval --policy-script FILE.py[:NAME]``,
``FunctionUpstream.from_policy``).

The function sees what a chat model sees and answers as one::

    def policy(messages: list[dict], tools: list[dict]) -> str | dict | list:
        ...

``messages`` is the conversation so far in Chat Completions form (``system``/``user``/``assistant`` messages,
``assistant`` ones with their ``tool_calls``, ``tool`` messages with the tool's result), ``tools`` the tools offered,
in Chat Completions form too (it may take ``messages`` only). It returns a string (the assistant's text), a tool
call ``{"name": "TOOL", "arguments": {...}}`` (arguments as a dict or a JSON string), or a list of them in the
order the model would say them. It may be ``async``. A brand-new environment then runs end to end, with no model
and no GPU: a first run whose saved results replay as recordings.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import logging
import sys
import time
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from ._exceptions import ConfigurationError
from ._protocol import to_chat_messages, to_chat_tools
from ._serving import LoopThreadServer

logger = logging.getLogger(__name__)

SCRIPT_MODEL = "script"
"""The model name a policy script answers as (what the results and the summary show)."""
DEFAULT_FUNCTION = "policy"
PolicyFunction = Callable[..., Any]


def split_policy_spec(spec: str) -> tuple[Path, str]:
    """``FILE.py[:NAME]`` as ``(path, function name)``; NAME defaults to ``policy``."""
    head, sep, tail = spec.rpartition(":")
    if sep and head and not tail:
        raise ConfigurationError(
            f"--policy-script {spec!r} ends in a colon. Fix: name the function after the colon, FILE.py:NAME."
        )
    if sep and head and tail.isidentifier():
        return Path(head).expanduser(), tail
    return Path(spec).expanduser(), DEFAULT_FUNCTION


def load_policy_function(spec: str) -> PolicyFunction:
    """The function ``FILE.py[:NAME]`` names, imported from its file; one ConfigurationError with the fix when the
    file, the function, or its import is wrong."""
    path, name = split_policy_spec(spec)
    if not path.is_file():
        raise ConfigurationError(
            f"--policy-script {spec!r}: {path} is no file. Fix: give a Python file and the function in it that "
            f"answers as the model, FILE.py:NAME (NAME defaults to {DEFAULT_FUNCTION!r})."
        )
    module_name = f"verifiers_nemo_policy_{uuid.uuid5(uuid.NAMESPACE_URL, str(path.resolve())).hex}"
    loaded = importlib.util.spec_from_file_location(module_name, path)
    if loaded is None or loaded.loader is None:
        raise ConfigurationError(f"--policy-script {spec!r}: {path} is not a Python file. Fix: name a .py file.")
    module = importlib.util.module_from_spec(loaded)
    sys.modules[module_name] = module  # dataclasses and pickling look modules up by name
    try:
        loaded.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(module_name, None)
        raise ConfigurationError(
            f"--policy-script {spec!r}: importing {path} failed: {_where(exc)}. Fix: that line of the script."
        ) from exc
    function = getattr(module, name, None)
    if not callable(function):
        defined = sorted(k for k, v in vars(module).items() if inspect.isfunction(v) and v.__module__ == module_name)
        raise ConfigurationError(
            f"--policy-script {spec!r}: {path} defines no function {name!r} (its functions: "
            f"{', '.join(defined) or 'none'}). Fix: name the function after the colon, FILE.py:NAME."
        )
    return function


async def call_policy(function: PolicyFunction, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
    """``function(messages, tools)`` (or ``function(messages)``), awaited when it is async."""
    try:
        takes_tools = len(inspect.signature(function).parameters) >= 2
    except (TypeError, ValueError):
        takes_tools = True
    answer = function(messages, tools) if takes_tools else function(messages)
    if inspect.isawaitable(answer):
        answer = await answer
    return answer


def _items(answer: Any) -> list[Any]:
    items = answer if isinstance(answer, list) else [answer]
    for item in items:
        if not isinstance(item, str) and not (isinstance(item, dict) and isinstance(item.get("name"), str)):
            raise TypeError(
                f"a policy script returns text, a tool call {{'name': ..., 'arguments': {{...}}}} or a list of them, "
                f"not {type(item).__name__} {item!r:.80}"
            )
    return items


def _arguments(item: dict[str, Any]) -> str:
    arguments = item.get("arguments", {})
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


def responses_reply(answer: Any, model: str = SCRIPT_MODEL) -> dict[str, Any]:
    """A policy script's answer as a completed Responses object."""
    output: list[dict[str, Any]] = []
    for item in _items(answer):
        if isinstance(item, str):
            output.append(
                {
                    "id": f"msg_{uuid.uuid4().hex}",
                    "type": "message",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": item, "annotations": []}],
                }
            )
        else:
            output.append(
                {
                    "id": f"fc_{uuid.uuid4().hex}",
                    "type": "function_call",
                    "call_id": f"call_{uuid.uuid4().hex[:24]}",
                    "name": item["name"],
                    "arguments": _arguments(item),
                    "status": "completed",
                }
            )
    return {
        "id": f"resp_{uuid.uuid4().hex}",
        "object": "response",
        "created_at": int(time.time()),
        "model": model,
        "status": "completed",
        "incomplete_details": None,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": None,
    }


def chat_reply(answer: Any, model: str = SCRIPT_MODEL) -> dict[str, Any]:
    """A policy script's answer as a Chat Completions object (one choice)."""
    texts, calls = [], []
    for item in _items(answer):
        if isinstance(item, str):
            texts.append(item)
        else:
            calls.append(
                {
                    "id": f"call_{uuid.uuid4().hex[:24]}",
                    "type": "function",
                    "function": {"name": item["name"], "arguments": _arguments(item)},
                }
            )
    message: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
    }


def _where(exc: BaseException) -> str:
    """``ExcType: message (file.py:line)`` at the innermost frame of the script that raised."""
    frames = traceback.extract_tb(exc.__traceback__)
    frame = frames[-1] if frames else None
    place = f" ({Path(frame.filename).name}:{frame.lineno})" if frame else ""
    return f"{type(exc).__name__}: {exc}{place}"


class ScriptPolicyServer(LoopThreadServer):
    """A policy script served as an OpenAI-compatible server on 127.0.0.1 (``/v1/responses``,
    ``/v1/chat/completions``, ``/v1/models``), so it stands where any inference endpoint does.

    A script that raises answers 500 ``policy_script_error`` naming its file and line: that rollout fails as any
    failing endpoint's does, the others go on."""

    thread_name = "verifiers-nemo-policy-script"

    def __init__(self, function: PolicyFunction, name: str = SCRIPT_MODEL) -> None:
        super().__init__("127.0.0.1", 0)
        self.function = function
        self.name = name
        self.calls = 0

    @classmethod
    def from_spec(cls, spec: str) -> ScriptPolicyServer:
        """The server of the function ``FILE.py[:NAME]`` names (refused as ``load_policy_function`` refuses)."""
        return cls(load_policy_function(spec), name=SCRIPT_MODEL)

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 1024**2)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        return app

    async def _answer(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], shape: Callable) -> Any:
        self.calls += 1
        try:
            return web.json_response(shape(await call_policy(self.function, messages, tools), self.name))
        except Exception as exc:
            message = f"the policy script raised {_where(exc)}"
            logger.warning("%s", message)
            return web.json_response({"error": {"message": message, "type": "policy_script_error"}}, status=500)

    async def _responses(self, request: web.Request) -> web.Response:
        body = await request.json()
        messages = to_chat_messages(body.get("input") or [])
        if isinstance(body.get("instructions"), str) and body["instructions"]:
            messages.insert(0, {"role": "system", "content": body["instructions"]})
        return await self._answer(messages, to_chat_tools(body.get("tools") or []), responses_reply)

    async def _chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        return await self._answer(list(body.get("messages") or []), list(body.get("tools") or []), chat_reply)

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.name, "object": "model", "owned_by": "you"}]})
