"""What a rollout trains on, read from its verifiers trace (the message graph the training client records): how
many training samples it makes and, where a turn forked, the first place and the reason.

verifiers matches each turn's prompt, message by message, against what the rollout already holds (a message hash:
role, content, reasoning, tool calls with canonical arguments; then the exact tokens). A prompt that restates an
earlier message differently (the agent dropped the reasoning, changed a tool call, merged or re-roled messages)
or renders the same message to other tokens than were sampled (no bridge: the template re-renders it) starts a new
branch, and every branch is one training sample (prime-rl's ``trace_to_samples``)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from .policy_versions import policy_versions

SNIPPET_TOKENS = 12
"""Tokens shown each side of where a fork's tokens first differ."""

Decode = Callable[[list[int]], str]


def training_record(trace: Any, decode: Decode | None = None) -> dict[str, Any]:
    """The ``training`` field of a result: ``samples`` (branches that train), ``branches``, ``turns`` (sampled
    model calls), ``loss_tokens``/``tokens`` over the samples, ``fork`` (the first) where a turn forked, and
    ``policy_versions`` where the engine labelled its samples (``policy_versions.policy_versions``)."""
    branches = trace.branches
    trainable = trace.agent is None or trace.agent.trainable
    record: dict[str, Any] = {
        "branches": len(branches),
        "samples": sum(1 for branch in branches if branch.trainable) if trainable else 0,
        "turns": trace.num_turns,
        "tokens": sum(len(branch.token_ids) for branch in branches),
        "loss_tokens": int(sum(sum(branch.sampled_mask) for branch in branches)),
    }
    if not trainable:
        record["untrainable"] = True
    calls = {id(trace.nodes[call.node]): i for i, call in enumerate(trace.calls, 1) if call.node is not None}
    fork = first_fork([branch.nodes for branch in branches], decode, call_of=lambda node: calls.get(id(node)))
    if fork is not None:
        record["fork"] = fork
    versions = policy_versions(trace)
    if versions is not None:
        record["policy_versions"] = versions
    return record


USER_TURN_HINT = (
    "; this turn adds a user message, where a renderer whose thinking_retention is tool_cycle (qwen3's default) "
    'renders the conversation again: --renderer-config \'{"thinking_retention": "all"}\' continues it instead'
)


def first_fork(
    paths: Sequence[Sequence[Any]], decode: Decode | None = None, call_of: Callable[[Any], int | None] | None = None
) -> dict[str, Any] | None:
    """Where the second root-to-leaf path (in graph order) leaves the first: the model call whose prompt forked
    (``turn``, 1-based: ``call_of`` numbers a sampled node's call; else the assistant messages before it, plus one),
    the prompt message
    (``message``, 0-based) and its ``role``, the token where the two samples first differ, ``cause`` (``restated``:
    the agent sent the message back changed; ``retokenized``: the same message rendered to other tokens) with a
    ``detail``; None with one path."""
    if len(paths) < 2:
        return None
    earlier, path = paths[0], paths[1]
    shared = _shared(path, earlier)
    if shared >= len(path) or shared >= len(earlier):
        return None
    node, sibling = path[shared], earlier[shared]
    tokens, sibling_tokens = _tokens(path), _tokens(earlier)
    at = _common_prefix(tokens, sibling_tokens)
    changes = message_changes(sibling.message, node.message)
    forked_call = next((n for n in path[shared:] if n.sampled), None)
    turn = call_of(forked_call) if call_of is not None and forked_call is not None else None
    end = next((i for i, n in enumerate(path) if n is forked_call), len(path))
    if turn is None:  # each assistant message before the forked call was a model turn
        turn = sum(1 for n in path[:end] if _role(n.message) == "assistant") + 1
    detail = (
        "; ".join(changes)
        if changes
        else (
            f"the {_role(node.message)} message is the same, its tokens are not: rendered again, not continued from "
            "what was sampled"
        )
    )
    tail = path[shared:end]
    if not changes and any(_role(n.message) == "user" for n in tail):
        detail += USER_TURN_HINT
    fork: dict[str, Any] = {
        "turn": turn,
        "message": shared,
        "role": _role(node.message),
        "token": at,
        "cause": "restated" if changes else "retokenized",
        "detail": detail,
    }
    if decode is not None:
        fork["sampled"] = decode(sibling_tokens[max(0, at - SNIPPET_TOKENS) : at + SNIPPET_TOKENS])
        fork["rendered"] = decode(tokens[max(0, at - SNIPPET_TOKENS) : at + SNIPPET_TOKENS])
    return fork


def message_changes(before: Any, after: Any) -> list[str]:
    """How ``after`` restates ``before`` differently, field by field, as verifiers' message hash sees them."""
    a, b = _fields(before), _fields(after)
    changes = []
    if a["role"] != b["role"]:
        changes.append(f"role {a['role']} became {b['role']}")
    for name in ("content", "reasoning_content"):
        if a[name] != b[name]:
            if a[name] and not b[name]:
                changes.append(f"{name} dropped ({_clip(a[name])})")
            elif b[name] and not a[name]:
                changes.append(f"{name} added ({_clip(b[name])})")
            else:
                changes.append(f"{name} {_clip(a[name])} became {_clip(b[name])}")
    if a["tool_calls"] != b["tool_calls"]:
        changes.append(f"tool calls {_clip(a['tool_calls'])} became {_clip(b['tool_calls'])}")
    if a["tool_call_id"] != b["tool_call_id"]:
        changes.append(f"tool_call_id {a['tool_call_id']} became {b['tool_call_id']}")
    return changes


def _fields(message: Any) -> dict[str, Any]:
    data = message.model_dump(mode="json") if hasattr(message, "model_dump") else dict(message)
    content = data.get("content")
    if isinstance(content, list):
        content = json.dumps(content, sort_keys=True)
    calls = [
        (call.get("id"), call.get("name"), _canonical(call.get("arguments")))
        for call in data.get("tool_calls") or ()
        if isinstance(call, dict)
    ]
    return {
        "role": data.get("role"),
        "content": content or "",
        "reasoning_content": data.get("reasoning_content"),
        "tool_calls": calls,
        "tool_call_id": data.get("tool_call_id"),
    }


def _canonical(arguments: Any) -> Any:
    try:
        return json.dumps(json.loads(arguments), sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError):
        return arguments


def _role(message: Any) -> str:
    return str(getattr(message, "role", None) or (message.get("role") if isinstance(message, dict) else "?"))


def _shared(path: Sequence[Any], other: Sequence[Any]) -> int:
    count = 0
    for a, b in zip(path, other, strict=False):
        if a is not b:
            break
        count += 1
    return count


def _tokens(path: Sequence[Any]) -> list[int]:
    tokens: list[int] = []
    for node in path:
        tokens.extend(node.token_ids)
    return tokens


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _clip(value: Any, limit: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    text = json.dumps(text) if isinstance(value, str) else text
    return text if len(text) <= limit else text[: limit - 3] + "..."
