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


def check_one_sample_each(traces: list[dict[str, Any]], replies: list[dict[str, Any]], *, turns: int) -> None:
    """Every rollout verified by Gym, at least ``turns`` sampled turns, one branch (one training sample), no echoed
    assistant turn that differs from what was sampled, and each sampled turn's tokens and logprobs the engine's
    (``replies``: what the engine answered, `tests/e2e/train_engines.py`)."""
    import pytest

    for trace in traces:
        outcome = trace["info"]["nemo_gym"]
        assert trace["ok"] and outcome["error"] is None, (trace["errors"], outcome["error"])
        assert outcome["reward"] is not None  # Gym's /verify ran
        turns_sampled = sampled(trace)
        assert len(turns_sampled) >= turns, len(turns_sampled)
        assert restated_assistants(trace) == [], "an echoed turn differs from the sampled one"
        (path,) = branches(trace)  # one branch: one training sample
        assert trace["metrics"]["branches"] == 1.0  # what vf-eval's summary and prime-rl's metrics show
        _, mask = sample(trace, path)
        assert sum(mask) == sum(len(completion(trace["nodes"][i])[0]) for i in turns_sampled)
        for i in turns_sampled:
            tokens, logprobs = completion(trace["nodes"][i])
            assert any(  # the tokens and logprobs of one of the engine's replies (records keep 4 decimals)
                reply["token_ids"] == tokens and logprobs == pytest.approx(reply["logprobs"], abs=1e-4)
                for reply in replies
            ), "a sampled turn's tokens or logprobs are not what the engine generated"
