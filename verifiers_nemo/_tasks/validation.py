"""Checking a row the way nemo-gym would take it (the keys it accepts are read from its source), and
resolving the agent that runs it; a bad row is a ``RowError`` with the problem and the fix."""

from __future__ import annotations

import ast
import functools
import importlib.util
import json
import logging
from pathlib import Path
from typing import Any

from .._exceptions import TasksetError
from .._gym import GymEnvironment
from .task import AGENT_REF, RECORDED_OUTPUTS, RESPONSES_CREATE_PARAMS

logger = logging.getLogger(__name__)


# The fields of nemo-gym 0.4.0's NeMoGymResponseCreateParamsNonStreaming (extra="forbid"); used only
# when no nemo-gym source is at hand to read them from.
NEMO_GYM_0_4_PARAMS = frozenset(
    {
        "background",
        "include",
        "input",
        "instructions",
        "max_output_tokens",
        "max_tool_calls",
        "metadata",
        "model",
        "parallel_tool_calls",
        "previous_response_id",
        "prompt",
        "reasoning",
        "service_tier",
        "store",
        "temperature",
        "text",
        "tool_choice",
        "tools",
        "top_logprobs",
        "top_p",
        "truncation",
        "user",
        "stream",
    }
)
_GYM_PARAMS_CLASS = "NeMoGymResponseCreateParamsNonStreaming"


class RowError(Exception):
    """A bad row: what is wrong and how to fix it."""

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.fix = fix


class RowChecker:
    """Checks one row the way nemo-gym would take it and resolves the agent that runs it."""

    def __init__(
        self,
        *,
        path: Path,
        allowed_params: frozenset[str],
        env: GymEnvironment | None,
        fallback_agent: str | None,
        packaged_agents: frozenset[str] | None,
        recorded: bool,
    ) -> None:
        self.path = path
        self.allowed_params = allowed_params
        self.env = env
        self.known_agents = {a.name for a in env.agents} if env is not None else None
        self.fallback_agent = fallback_agent
        self.packaged_agents = packaged_agents
        self.recorded = recorded
        self._interned: dict[str, str] = {}

    def check(self, row: Any) -> str | None:
        """The agent for a valid row; raises ``RowError`` for a bad one."""
        if not isinstance(row, dict):
            raise RowError(
                f"the row is a JSON {json_type(row)}, not an object",
                'write one JSON object per line: {"responses_create_params": {"input": [...]}, ...}',
            )
        params = row.get(RESPONSES_CREATE_PARAMS)
        if params is None:
            raise RowError(
                f"the row has no {RESPONSES_CREATE_PARAMS!r}",
                f'add "{RESPONSES_CREATE_PARAMS}": {{"input": [...messages...]}} (what the policy is asked)',
            )
        if not isinstance(params, dict):
            raise RowError(
                f"{RESPONSES_CREATE_PARAMS!r} is a JSON {json_type(params)}, not an object",
                f'make it an object: "{RESPONSES_CREATE_PARAMS}": {{"input": [...messages...]}}',
            )
        if "input" not in params:
            raise RowError(
                f"{RESPONSES_CREATE_PARAMS!r} has no 'input'",
                f"add {RESPONSES_CREATE_PARAMS}.input: the prompt, a string or a list of messages "
                '({"role": "user", "content": "..."})',
            )
        if not isinstance(params["input"], str | list):
            raise RowError(
                f"{RESPONSES_CREATE_PARAMS}.input is a JSON {json_type(params['input'])}",
                "make it a string or a list of messages",
            )
        unknown = sorted(k for k in params if k not in self.allowed_params)
        if unknown:
            raise RowError(*self._unknown_params(unknown))
        if self.recorded and ("response" not in row or "reward" not in row):
            missing = " and ".join(repr(k) for k in RECORDED_OUTPUTS if k not in row)
            raise RowError(
                f"the row has no recorded {missing}",
                "recorded=True reads rollouts written by Gym's rollout collection (rows with response and "
                "reward); load plain task rows without recorded=True",
            )
        return self._agent(row)

    def _agent(self, row: dict[str, Any]) -> str | None:
        ref = row.get(AGENT_REF)
        name: str | None = None
        if ref is not None:
            if not isinstance(ref, dict) or not isinstance(ref.get("name"), str):
                raise RowError(
                    f"{AGENT_REF!r} is {json.dumps(ref)[:80]}, not an object with a name",
                    f'write "{AGENT_REF}": {{"name": "<agent instance>"}}, or drop it and pass agent=',
                )
            name = ref["name"]
        if name is not None and self.packaged_agents is not None and name not in self.packaged_agents:
            name = None  # upstream data naming another config's or a stale agent: use the dataset's own
        elif name is not None and self.known_agents is not None and name not in self.known_agents:
            assert self.env is not None
            choices = ", ".join(sorted(self.known_agents)) or "(none)"
            raise RowError(
                f"{AGENT_REF}.name {name!r} is not an agent of environment {self.env.name!r}",
                f"use one of its agents ({choices}), or drop {AGENT_REF} and pass agent=",
            )
        if name is None:
            name = self.fallback_agent
        if name is None:
            raise RowError(
                f"the row has no {AGENT_REF} and no agent was given",
                f'add "{AGENT_REF}": {{"name": "<agent instance>"}} to the row, or pass agent= or nemo_env=',
            )
        return self._interned.setdefault(name, name)

    def _unknown_params(self, unknown: list[str]) -> tuple[str, str]:
        import difflib

        openai_only = [k for k in unknown if k in _openai_params()]
        problem = f"{RESPONSES_CREATE_PARAMS} has key(s) nemo-gym rejects: {', '.join(map(repr, unknown))}"
        if openai_only:
            problem += f" ({', '.join(map(repr, openai_only))}: valid for OpenAI, not in this nemo-gym)"
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key, sorted(self.allowed_params), n=1, cutoff=0.75)
            if close:
                hints.append(f"{key!r} -> {close[0]!r}?")
        fix = "remove them, or move fields meant for the resources server to the row's top level"
        if hints:
            fix += f" (did you mean {', '.join(hints)})"
        return problem, f"{fix}; allowed: {', '.join(sorted(self.allowed_params))}"

    def error(self, line_no: int, problem: str, fix: str) -> TasksetError:
        return TasksetError(f"{self.path}:{line_no}: {problem}. Fix: {fix}.")


def local_root(root: str | Path | None) -> Path | None:
    """The Gym root to read nemo-gym's schema from when no environment names one (never builds one)."""
    if root is not None:
        return Path(root).expanduser()
    spec = importlib.util.find_spec("nemo_gym")
    return Path(spec.origin).parent.parent if spec is not None and spec.origin else None


@functools.lru_cache(maxsize=8)
def gym_params(root: Path | None) -> frozenset[str]:
    """The keys nemo-gym accepts in ``responses_create_params`` (it rejects any other).

    Read from the fields of ``NeMoGymResponseCreateParamsNonStreaming`` in the Gym root's
    ``nemo_gym/openai_utils.py`` (parsed, not imported); nemo-gym 0.4.0's fields when no source is found.
    """
    source = root / "nemo_gym" / "openai_utils.py" if root is not None else None
    if source is not None and source.is_file():
        try:
            tree = ast.parse(source.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
            tree = None
        for node in ast.walk(tree) if tree is not None else ():
            if isinstance(node, ast.ClassDef) and node.name == _GYM_PARAMS_CLASS:
                fields = frozenset(
                    s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
                )
                if "input" in fields:
                    return fields
        logger.debug("no %s in %s; using nemo-gym 0.4.0's fields", _GYM_PARAMS_CLASS, source)
    return NEMO_GYM_0_4_PARAMS


@functools.lru_cache(maxsize=1)
def _openai_params() -> frozenset[str]:
    """The keys of the OpenAI SDK's ``ResponseCreateParamsNonStreaming`` (for error hints only)."""
    try:
        from openai.types.responses.response_create_params import ResponseCreateParamsNonStreaming
    except ImportError:  # pragma: no cover - openai is a dependency
        return frozenset()
    keys: set[str] = set()
    for klass in ResponseCreateParamsNonStreaming.__mro__:
        keys.update(getattr(klass, "__annotations__", {}))
    return frozenset(keys)


def json_type(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")
