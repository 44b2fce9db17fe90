"""What every training-data format reads of one rollout, taken from a ``results.jsonl`` line (or a live
``RolloutResult``, through its ``to_dict``): who it is, how it ended, its messages and tools, and its training samples
rebuilt from the saved policy calls. Plain JSON values only, so a rollout waiting for its task's other rollouts can be
written to disk and read back (``grouping``)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .._protocol import to_chat_tools
from .._routing.trace import PolicyCall
from .._routing.training_sample import training_samples
from .._training.policy_versions import ordered
from .schema import MESSAGE_FIELDS

SCORED, MASKED, ERROR = "scored", "masked", "error"
_MESSAGE_KEYS = tuple(field for field, _ in MESSAGE_FIELDS)


def rollout_of(record: Mapping[str, Any], model: str | None, run_id: str | None) -> dict[str, Any]:
    """The view of one results line the formats read (a dict of JSON values; see the module)."""
    error = record.get("error")
    reward = record.get("reward")
    if isinstance(error, Mapping):
        status, error_type = ERROR, str(error.get("type") or "error")
    elif record.get("masked"):
        status, error_type = MASKED, None
    elif isinstance(reward, int | float) and not isinstance(reward, bool):
        status, error_type = SCORED, None
    else:
        status, error_type = ERROR, "invalid_result"
    trace = [call for call in record.get("trace") or () if isinstance(call, Mapping)]
    samples = _samples(trace)
    return {
        "run_id": run_id,
        "env": record.get("env"),
        "model": model or _model_of(record.get("endpoint")),
        "task_index": int(record["task_index"]),
        "example_id": None if record.get("example_id") is None else str(record["example_id"]),
        "rollout_index": int(record["rollout_index"]),
        "status": status,
        "reward": float(reward) if status != ERROR and isinstance(reward, int | float) else None,
        "error_type": error_type,
        "failure_kind": record.get("failure_kind"),
        "policy_versions": _versions(record.get("training")),
        "prompt": [normal_message(m) for m in record.get("prompt") or () if isinstance(m, Mapping)],
        "completion": [normal_message(m) for m in record.get("completion") or () if isinstance(m, Mapping)],
        "tools": _tools(record, trace),
        "tools_known": isinstance(record.get("gym_result"), Mapping) or bool(trace),
        "samples": samples,
    }


def weight(rollout: Mapping[str, Any]) -> int:
    """About how many bytes the rollout takes in memory (what a group waiting for its other rollouts holds)."""
    text = sum(len(m.get("content") or "") for key in ("prompt", "completion") for m in rollout[key])
    tokens = sum(len(s["prompt_token_ids"]) + 3 * len(s["completion_token_ids"]) for s in rollout["samples"] or ())
    return 1_000 + 2 * text + 40 * tokens + len(rollout["tools"] or "")


def calls_tools(rollout: Mapping[str, Any]) -> bool:
    """Whether the rollout's messages hold a tool call (so a chat template needs the tools' definitions)."""
    return any(m.get("tool_calls") for m in rollout["completion"]) or any(
        m.get("tool_calls") for m in rollout["prompt"]
    )


def normal_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A chat message with exactly the keys of the ``messages`` column (null where it has none): text content, tool
    calls with JSON-text arguments, an output item with no chat form as JSON text."""
    out = dict.fromkeys(_MESSAGE_KEYS)
    out["role"] = str(message.get("role") or "assistant")
    content = message.get("content")
    out["content"] = content if isinstance(content, str) or content is None else json.dumps(content)
    if message.get("reasoning_content"):
        out["reasoning_content"] = str(message["reasoning_content"])
    calls = message.get("tool_calls")
    if calls:
        out["tool_calls"] = [_tool_call(call) for call in calls if isinstance(call, Mapping)]
    if message.get("tool_call_id") is not None:
        out["tool_call_id"] = str(message["tool_call_id"])
    if message.get("item") is not None:
        out["item"] = json.dumps(message["item"])
    return out


def _tool_call(call: Mapping[str, Any]) -> dict[str, Any]:
    function = call.get("function") if isinstance(call.get("function"), Mapping) else {}
    arguments = function.get("arguments", "")
    return {
        "id": None if call.get("id") is None else str(call["id"]),
        "type": str(call.get("type") or "function"),
        "function": {
            "name": None if function.get("name") is None else str(function["name"]),
            "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
        },
    }


def _samples(trace: list[Mapping[str, Any]]) -> list[dict[str, Any]] | None:
    """The rollout's training samples (``training_samples`` over its saved calls); None when no call has token
    IDs."""
    calls = [_token_call(call) for call in trace]
    if not any(call.ok and call.has_tokens for call in calls):
        return None
    return [sample.to_dict() for sample in training_samples(calls).samples]


def _token_call(saved: Mapping[str, Any]) -> PolicyCall:
    """A saved call as far as ``training_samples`` reads it: its index, whether it was answered, its tokens (the
    request and reply bodies stay out: a long rollout's calls repeat the whole conversation)."""
    answered = saved.get("response") is not None and not saved.get("error")
    return PolicyCall(
        index=int(saved.get("index") or 0),
        status=int(saved.get("status") or 0),
        latency_s=0.0,
        attempts=1,
        started_at=0.0,
        response_json=b"{}" if answered else None,
        prompt_token_ids=saved.get("prompt_token_ids"),
        completion_token_ids=saved.get("completion_token_ids"),
        completion_logprobs=saved.get("completion_logprobs"),
    )


def _tools(record: Mapping[str, Any], trace: list[Mapping[str, Any]]) -> str | None:
    """The tools offered, as JSON text in Chat Completions form: from Gym's own record of the rollout, else the first
    policy call's request; None when neither was saved or there were none."""
    gym = record.get("gym_result")
    params = gym.get("responses_create_params") if isinstance(gym, Mapping) else None
    tools = params.get("tools") if isinstance(params, Mapping) else None
    if tools is None and trace and isinstance(trace[0].get("request"), Mapping):
        tools = trace[0]["request"].get("tools")
    if not tools or not isinstance(tools, list):
        return None
    return json.dumps(to_chat_tools(tools), ensure_ascii=False)


def _model_of(endpoint: Any) -> str | None:
    """The model of an endpoint label (``model@url``)."""
    if not isinstance(endpoint, str) or not endpoint:
        return None
    return endpoint.rsplit("@", 1)[0] if "@" in endpoint else endpoint


def _versions(training: Any) -> list[str] | None:
    record = training.get("policy_versions") if isinstance(training, Mapping) else None
    if not isinstance(record, Mapping):
        return None
    seen = [str(v) for turn in record.get("by_turn") or () for v in turn]
    seen = seen or [str(record[k]) for k in ("oldest", "newest") if record.get(k) is not None]
    return ordered(seen) or None
