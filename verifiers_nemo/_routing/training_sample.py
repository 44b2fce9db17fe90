"""The training sample a trainer wants from a rollout's policy calls: one token sequence with a loss mask.

Format (verl / NeMo RL style, one dict per sample from ``TrainingSample.to_dict``):

- ``prompt_token_ids``: the first covered call's prompt, exactly as the model saw it;
- ``completion_token_ids``: everything after it, in order: each call's sampled tokens and, between two calls,
  the tokens the model did not sample (tool results, user turns, the chat template's glue and the next
  assistant header);
- ``completion_mask``: one per completion token, 1 where the policy sampled the token (train on it), 0 where it
  did not;
- ``completion_logprobs``: one per completion token, the logprob the server reported for a sampled token and
  0.0 where the mask is 0 (``None`` when a covered call has no logprobs);
- ``calls``: the ``PolicyCall.index`` of every call the sample covers.

A rollout whose calls are contiguous (each prompt starts with the previous prompt + completion, as
``check_contiguity`` checks) gives one sample. Otherwise the calls are cut where contiguity breaks, into
samples that are each contiguous (one per turn when every turn breaks), and ``breaks`` says where and why:
never a concatenation of tokens the model did not see.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .trace import PolicyCall, check_contiguity


@dataclass(frozen=True, slots=True)
class TrainingSample:
    """One token sequence the policy produced, with its loss mask and the sampled tokens' logprobs."""

    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    completion_mask: list[int]
    completion_logprobs: list[float] | None
    calls: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt_token_ids": self.prompt_token_ids,
            "completion_token_ids": self.completion_token_ids,
            "completion_mask": self.completion_mask,
            "completion_logprobs": self.completion_logprobs,
            "calls": list(self.calls),
        }


@dataclass(frozen=True, slots=True)
class TrainingSamples:
    """The samples of one rollout; ``contiguous`` when they are one sequence, else ``breaks`` says why."""

    samples: list[TrainingSample]
    breaks: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    """Calls left out (failed, or without token IDs), one line each."""

    @property
    def contiguous(self) -> bool:
        return len(self.samples) == 1 and not self.breaks and not self.skipped

    def to_dict(self) -> dict[str, Any]:
        return {
            "contiguous": self.contiguous,
            "samples": [sample.to_dict() for sample in self.samples],
            "breaks": list(self.breaks),
            "skipped": list(self.skipped),
        }


class _Builder:
    def __init__(self, first: PolicyCall) -> None:
        assert first.prompt_token_ids is not None and first.completion_token_ids is not None
        self.prompt = list(first.prompt_token_ids)
        self.completion: list[int] = []
        self.mask: list[int] = []
        self.logprobs: list[float] | None = []
        self.calls: list[int] = []
        self.sequence = list(self.prompt)
        self._add_turn(first)

    def _add_turn(self, call: PolicyCall) -> None:
        completion = list(call.completion_token_ids or ())
        self.completion += completion
        self.mask += [1] * len(completion)
        logprobs = call.completion_logprobs
        if self.logprobs is not None and logprobs is not None and len(logprobs) == len(completion):
            self.logprobs += list(logprobs)
        else:
            self.logprobs = None
        self.sequence += completion
        self.calls.append(call.index)

    def extend(self, call: PolicyCall) -> None:
        """Add a call whose prompt starts with ``self.sequence`` (checked by the caller)."""
        assert call.prompt_token_ids is not None
        between = list(call.prompt_token_ids[len(self.sequence) :])
        self.completion += between
        self.mask += [0] * len(between)
        if self.logprobs is not None:
            self.logprobs += [0.0] * len(between)
        self.sequence += between
        self._add_turn(call)

    def build(self) -> TrainingSample:
        return TrainingSample(self.prompt, self.completion, self.mask, self.logprobs, tuple(self.calls))


def training_samples(calls: Sequence[PolicyCall]) -> TrainingSamples:
    """Build a rollout's training samples from its ``PolicyCall``s (``RolloutResult.trace``), in call order.

    Failed calls are skipped (as ``check_contiguity`` does); a successful call without token IDs is skipped and
    ends the current sample, since nothing joins it to its neighbours.
    """
    samples: list[TrainingSample] = []
    breaks: list[str] = []
    skipped: list[str] = []
    builder: _Builder | None = None
    previous: PolicyCall | None = None
    for call in calls:
        if not call.ok:
            skipped.append(f"call {call.index} failed")
            continue
        if not call.has_tokens:
            skipped.append(f"call {call.index} has no token IDs recorded")
            if builder is not None:
                samples.append(builder.build())
                builder, previous = None, None
            continue
        if builder is not None and previous is not None:
            check = check_contiguity([previous, call])
            if check:
                builder.extend(call)
                previous = call
                continue
            breaks.append(check.message)
            samples.append(builder.build())
        builder, previous = _Builder(call), call
    if builder is not None:
        samples.append(builder.build())
    return TrainingSamples(samples, breaks, skipped)
