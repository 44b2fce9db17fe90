"""Eval statistics: pure functions of result records (the dicts written to ``results.jsonl``), so a
resumed run summarises old and new rollouts alike."""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one example: the chance that at least one of k of its n samples is correct."""
    _check_nck(n, c, k)
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_power_k(n: int, c: int, k: int) -> float:
    """Unbiased pass^k of one example: the chance that all k of k of its n samples are correct."""
    _check_nck(n, c, k)
    return math.comb(c, k) / math.comb(n, k)


def _check_nck(n: int, c: int, k: int) -> None:
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")


def powers_of_two_up_to(r: int) -> list[int]:
    """1, 2, 4, ... up to ``r`` (the k of pass@k for r rollouts per example)."""
    ks, k = [], 1
    while k <= r:
        ks.append(k)
        k *= 2
    return ks


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _mean(values: Sequence[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def summarize(
    records: Iterable[Mapping[str, Any]],
    *,
    rollouts_per_example: int,
    pass_threshold: float = 0.5,
) -> dict[str, Any]:
    """Summary statistics of result records (``results.jsonl`` lines).

    Errored rollouts (``error`` set, ``reward`` None) are left out of every reward statistic and
    counted by type; so are masked ones (Gym's ``mask_sample``: no valid measurement), counted by
    ``failure_kind``. pass@k / pass^k (k = powers of two up to ``rollouts_per_example``) use the
    unbiased estimators per example over its scored rollouts, correct meaning reward >= threshold,
    averaged over the examples that have at least k scored rollouts.
    """
    records = list(records)
    rewards: list[float] = []
    by_index: dict[int, list[float]] = defaultdict(list)
    by_task: dict[int, list[float]] = defaultdict(list)
    metric_values: dict[str, list[float]] = defaultdict(list)
    errors: Counter[str] = Counter()
    error_examples: dict[str, str] = {}
    masked: Counter[str] = Counter()
    masked_examples: dict[str, str] = {}
    usage: Counter[str] = Counter()
    latencies: list[float] = []
    tasks: set[int] = set()
    for record in records:
        task_index = int(record["task_index"])
        tasks.add(task_index)
        for key, value in (record.get("usage") or {}).items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                usage[key] += value
        latency = (record.get("timing") or {}).get("rollout_s")
        if isinstance(latency, int | float):
            latencies.append(float(latency))
        error = record.get("error")
        reward = record.get("reward")
        if error or reward is None:
            kind = str(error.get("type", "error")) if isinstance(error, dict) else "error"
            errors[kind] += 1
            if kind not in error_examples:
                message = error.get("message") if isinstance(error, dict) else error
                error_examples[kind] = _clip(str(message or "the rollout has no reward"), 200)
            continue
        if record.get("masked"):
            kind = str(record.get("failure_kind") or "unspecified")
            masked[kind] += 1
            if kind not in masked_examples and record.get("failure_reason"):
                masked_examples[kind] = _clip(str(record["failure_reason"]), 200)
            continue
        reward = float(reward)
        rewards.append(reward)
        by_index[int(record["rollout_index"])].append(reward)
        by_task[task_index].append(reward)
        for name, value in (record.get("metrics") or {}).items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                metric_values[name].append(float(value))

    pass_at: dict[str, float] = {}
    pass_power: dict[str, float] = {}
    pass_examples: dict[str, int] = {}
    for k in powers_of_two_up_to(rollouts_per_example):
        eligible = [(len(v), sum(r >= pass_threshold for r in v)) for v in by_task.values() if len(v) >= k]
        if not eligible:
            continue
        pass_at[str(k)] = _mean([pass_at_k(n, c, k) for n, c in eligible])  # type: ignore[assignment]
        pass_power[str(k)] = _mean([pass_power_k(n, c, k) for n, c in eligible])  # type: ignore[assignment]
        pass_examples[str(k)] = len(eligible)

    return {
        "rollouts": {
            "total": len(records),
            "scored": len(rewards),
            "errored": sum(errors.values()),
            "masked": sum(masked.values()),
            "examples": len(tasks),
        },
        "reward": {
            "avg": _mean(rewards),
            "std": statistics.pstdev(rewards) if rewards else None,
            "min": min(rewards) if rewards else None,
            "max": max(rewards) if rewards else None,
        },
        "reward_by_rollout_index": [
            _mean(by_index.get(i, [])) for i in range(max([rollouts_per_example, *(k + 1 for k in by_index)]))
        ],
        "pass_threshold": pass_threshold,
        "pass_at_k": pass_at,
        "pass_power_k": pass_power,
        "pass_k_examples": pass_examples,
        "metrics": {name: _mean(values) for name, values in sorted(metric_values.items())},
        "errors_by_type": dict(errors.most_common()),
        "error_examples": {kind: error_examples[kind] for kind in errors},
        "masked_by_kind": dict(masked.most_common()),
        "masked_examples": masked_examples,
        "usage": dict(sorted(usage.items())),
        "latency": {
            "mean_rollout_s": _mean(latencies),
            "max_rollout_s": max(latencies) if latencies else None,
        },
    }


def replay_agreement(
    records: Iterable[Mapping[str, Any]],
    tolerance: float = 1e-6,
    known: Callable[[int], str | None] | None = None,
) -> dict[str, Any] | None:
    """How many replayed rollouts reproduced their recorded reward (None when none was replayed).

    An errored rollout counts as not reproduced. Rollouts of a recording known not to reproduce
    (``known(task_index)`` gives why) are left out of the comparison and listed under ``known``; so are
    masked ones (Gym's reward is no valid measurement: nothing to compare), counted under ``masked``.
    """
    compared, mismatches, known_rows, masked = 0, [], [], 0
    for record in records:
        if "recorded_reward" not in record:
            continue
        if record.get("masked") and not record.get("error"):
            masked += 1
            continue
        reason = known(int(record["task_index"])) if known is not None else None
        if reason:
            known_rows.append(
                {"task_index": record["task_index"], "rollout_index": record["rollout_index"], "reason": reason}
            )
            continue
        compared += 1
        reward, recorded = record.get("reward"), record.get("recorded_reward")
        try:
            same = reward is not None and abs(float(reward) - float(recorded)) <= tolerance  # type: ignore[arg-type]
        except (TypeError, ValueError):
            same = False
        if not same:
            mismatches.append(
                {
                    "task_index": record["task_index"],
                    "rollout_index": record["rollout_index"],
                    "reward": reward,
                    "recorded_reward": recorded,
                }
            )
    if not compared and not known_rows and not masked:
        return None
    agreement: dict[str, Any] = {
        "compared": compared,
        "reproduced": compared - len(mismatches),
        "mismatches": mismatches[:20],
    }
    if masked:
        agreement["masked"] = masked
    if known_rows:
        agreement["known_unreproducible"] = sorted(known_rows, key=lambda r: (r["task_index"], r["rollout_index"]))
    return agreement


def timing_summary(sessions: Sequence[Mapping[str, Any]], wall_s: float) -> dict[str, Any]:
    """The timing block of a summary: this invocation's wall time, stack start and throughput."""
    current = sessions[-1] if sessions else {}
    rollouts, rollouts_s = current.get("rollouts") or 0, current.get("rollouts_s")
    return {
        "wall_s": wall_s,
        "stack_start_s": current.get("stack_start_s"),
        "rollouts_s": rollouts_s,
        "rollouts_per_s": rollouts / rollouts_s if rollouts and rollouts_s else None,
        "sessions": len(sessions),
        "total_wall_s": math.fsum(s.get("wall_s") or 0.0 for s in sessions),
    }
