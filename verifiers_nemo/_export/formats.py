"""The rows of each training-data format, from rollout views (``rollouts.rollout_of``): one row per training sample
(``sft-tokens``), per rollout (``sft-messages``), per pair of a task's rollouts (``preferences``) or per rollout with
its task's statistics (``rollout-groups``). Columns: ``schema``."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .options import DEFAULT_MIN_GAP, DEFAULT_PAIRING, Pairing
from .rollouts import SCORED

IGNORE_INDEX = -100
"""The label of a token the loss skips (Hugging Face's, PyTorch's cross-entropy default)."""
ADVANTAGE_EPSILON = 1e-4
"""Added to the group's standard deviation in GRPO's advantage (TRL's value)."""

_IDENTITY = ("run_id", "env", "model", "task_index", "example_id")
_PAIR_TOKENS = ("prompt_token_ids", "chosen_token_ids", "chosen_mask", "chosen_logprobs", "rejected_token_ids")
_PAIR_TOKENS += ("rejected_mask", "rejected_logprobs")
_OUTCOME = ("status", "reward", "error_type", "failure_kind", "policy_versions")


def _pick(rollout: Mapping[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    return {key: rollout[key] for key in keys}


def sft_token_rows(rollout: Mapping[str, Any]) -> Iterator[tuple[dict[str, Any], int]]:
    """One row per training sample of the rollout (none without token IDs), with how many values it holds."""
    samples = rollout["samples"] or ()
    for number, sample in enumerate(samples):
        prompt, completion, mask = sample["prompt_token_ids"], sample["completion_token_ids"], sample["completion_mask"]
        labels = [IGNORE_INDEX] * len(prompt) + [
            t if m else IGNORE_INDEX for t, m in zip(completion, mask, strict=True)
        ]
        row = {
            **_pick(rollout, _IDENTITY),
            "rollout_index": rollout["rollout_index"],
            "sample_index": number,
            "samples": len(samples),
            "calls": sample["calls"],
            **_pick(rollout, _OUTCOME),
            "prompt_token_ids": prompt,
            "completion_token_ids": completion,
            "completion_mask": mask,
            "completion_logprobs": sample["completion_logprobs"],
            "input_ids": prompt + completion,
            "labels": labels,
        }
        yield row, 3 * (len(prompt) + len(completion))


def sft_message_row(rollout: Mapping[str, Any]) -> tuple[dict[str, Any], int]:
    """The rollout's conversation as one row."""
    row = {
        **_pick(rollout, _IDENTITY),
        "rollout_index": rollout["rollout_index"],
        **_pick(rollout, _OUTCOME),
        "prompt": rollout["prompt"],
        "completion": rollout["completion"],
        "tools": rollout["tools"],
    }
    return row, _text_cells(rollout)


def _text_cells(rollout: Mapping[str, Any]) -> int:
    text = sum(len(m.get("content") or "") for key in ("prompt", "completion") for m in rollout[key])
    return 64 + text // 8 + len(rollout["tools"] or "") // 8


@dataclass(frozen=True)
class PairOptions:
    """How a task's rollouts are paired: ``pairs`` (``best-worst``: its best against its worst; ``best-rest``: its
    best against each one enough below; ``all``: every two enough apart), ``min_gap`` (the chosen reward is at least
    this much higher), ``min_chosen_reward`` (the chosen one scores at least this), ``max_pairs`` (per task)."""

    pairs: Pairing = DEFAULT_PAIRING
    min_gap: float = DEFAULT_MIN_GAP
    min_chosen_reward: float | None = None
    max_pairs: int | None = None


def pairs_of(group: Sequence[Mapping[str, Any]], options: PairOptions) -> list[tuple[Mapping[str, Any], Any]]:
    """The (chosen, rejected) pairs of a task's rollouts: scored ones only, best first (ties: the lower rollout index
    first), each pair at least ``min_gap`` apart."""
    scored = sorted((r for r in group if r["status"] == SCORED), key=lambda r: (-r["reward"], r["rollout_index"]))
    if options.min_chosen_reward is not None:
        chosen_ok = [r for r in scored if r["reward"] >= options.min_chosen_reward]
    else:
        chosen_ok = scored
    if not chosen_ok:
        return []

    def apart(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
        gap = a["reward"] - b["reward"]
        return gap > 0 and gap >= options.min_gap

    if options.pairs == "best-worst":
        best, worst = chosen_ok[0], scored[-1]
        pairs = [(best, worst)] if apart(best, worst) else []
    elif options.pairs == "best-rest":
        pairs = [(chosen_ok[0], other) for other in scored if apart(chosen_ok[0], other)]
    else:
        pairs = [(a, b) for a in chosen_ok for b in scored if apart(a, b)]
    return pairs[: options.max_pairs] if options.max_pairs is not None else pairs


def preference_row(chosen: Mapping[str, Any], rejected: Mapping[str, Any]) -> tuple[dict[str, Any], bool, int]:
    """A pair as a row; whether it carries exact tokens (both one contiguous sample from the same prompt tokens)."""
    row = {
        **_pick(chosen, _IDENTITY),
        "chosen_rollout_index": chosen["rollout_index"],
        "rejected_rollout_index": rejected["rollout_index"],
        "chosen_reward": chosen["reward"],
        "rejected_reward": rejected["reward"],
        "prompt": chosen["prompt"],
        "chosen": chosen["completion"],
        "rejected": rejected["completion"],
        "tools": chosen["tools"],
    }
    tokens = dict.fromkeys(_PAIR_TOKENS)
    a, b = chosen["samples"], rejected["samples"]
    exact = bool(a and b and len(a) == 1 and len(b) == 1 and a[0]["prompt_token_ids"] == b[0]["prompt_token_ids"])
    if exact:
        tokens["prompt_token_ids"] = a[0]["prompt_token_ids"]
        for side, (sample,) in (("chosen", a), ("rejected", b)):
            tokens[f"{side}_token_ids"] = sample["completion_token_ids"]
            tokens[f"{side}_mask"] = sample["completion_mask"]
            tokens[f"{side}_logprobs"] = sample["completion_logprobs"]
    cells = _text_cells(chosen) + _text_cells(rejected)
    if exact:
        cells += len(a[0]["prompt_token_ids"]) + 3 * (
            len(a[0]["completion_token_ids"]) + len(b[0]["completion_token_ids"])
        )
    return {**row, **tokens}, exact, cells


@dataclass(frozen=True)
class GroupFigures:
    """A task's statistics over its scored rollouts (``size``: all its rollouts)."""

    size: int
    scored: int
    mean: float | None
    std: float | None

    @classmethod
    def of(cls, group: Sequence[Mapping[str, Any]]) -> GroupFigures:
        rewards = [r["reward"] for r in group if r["status"] == SCORED]
        n = len(rewards)
        mean = math.fsum(rewards) / n if n else None
        std = math.sqrt(math.fsum((x - mean) ** 2 for x in rewards) / (n - 1)) if n > 1 and mean is not None else None
        return cls(len(group), n, mean, std)

    def advantage(self, rollout: Mapping[str, Any]) -> float | None:
        """GRPO's advantage of a scored rollout (see the ``advantage`` column); None for the others."""
        if rollout["status"] != SCORED or self.mean is None:
            return None
        if self.std is None:
            return 0.0
        return (rollout["reward"] - self.mean) / (self.std + ADVANTAGE_EPSILON)


def group_row(rollout: Mapping[str, Any], figures: GroupFigures) -> tuple[dict[str, Any], int]:
    """One rollout of a task, with the task's statistics."""
    row = {
        **_pick(rollout, _IDENTITY),
        "rollout_index": rollout["rollout_index"],
        **_pick(rollout, _OUTCOME),
        "group_size": figures.size,
        "group_scored": figures.scored,
        "group_reward_mean": figures.mean,
        "group_reward_std": figures.std,
        "advantage": figures.advantage(rollout),
        "prompt": rollout["prompt"],
        "completion": rollout["completion"],
        "tools": rollout["tools"],
        "samples": rollout["samples"],
    }
    tokens = sum(len(s["prompt_token_ids"]) + 3 * len(s["completion_token_ids"]) for s in rollout["samples"] or ())
    return row, _text_cells(rollout) + tokens
