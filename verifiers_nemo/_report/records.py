"""One saved rollout as the report reads it: a line of our ``results.jsonl``, or one trace of an episode of
verifiers' ``traces.jsonl``, into one ``Rollout`` shape.

Its ``status`` is ``scored``, ``error`` (a typed failure: no reward) or ``masked`` (Gym said its reward is no
valid measurement: ``mask_sample``/``failure_kind``), so the report counts each apart and never scores a failure
as 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .._eval.token_ids import record_token_ids
from .transcript import Strings, from_messages, from_policy_calls, from_trace_nodes

_NOT_METRICS = {"mask_sample", "masked"}


@dataclass(slots=True)
class Rollout:
    """One rollout as the report shows it (``transcript`` is the compact shape of ``transcript.py``)."""

    env: str
    task: str
    """The task's key across runs: the example id when recorded, else the task index."""
    rollout_index: int
    """Which of the task's repeats (``-r``) this is, from 0."""
    status: str
    """``scored``, ``error`` or ``masked``."""
    reward: float | None = None
    kind: str | None = None
    """The error's type, or a masked row's ``failure_kind``."""
    message: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    turns: int = 0
    tool_calls: int = 0
    input_tokens: int | None = None
    output_tokens: int | None = None
    latency_s: float | None = None
    call_latencies: list[float] = field(default_factory=list)
    recorded_reward: float | None = None
    transcript: dict[str, Any] = field(default_factory=dict)
    token_ids: dict[str, Any] | None = None
    """Whether its recorded token IDs are contiguous (``rollout_token_ids``); None when none were recorded."""
    task_index: int | None = None
    """The run's own number of the task (our results), which tells two rows of the same example id apart."""
    samples: int | None = None
    """Under verifiers' training client: the training samples (message-graph branches) the rollout makes."""
    fork: dict[str, Any] | None = None
    """Where its first fork is and why (``_training.forks``), when it forked."""
    policy_versions: dict[str, Any] | None = None
    """The policy versions its turns were sampled under, where the engine labelled them
    (``_training.policy_versions``)."""

    @property
    def group(self) -> tuple[str, str | int]:
        """The task it belongs to within its run (its statistics are per task)."""
        return (self.env, self.task if self.task_index is None else self.task_index)


def _number(value: Any) -> float | None:
    """A finite number as a float (None for anything else, booleans included)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _metrics(raw: Any) -> dict[str, float]:
    out = {}
    for name, value in (raw or {}).items() if isinstance(raw, Mapping) else ():
        numeric = value if isinstance(value, bool) else _number(value)
        if name not in _NOT_METRICS and numeric is not None:
            out[str(name)] = float(numeric)
    return out


def _masking(*sources: Any) -> tuple[bool, str | None, str | None]:
    """Whether Gym masked the rollout (``mask_sample``/``masked``), and its ``failure_kind``/``failure_reason``."""
    masked, kind, reason = False, None, None
    for source in sources:
        if not isinstance(source, Mapping):
            continue
        if source.get("mask_sample") in (True, 1, 1.0) or source.get("masked") in (True, 1, 1.0):
            masked = True
        failure = source.get("failure") if isinstance(source.get("failure"), Mapping) else {}
        kind = kind or source.get("failure_kind") or failure.get("kind")
        reason = reason or source.get("failure_reason") or failure.get("reason")
    return masked, (str(kind) if kind else None), (str(reason) if reason else None)


def _status(error: Any, reward: float | None, masked: bool) -> str:
    if error or (reward is None and not masked):
        return "error"
    return "masked" if masked else "scored"


def rollout_of_record(record: Mapping[str, Any], default_env: str, strings: Strings | None) -> Rollout:
    """A line of our ``results.jsonl`` (it has ``task_index`` and ``rollout_index``). ``strings``: the table its
    transcript's long texts go to (None: texts kept as they are)."""
    error = record.get("error")
    reward = _number(record.get("reward"))
    metrics_raw = record.get("metrics") or {}
    masked, failure_kind, failure_reason = _masking(record, metrics_raw, record.get("gym_result"))
    trace = record.get("trace")
    if isinstance(trace, list) and trace:
        transcript = from_policy_calls([c for c in trace if isinstance(c, Mapping)], strings)
    else:
        transcript = from_messages(record.get("prompt") or [], record.get("completion") or [], strings)
    usage = record.get("usage") or {}
    timing = record.get("timing") or {}
    example_id = record.get("example_id")
    task_index = record["task_index"]
    rollout = Rollout(
        env=str(record.get("env") or default_env),
        task=str(example_id if example_id not in (None, "") else task_index),
        rollout_index=int(record["rollout_index"]),
        status=_status(error, reward, masked),
        reward=reward,
        metrics=_metrics(metrics_raw),
        input_tokens=_count(usage.get("input_tokens")),
        output_tokens=_count(usage.get("output_tokens")),
        latency_s=_number(timing.get("rollout_s")),
        recorded_reward=_number(record.get("recorded_reward")),
        transcript=transcript,
        token_ids=record_token_ids(record),
        task_index=task_index if isinstance(task_index, int) and not isinstance(task_index, bool) else None,
    )
    training = record.get("training")
    if isinstance(training, Mapping):
        rollout.samples = _count(training.get("branches"))
        rollout.fork = training.get("fork") if isinstance(training.get("fork"), Mapping) else None
        versions = training.get("policy_versions")
        rollout.policy_versions = dict(versions) if isinstance(versions, Mapping) else None
    return _finished(rollout, error, failure_kind, failure_reason)


def trace_task(episode: Mapping[str, Any], trace: Mapping[str, Any]) -> tuple[str, str]:
    """The environment and task of one trace of a verifiers episode."""
    task_data = ((episode.get("task") or {}).get("data")) or {}
    gym = ((trace.get("info") or {}).get("nemo_gym")) or {}
    env = str(gym.get("env") or task_data.get("nemo_env") or (episode.get("env") or {}).get("id") or "?")
    task_id = task_data.get("id", task_data.get("idx", (episode.get("task") or {}).get("key", "?")))
    return env, str(task_id)


def rollout_of_trace(
    episode: Mapping[str, Any], trace: Mapping[str, Any], rollout_index: int, strings: Strings | None
) -> Rollout:
    """One trace of an episode of verifiers' ``traces.jsonl`` (``rollout_index``: which of its task's traces)."""
    task_data = ((episode.get("task") or {}).get("data")) or {}
    gym = ((trace.get("info") or {}).get("nemo_gym")) or {}
    env, task = trace_task(episode, trace)
    rewards = trace.get("rewards") or {}
    reward = _number(gym.get("reward"))
    if reward is None and "reward" not in gym:
        scores = [
            (v.get("score"), v.get("weight", 1.0)) if isinstance(v, Mapping) else (v, 1.0) for v in rewards.values()
        ]
        numbers = [(s, w) for s, w in scores if _number(s) is not None and _number(w) is not None]
        reward = math.fsum(s * w for s, w in numbers) if numbers else None
    errors = [e for e in trace.get("errors") or [] if isinstance(e, Mapping)]
    error: Any = gym.get("error") or (errors[0] if errors else None)
    if not error and trace.get("ok") is False:
        error = {"type": "error", "message": "verifiers marked the trace failed"}
    masked, failure_kind, failure_reason = _masking(gym, gym.get("metrics"), trace.get("metrics"))
    if error:
        reward = None
    timing = gym.get("timing") or {}
    latency = _number(timing.get("rollout_s"))
    if latency is None:
        agent = (trace.get("timing") or {}).get("agent") or {}
        if _number(agent.get("end")) is not None and _number(agent.get("start")) is not None:
            latency = float(agent["end"]) - float(agent["start"])
    rollout = Rollout(
        env=env,
        task=task,
        rollout_index=rollout_index,
        status=_status(error, reward, masked),
        reward=reward,
        metrics=_metrics(trace.get("metrics") or gym.get("metrics")),
        input_tokens=_count(trace.get("num_input_tokens")),
        output_tokens=_count(trace.get("num_output_tokens")),
        latency_s=latency,
        recorded_reward=_number(task_data.get("recorded_reward")),
        transcript=from_trace_nodes(trace, strings),
        token_ids=gym.get("token_ids") if isinstance(gym.get("token_ids"), Mapping) else None,
    )
    branches = _number((trace.get("metrics") or {}).get("branches"))
    rollout.samples = int(branches) if branches is not None else None
    return _finished(rollout, error, failure_kind, failure_reason)


def _fill_error(rollout: Rollout, error: Any, failure_kind: str | None, failure_reason: str | None) -> None:
    if rollout.status == "error":
        if isinstance(error, Mapping):
            rollout.kind, rollout.message = str(error.get("type") or "error"), str(error.get("message") or "")
        else:
            rollout.kind, rollout.message = "error", str(error or "the rollout has no reward")
    elif failure_kind or failure_reason or rollout.status == "masked":
        rollout.kind = failure_kind or ("masked" if rollout.status == "masked" else None)
        rollout.message = failure_reason


def _finished(rollout: Rollout, error: Any, failure_kind: Any, failure_reason: Any) -> Rollout:
    """``rollout`` with its error (or failure), turns and per-call latencies filled in."""
    _fill_error(rollout, error, failure_kind, failure_reason)
    messages, calls = rollout.transcript["m"], rollout.transcript["c"]
    replies = {m["k"] for m in messages if "k" in m}
    rollout.turns = len(calls) or len(replies)
    rollout.tool_calls = sum(len(m.get("tc") or ()) for m in messages)
    rollout.call_latencies = [c["lat"] for c in calls if isinstance(c.get("lat"), float)]
    return rollout
