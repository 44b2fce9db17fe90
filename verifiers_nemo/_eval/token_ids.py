"""Whether recorded token IDs are training-grade: per rollout (``rollout_token_ids``, saved on its result line
and in verifiers' trace info) and over a run (``TokenIdsTally``, a record at a time, or ``summarize_token_ids``;
in ``metadata.json``), described in one place (``describe_token_ids``) for the console summary, the HTML report
and the exact-token warnings.

A multi-turn rollout is *contiguous* when each policy call's prompt starts with the previous call's prompt +
completion (``check_contiguity``): its calls are then one training sample (``training_samples``). Where it is
not, the first break says which call and why.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .._routing.trace import PolicyCall, check_contiguity
from .._routing.training_sample import training_samples

FIX = "for training-exact tokens use --exact-tokens with vLLM --enable-scale-out"
"""What gives contiguous token IDs (the CLI's words; ``Endpoint(exact_tokens=True)`` in Python)."""
EXACT_BREAK = (
    "that turn was generated from a fresh rendering (the agent changed the history, or the template rewrites "
    "it: the log's 'exact tokens' warning says which), so the rollout is cut into several training samples"
)
"""Why a rollout breaks although exact tokens were asked for, and what that means for training."""
VERIFIERS_FIX = (
    "verifiers' interception re-renders every turn; for training-exact tokens run the environment with "
    "verifiers-nemo eval --exact-tokens (or Endpoint(exact_tokens=True)) against vLLM --enable-scale-out"
)
"""The fix where the calls went through verifiers (which serves no render route for exact tokens)."""
KEPT_BREAKS = 10
"""Breaks listed in a run's summary (the count covers them all)."""


def rollout_token_ids(trace: Sequence[PolicyCall | Mapping[str, Any]]) -> dict[str, Any] | None:
    """A rollout's token-ID record: its successful ``calls``, whether they are ``contiguous``, the training
    ``samples`` they give and, when broken, the call it broke at (``broken_at``) and why (``reason``).

    ``trace``: its ``PolicyCall``s, or their saved dicts (``PolicyCall.to_dict``). None when no call recorded
    token IDs."""
    calls = [call if isinstance(call, PolicyCall) else _call_of(call) for call in trace]
    ok = [call for call in calls if call.ok]
    if not any(call.has_tokens for call in ok):
        return None
    check = check_contiguity(calls)
    entry: dict[str, Any] = {
        "calls": len(ok),
        "contiguous": check.ok,
        "samples": len(training_samples(calls).samples),
    }
    if not check.ok:
        entry["broken_at"] = check.broken_at
        entry["reason"] = check.message.removeprefix(f"call {check.broken_at}: ").removeprefix(
            f"call {check.broken_at} "
        )
    return entry


def record_token_ids(record: Mapping[str, Any]) -> dict[str, Any] | None:
    """The token-ID record of a result line: its own, else one made from its saved trace (lines written before
    results carried it)."""
    entry = record.get("token_ids")
    if isinstance(entry, Mapping):
        return dict(entry)
    trace = record.get("trace")
    if isinstance(trace, list) and trace:
        return rollout_token_ids([call for call in trace if isinstance(call, Mapping)])
    return None


class TokenIdsTally:
    """A run's token-ID figures, one record at a time (``summarize_token_ids``): counts and the first
    ``KEPT_BREAKS`` breaks."""

    def __init__(self, *, exact_tokens: bool, fix: str = FIX) -> None:
        self.exact_tokens = exact_tokens
        self.fix = fix
        self.rollouts = self.multi_turn = self.contiguous = 0
        self.breaks: list[dict[str, Any]] = []

    def add(self, record: Mapping[str, Any]) -> None:
        entry = record_token_ids(record)
        if entry is None:
            return
        self.rollouts += 1
        if entry["calls"] < 2:
            return
        self.multi_turn += 1
        if entry["contiguous"]:
            self.contiguous += 1
        elif len(self.breaks) < KEPT_BREAKS:
            self.breaks.append(
                {
                    "task_index": record.get("task_index"),
                    "rollout_index": record.get("rollout_index"),
                    "call": entry.get("broken_at"),
                    "reason": entry.get("reason"),
                }
            )

    def summary(self) -> dict[str, Any] | None:
        """The figures (None when no rollout recorded token IDs)."""
        if not self.rollouts:
            return None
        summary: dict[str, Any] = {
            "rollouts": self.rollouts,
            "multi_turn": self.multi_turn,
            "contiguous": self.contiguous,
            "exact_tokens": self.exact_tokens,
            "breaks": list(self.breaks),
        }
        if not self.exact_tokens:
            summary["fix"] = self.fix
        elif self.contiguous < self.multi_turn:
            summary["fix"] = EXACT_BREAK
        return summary


def summarize_token_ids(
    records: Iterable[Mapping[str, Any]], *, exact_tokens: bool, fix: str = FIX
) -> dict[str, Any] | None:
    """A run's token-ID figures from its records (each with ``task_index``, ``rollout_index`` and a
    ``token_ids`` record, or a saved trace): rollouts with token IDs, multi-turn ones, contiguous ones, the first
    breaks and the fix (``fix`` when the run did not ask for exact tokens). None when no rollout recorded token
    IDs."""
    tally = TokenIdsTally(exact_tokens=exact_tokens, fix=fix)
    for record in records:
        tally.add(record)
    return tally.summary()


def describe_token_ids(summary: Mapping[str, Any]) -> str:
    """The figures as one sentence, its fix last after ``; `` (the summary's ``Token IDs`` line, the report)."""
    rollouts, multi, contiguous = summary["rollouts"], summary["multi_turn"], summary["contiguous"]
    exact, fix = summary.get("exact_tokens"), summary.get("fix")
    breaks = summary.get("breaks") or []
    where = f"at call {breaks[0]['call']}: {breaks[0]['reason']}" if breaks else "at a call"
    if not multi:
        text = f"{rollouts} rollouts with token IDs, none multi-turn (each is one training sample)"
    elif contiguous == multi and exact:
        text = f"{contiguous} of {multi} multi-turn rollouts contiguous (exact tokens): each is one training sample"
    elif contiguous == multi:
        text = (
            f"{contiguous} of {multi} multi-turn rollouts contiguous (each turn re-rendered by the server: "
            "contiguous here, not guaranteed)"
        )
    elif exact:
        first = _rollout(breaks[0] if breaks else None)
        text = (
            f"WARNING: {contiguous} of {multi} multi-turn rollouts contiguous despite --exact-tokens ({first} {where})"
        )
    else:
        text = f"{contiguous} of {multi} multi-turn rollouts contiguous (re-tokenized {where})"
    return f"{text}; {fix}" if fix else text


def break_warning(record: Mapping[str, Any]) -> str | None:
    """The console warning for a result line whose exact-token rollout broke (None when it did not)."""
    entry = record_token_ids(record)
    if entry is None or entry["contiguous"] or entry["calls"] < 2:
        return None
    return (
        f"warning: exact tokens: {_rollout(record)} is not token-contiguous: at call {entry.get('broken_at')}: "
        f"{entry.get('reason')}; {EXACT_BREAK}"
    )


def _rollout(record: Mapping[str, Any] | None) -> str:
    if not record:
        return "a rollout"
    return f"task {record.get('task_index')} rollout {record.get('rollout_index')}"


def _call_of(saved: Mapping[str, Any]) -> PolicyCall:
    """A saved policy call (``PolicyCall.to_dict``) as far as the contiguity check reads it."""
    answered = saved.get("response") is not None and not saved.get("error")
    return PolicyCall(
        index=int(saved.get("index") or 0),
        status=int(saved.get("status") or 0),
        latency_s=0.0,
        attempts=int(saved.get("attempts") or 1),
        started_at=0.0,
        response_json=b"{}" if answered else None,
        prompt_token_ids=saved.get("prompt_token_ids"),
        completion_token_ids=saved.get("completion_token_ids"),
        completion_logprobs=saved.get("completion_logprobs"),
    )
