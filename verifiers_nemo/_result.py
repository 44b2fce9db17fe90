"""RolloutResult and the mapping of a Gym agent's ``/run`` answer onto it."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from ._exceptions import InvalidResult, RolloutError
from ._routing import ROUTE_METADATA_KEY

_NOT_METRICS = {"reward"}


@dataclass
class RolloutResult:
    """Everything one rollout produced: what a trainer or an eval needs, and why it failed if it did.

    A result with ``error`` set has ``reward is None`` (never a silent 0).
    """

    task_index: int
    rollout_index: int
    example_id: str | int | None = None
    env: str | None = None
    agent: str | None = None
    endpoint: str | None = None
    """The endpoint's label (model@url), never its key."""
    prompt: list[dict[str, Any]] = field(default_factory=list)
    completion: list[dict[str, Any]] = field(default_factory=list)
    reward: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    usage: dict[str, int] = field(default_factory=dict)
    timing: dict[str, float] = field(default_factory=dict)
    trace: list[Any] = field(default_factory=list)
    """The policy calls of this rollout in order (``PolicyCall`` objects), token IDs included."""
    error: RolloutError | None = None
    gym_result: dict[str, Any] | None = None
    worker: str | None = None
    """Where the rollout ran when not in this process: ``ray:<node id>:<pid>`` of its Ray actor."""

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_dict(self, *, include_trace: bool = False, include_gym_result: bool = False) -> dict[str, Any]:
        """A JSON-safe dict, one line of a results file."""
        out: dict[str, Any] = {
            "task_index": self.task_index,
            "rollout_index": self.rollout_index,
            "example_id": self.example_id,
            "env": self.env,
            "agent": self.agent,
            "endpoint": self.endpoint,
            "prompt": self.prompt,
            "completion": self.completion,
            "reward": self.reward,
            "metrics": self.metrics,
            "usage": self.usage,
            "timing": self.timing,
            "error": self.error.to_dict() if self.error else None,
        }
        if self.worker is not None:
            out["worker"] = self.worker
        if include_trace:
            out["trace"] = [_call_to_dict(call) for call in self.trace]
        if include_gym_result:
            out["gym_result"] = self.gym_result
        return out


def _call_to_dict(call: Any) -> Any:
    if hasattr(call, "to_dict"):
        return call.to_dict()
    try:
        return asdict(call)
    except TypeError:
        return call


def parse_reward(value: Any) -> float:
    """A reward as float: a number or a numeric string; bools, NaN and anything else are invalid."""
    if isinstance(value, bool):
        raise InvalidResult(f"reward is a bool ({value!r}), not a number")
    if isinstance(value, int | float):
        reward = float(value)
    elif isinstance(value, str):
        try:
            reward = float(value.strip())
        except ValueError:
            raise InvalidResult(f"reward {value!r} is a string that is not a number") from None
    elif value is None:
        raise InvalidResult("the Gym result has no reward")
    else:
        raise InvalidResult(f"reward {value!r} ({type(value).__name__}) is not a number")
    if math.isnan(reward):
        raise InvalidResult("reward is NaN")
    return reward


def extract_metrics(gym_result: dict[str, Any]) -> dict[str, float]:
    """Every numeric or bool top-level field of a Gym result other than the reward."""
    metrics = {}
    for key, value in gym_result.items():
        if key in _NOT_METRICS:
            continue
        if isinstance(value, bool) or (isinstance(value, int | float) and not math.isnan(value)):
            metrics[key] = float(value)
    return metrics


def sum_usage(usages: list[dict[str, Any] | None]) -> dict[str, int]:
    """Token usage summed over a rollout's policy calls."""
    total = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0, "cached_tokens": 0, "reasoning_tokens": 0}
    for usage in usages:
        if not usage:
            continue
        total["input_tokens"] += int(usage.get("input_tokens") or 0)
        total["output_tokens"] += int(usage.get("output_tokens") or 0)
        total["total_tokens"] += int(usage.get("total_tokens") or 0)
        total["cached_tokens"] += int((usage.get("input_tokens_details") or {}).get("cached_tokens") or 0)
        total["reasoning_tokens"] += int((usage.get("output_tokens_details") or {}).get("reasoning_tokens") or 0)
    return total


def strip_route(gym_result: dict[str, Any], key: str, model: str | None) -> None:
    """Remove the route key from the echo of ``responses_create_params`` in a Gym result (in place)."""
    _strip_route_from(gym_result.get("responses_create_params"), key, model, empty_metadata=None)
    _strip_route_from(gym_result.get("response"), key, model, empty_metadata={})


def _strip_route_from(echo: Any, key: str, model: str | None, *, empty_metadata: dict[str, Any] | None) -> None:
    """``empty_metadata`` replaces metadata left empty: the request had none (``None``), while a
    Response keeps its (empty) object."""
    if not isinstance(echo, dict):
        return
    if echo.get("model") == key:
        echo["model"] = model
    metadata = echo.get("metadata")
    if isinstance(metadata, dict):
        metadata.pop(ROUTE_METADATA_KEY, None)
        if not metadata:
            echo["metadata"] = empty_metadata
