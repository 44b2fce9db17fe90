"""RolloutResult and the mapping of a Gym agent's ``/run`` answer onto it."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ._exceptions import GymEpisodeFailed, InvalidResult, RolloutError
from ._protocol import output_to_messages, sum_usage
from ._routing import PolicyCall, strip_route

_NOT_METRICS = frozenset({"reward", "mask_sample"})
_IDENTIFIER_SUFFIXES = ("_id", "_idx", "_index", "_ids")
_IDENTIFIERS = frozenset({"id", "idx", "index", "seed", "uid"})


def is_identifier(name: str) -> bool:
    """Whether a numeric field names something rather than measures it (``question_id``, ``index``...)."""
    lowered = name.lower()
    return lowered in _IDENTIFIERS or lowered.endswith(_IDENTIFIER_SUFFIXES)


@dataclass
class RolloutResult:
    """Everything one rollout produced: what a trainer or an eval needs, and why it failed if it did.

    A result with ``error`` set has ``reward is None`` (never a silent 0). A result Gym marked as no valid
    measurement (nemo-gym >= 0.7 ``mask_sample``: a judge that could not be reached, a lost session...) is
    ``masked``: it keeps Gym's reward, ``failure_kind`` and ``failure_reason``, and is left out of reward
    statistics and training (counted apart, like errors).
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
    failed_over: list[str] = field(default_factory=list)
    """Replicas (labels) this rollout's policy calls left because they did not connect or timed out; ``endpoint``
    is then the replica its last call went to."""
    masked: bool = False
    """Gym said this sample is no valid measurement (``mask_sample``): not scored, not trained on."""
    failure_kind: str | None = None
    """Gym's low-cardinality name of what went wrong (``judge_failed``...), masked or not."""
    failure_reason: str | None = None
    """Gym's free-text explanation of it."""
    row_fields: dict[str, Any] | None = None
    """The task row's own fields (what is not its input, agent or a verify output: a seed, a hidden answer...),
    saved beside ``gym_result`` so a replay of the saved run gets back the row it ran on."""
    training: dict[str, Any] | None = None
    """Under verifiers' training client (``eval --client-type train``): the training samples the rollout makes and
    where it forked (``_training.forks.training_record``)."""

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def scored(self) -> bool:
        """Whether the reward is a valid measurement: no error, not masked."""
        return self.error is None and not self.masked and self.reward is not None

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
            "masked": self.masked,
        }
        if self.failure_kind is not None or self.failure_reason is not None:
            out["failure_kind"], out["failure_reason"] = self.failure_kind, self.failure_reason
        if self.worker is not None:
            out["worker"] = self.worker
        if self.failed_over:
            out["failed_over"] = self.failed_over
        if self.training is not None:
            out["training"] = self.training
        if include_trace:
            out["trace"] = [_call_to_dict(call) for call in self.trace]
        if include_gym_result:
            out["gym_result"] = self.gym_result
            if self.row_fields is not None:
                out["row_fields"] = self.row_fields
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RolloutResult:
        """A results line (``to_dict``, as ``eval -s`` writes it in ``results.jsonl``) back as a result: its saved
        ``trace`` as ``PolicyCall`` objects (so ``training_samples(result.trace)`` works on a saved run), its error
        typed again. Keys it does not know are ignored."""
        error = data.get("error")
        return cls(
            task_index=int(data["task_index"]),
            rollout_index=int(data["rollout_index"]),
            example_id=data.get("example_id"),
            env=data.get("env"),
            agent=data.get("agent"),
            endpoint=data.get("endpoint"),
            prompt=list(data.get("prompt") or ()),
            completion=list(data.get("completion") or ()),
            reward=data.get("reward"),
            metrics=dict(data.get("metrics") or {}),
            usage=dict(data.get("usage") or {}),
            timing=dict(data.get("timing") or {}),
            trace=[PolicyCall.from_dict(call) for call in data.get("trace") or () if isinstance(call, Mapping)],
            error=RolloutError.from_dict(error) if isinstance(error, Mapping) else None,
            gym_result=data.get("gym_result"),
            worker=data.get("worker"),
            failed_over=list(data.get("failed_over") or ()),
            masked=bool(data.get("masked")),
            failure_kind=data.get("failure_kind"),
            failure_reason=data.get("failure_reason"),
            training=data.get("training"),
            row_fields=data.get("row_fields"),
        )


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
    """Every numeric or bool top-level field of a Gym result that measures something: not the reward,
    not ``mask_sample``, not an identifier (``question_id``, ``index``...)."""
    metrics = {}
    for key, value in gym_result.items():
        if key in _NOT_METRICS or is_identifier(key):
            continue
        if isinstance(value, bool) or (isinstance(value, int | float) and not math.isnan(value)):
            metrics[key] = float(value)
    return metrics


def map_gym_result(result: RolloutResult, gym_result: Any, route_key: str, model: str | None) -> None:
    """Fill ``result`` from a Gym agent's ``/run`` answer (in place): the answer itself (route key taken
    out), the completion messages, metrics, usage when the calls recorded none, and the reward (an invalid
    one is a typed error, never a silent 0)."""
    if not isinstance(gym_result, dict):
        result.error = InvalidResult(f"Gym result is a {type(gym_result).__name__}, not an object")
        return
    strip_route(gym_result, route_key, model)
    result.gym_result = gym_result
    response = gym_result.get("response") or {}
    output = response.get("output") if isinstance(response, dict) else None
    result.completion = output_to_messages(output or [])
    result.metrics = extract_metrics(gym_result)
    result.masked = gym_result.get("mask_sample") is True
    result.failure_kind = _text(gym_result.get("failure_kind"))
    result.failure_reason = _text(gym_result.get("failure_reason"))
    if not result.usage.get("total_tokens") and isinstance(response, dict):
        result.usage = sum_usage([response.get("usage")])
    failure = episode_failure(gym_result)
    if failure is not None:
        partial = gym_result.get("_ng_failure_partial_response")
        if not result.completion and isinstance(partial, dict):
            result.completion = output_to_messages(partial.get("output") or [])
        result.error = failure
        return
    try:
        result.reward = parse_reward(gym_result.get("reward"))
    except InvalidResult as exc:
        result.error = exc
        result.reward = None


FAILURE_CLASS_KEY = "_ng_failure_class"
FAILURE_TERMINAL_KEY = "_ng_failure_terminal"
"""How nemo-gym (>= 0.7) marks a result that is a failure, not a rollout: an environment server's ``failure``
(relayed as ``environment_server_failed``), an agent's or resources server's own failure row (Gym's collector files
these apart, and tries non-terminal ones again)."""


def episode_failure(gym_result: dict[str, Any]) -> GymEpisodeFailed | None:
    """The failure a Gym result reports (``_ng_failure_class``), unless Gym scored it as a masked sample (a judge
    that failed: ``mask_sample`` with its reward, counted apart, never an error)."""
    kind = gym_result.get(FAILURE_CLASS_KEY)
    if not kind or gym_result.get("mask_sample") is True:
        return None
    terminal = gym_result.get(FAILURE_TERMINAL_KEY) is True
    stage = gym_result.get("_ng_failure_stage")
    message = gym_result.get("_ng_failure_message") or gym_result.get("error") or "(no message)"
    where = f" at {stage}" if stage else ""
    return GymEpisodeFailed(f"{kind}{where}{' (terminal)' if terminal else ''}: {message}")


def is_retryable_failure(gym_result: Any) -> bool:
    """Whether Gym would try this result's episode again: a failure it did not mark terminal."""
    return (
        isinstance(gym_result, dict)
        and episode_failure(gym_result) is not None
        and not gym_result.get(FAILURE_TERMINAL_KEY)
    )


def _text(value: Any) -> str | None:
    return None if value is None else str(value)
