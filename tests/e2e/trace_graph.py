"""A verifiers trace record (a `traces.jsonl` line's trace, `Trace.to_record()`) read as the message graph it is.

verifiers' training client stores each distinct message once, as a node linked to its predecessor; a turn whose
prompt repeats earlier messages reuses their nodes, and a prompt that differs from what was sampled (a message, or
only its tokens) starts a new path. Every root-to-leaf path is a *branch*, and every branch is one training sample
(prime-rl's `trace_to_samples`). Read here without verifiers, which the suite's own venv does not have.
"""

from __future__ import annotations

from typing import Any


def nodes(trace: dict[str, Any]) -> list[dict[str, Any]]:
    return trace["nodes"]


def branches(trace: dict[str, Any]) -> list[list[int]]:
    """Each leaf's path from its root, as node indexes (verifiers' `Trace.branches` order: by leaf)."""
    graph = nodes(trace)
    parents = {node.get("parent") for node in graph}
    paths = []
    for leaf in (i for i in range(len(graph)) if i not in parents):
        path, at = [], leaf
        while at is not None:
            path.append(at)
            at = graph[at].get("parent")
        paths.append(path[::-1])
    return paths


def sampled(trace: dict[str, Any]) -> list[int]:
    """The nodes a model call produced, in order."""
    return [i for i, node in enumerate(nodes(trace)) if node["sampled"]]


def restated_assistants(trace: dict[str, Any]) -> list[int]:
    """Assistant nodes no model call produced: an echoed turn that did not match what was sampled."""
    return [i for i, node in enumerate(nodes(trace)) if node["message"]["role"] == "assistant" and not node["sampled"]]


def completion(node: dict[str, Any]) -> tuple[list[int], list[float]]:
    """A sampled node's sampled tokens (where its mask is set) and their logprobs."""
    tokens = [token for token, trained in zip(node["token_ids"], node["mask"], strict=True) if trained]
    return tokens, list(node["logprobs"])


def sample(trace: dict[str, Any], path: list[int]) -> tuple[list[int], list[bool]]:
    """A branch's training sample: its token sequence and loss mask (the concatenation of its nodes')."""
    graph = nodes(trace)
    return [t for i in path for t in graph[i]["token_ids"]], [m for i in path for m in graph[i]["mask"]]
