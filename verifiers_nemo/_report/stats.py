"""The report's numbers: per run and environment (reward, pass@k/pass^k over every k, metric means
with confidence intervals, failures by kind, latency and tokens) and runs compared task by task.

The pass@k estimators are the eval's own (``_eval.stats``). Confidence intervals treat tasks as the
unit (a task's rollouts are not independent draws): a mean over tasks, Student's t over their spread.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .._eval.stats import pass_at_k, pass_power_k
from .runs import ReportError, Rollout, Run

_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}
MAX_K_POINTS = 64
"""pass@k is drawn for every k up to this many rollouts per task, then on powers of two."""


def t_quantile_975(df: int) -> float:
    """Student's t 97.5% quantile (a two-sided 95% interval): exact table to 10, a Cornish-Fisher
    expansion beyond (error < 1e-3)."""
    if df < 1:
        return math.nan
    if df in _T975:
        return _T975[df]
    z = 1.959964
    return (
        z
        + (z**3 + z) / (4 * df)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3)
    )


def mean_ci(values: Sequence[float]) -> tuple[float | None, float | None, float | None]:
    """``(mean, low, high)``: the mean with a 95% t interval (no interval for fewer than 2 values)."""
    if not values:
        return None, None, None
    mean = math.fsum(values) / len(values)
    if len(values) < 2:
        return mean, None, None
    half = t_quantile_975(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def _is_identifier(name: str) -> bool:
    lowered = name.lower()
    return lowered in ("id", "idx", "index") or lowered.endswith(("_id", "_idx", "_index"))


def k_values(max_n: int) -> list[int]:
    """Every k up to ``MAX_K_POINTS``, then powers of two, and ``max_n`` itself."""
    ks = list(range(1, min(max_n, MAX_K_POINTS) + 1))
    k = 128
    while k < max_n:
        ks.append(k)
        k *= 2
    if max_n not in ks:
        ks.append(max_n)
    return ks


def _by_task(rollouts: Sequence[Rollout]) -> dict[tuple[str, str], list[Rollout]]:
    groups: dict[tuple[str, str], list[Rollout]] = defaultdict(list)
    for rollout in rollouts:
        groups[(rollout.env, rollout.task)].append(rollout)
    return groups


def pass_curves(rollouts: Sequence[Rollout], threshold: float) -> dict[str, list[Any]]:
    """pass@k and pass^k over k (unbiased, per task over its scored rollouts, averaged over the tasks
    with at least k of them), and how many tasks each k averages."""
    counts = []
    for group in _by_task(rollouts).values():
        scored = [r.reward for r in group if r.status == "scored" and r.reward is not None]
        if scored:
            counts.append((len(scored), sum(reward >= threshold for reward in scored)))
    if not counts:
        return {"k": [], "pass_at": [], "pass_power": [], "tasks": []}
    out: dict[str, list[Any]] = {"k": [], "pass_at": [], "pass_power": [], "tasks": []}
    for k in k_values(max(n for n, _ in counts)):
        eligible = [(n, c) for n, c in counts if n >= k]
        out["k"].append(k)
        out["pass_at"].append(math.fsum(pass_at_k(n, c, k) for n, c in eligible) / len(eligible))
        out["pass_power"].append(math.fsum(pass_power_k(n, c, k) for n, c in eligible) / len(eligible))
        out["tasks"].append(len(eligible))
    return out


def overview(rollouts: Sequence[Rollout], threshold: float) -> dict[str, Any]:
    """The overview numbers of a set of rollouts (a run, or one environment of it)."""
    scored = [r for r in rollouts if r.status == "scored" and r.reward is not None]
    groups = _by_task(scored)
    reward_ci = mean_ci([math.fsum(r.reward for r in g) / len(g) for g in groups.values()])  # type: ignore[misc]
    names = sorted({name for r in scored for name in r.metrics if not _is_identifier(name)})
    metrics = []
    for name in names:
        per_task = [
            math.fsum(values) / len(values)
            for values in ([r.metrics[name] for r in g if name in r.metrics] for g in groups.values())
            if values
        ]
        mean, low, high = mean_ci(per_task)
        metrics.append({"name": name, "mean": mean, "low": low, "high": high, "tasks": len(per_task)})
    errors = Counter(r.kind or "error" for r in rollouts if r.status == "error")
    masked = Counter(r.kind or "masked" for r in rollouts if r.status == "masked")
    examples: dict[str, str] = {}
    for r in rollouts:
        if r.status != "scored" and r.kind and r.kind not in examples and r.message:
            examples[r.kind] = r.message[:300]
    recorded = [r for r in rollouts if r.recorded_reward is not None]
    reproduced = sum(
        1
        for r in recorded
        if r.status == "scored" and r.reward is not None and abs(r.reward - r.recorded_reward) <= 1e-6  # type: ignore[operator]
    )
    rewards = [r.reward for r in scored]
    return {
        "rollouts": len(rollouts),
        "scored": len(scored),
        "errored": sum(errors.values()),
        "masked": sum(masked.values()),
        "tasks": len(_by_task(rollouts)),
        "reward": {
            "mean": math.fsum(rewards) / len(rewards) if rewards else None,  # type: ignore[arg-type]
            "task_mean": reward_ci[0],
            "low": reward_ci[1],
            "high": reward_ci[2],
            "std": statistics.pstdev(rewards) if rewards else None,  # type: ignore[arg-type]
            "min": min(rewards) if rewards else None,  # type: ignore[type-var]
            "max": max(rewards) if rewards else None,  # type: ignore[type-var]
        },
        "pass": pass_curves(rollouts, threshold),
        "threshold": threshold,
        "metrics": metrics,
        "errors": dict(errors.most_common()),
        "masked_by_kind": dict(masked.most_common()),
        "examples": examples,
        "replay": {"compared": len(recorded), "reproduced": reproduced} if recorded else None,
        "latency": _quantiles([r.latency_s for r in rollouts if r.latency_s is not None]),
        "call_latency": _quantiles([x for r in rollouts for x in r.call_latencies]),
        "output_tokens": _quantiles([float(r.output_tokens) for r in rollouts if r.output_tokens is not None]),
        "turns": _quantiles([float(r.turns) for r in rollouts]),
    }


def _quantiles(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    ordered = sorted(values)

    def q(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(p * (len(ordered) - 1) + 0.5))]

    return {"mean": math.fsum(ordered) / len(ordered), "p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "max": ordered[-1]}


# -- runs compared -----------------------------------------------------------------------------------


@dataclass
class TaskPair:
    """One task in two runs: mean reward and share correct of each run's scored rollouts."""

    env: str
    task: str
    a_reward: float | None
    b_reward: float | None
    a_pass: float | None
    b_pass: float | None
    a_n: int
    b_n: int

    @property
    def flip(self) -> str | None:
        """``fixed`` (mostly wrong in A, mostly right in B), ``broken`` (the reverse), else None."""
        if self.a_pass is None or self.b_pass is None:
            return None
        a, b = self.a_pass >= 0.5, self.b_pass >= 0.5
        return None if a == b else "fixed" if b else "broken"


def _task_scores(run: Run) -> dict[tuple[str, str], tuple[float | None, float | None, int]]:
    out = {}
    for key, group in _by_task(run.rollouts).items():
        rewards = [r.reward for r in group if r.status == "scored" and r.reward is not None]
        if rewards:
            mean = math.fsum(rewards) / len(rewards)  # type: ignore[arg-type]
            correct = sum(x >= run.pass_threshold for x in rewards) / len(rewards)  # type: ignore[operator]
            out[key] = (mean, correct, len(rewards))
        else:
            out[key] = (None, None, 0)
    return out


def compare(a: Run, b: Run) -> dict[str, Any]:
    """Run ``b`` against run ``a`` on their common tasks: per task side by side, the flips, and the
    difference in mean reward and pass@1 with a paired 95% interval over tasks.

    Raises ReportError when the runs share no task (the message names what each ran)."""
    scores_a, scores_b = _task_scores(a), _task_scores(b)
    common = sorted(set(scores_a) & set(scores_b), key=_task_order)
    if not common:
        raise ReportError(
            f"{a.label} and {b.label} ran different tasks, so they cannot be compared task by task: "
            f"{_describe_tasks(scores_a)} vs {_describe_tasks(scores_b)}, none in common."
        )
    pairs = [TaskPair(env, task, *_pick(scores_a[(env, task)], scores_b[(env, task)])) for env, task in common]
    both = [p for p in pairs if p.a_reward is not None and p.b_reward is not None]
    reward_diff = mean_ci([p.b_reward - p.a_reward for p in both])  # type: ignore[operator]
    pass_diff = mean_ci([p.b_pass - p.a_pass for p in both])  # type: ignore[operator]
    only_a, only_b = len(set(scores_a) - set(scores_b)), len(set(scores_b) - set(scores_a))
    notes = []
    if only_a or only_b:
        notes.append(
            f"compared on the {len(common)} tasks both ran; {only_a} tasks only in {a.label}, "
            f"{only_b} only in {b.label} are left out"
        )
    if len(both) < len(pairs):
        notes.append(
            f"{len(pairs) - len(both)} common tasks have no scored rollout in one of the runs; "
            "left out of the differences"
        )
    if a.pass_threshold != b.pass_threshold:
        notes.append(f"pass thresholds differ ({a.pass_threshold:g} vs {b.pass_threshold:g}); each run's own is used")
    return {
        "a": a.label,
        "b": b.label,
        "tasks": [
            {
                "env": p.env,
                "task": p.task,
                "a": p.a_reward,
                "b": p.b_reward,
                "a_pass": p.a_pass,
                "b_pass": p.b_pass,
                "a_n": p.a_n,
                "b_n": p.b_n,
                "flip": p.flip,
            }
            for p in pairs
        ],
        "paired_tasks": len(both),
        "reward_diff": dict(zip(("mean", "low", "high"), reward_diff, strict=True)),
        "pass1_diff": dict(zip(("mean", "low", "high"), pass_diff, strict=True)),
        "fixed": sum(p.flip == "fixed" for p in pairs),
        "broken": sum(p.flip == "broken" for p in pairs),
        "notes": notes,
    }


def _pick(
    a: tuple[float | None, float | None, int], b: tuple[float | None, float | None, int]
) -> tuple[float | None, float | None, float | None, float | None, int, int]:
    return a[0], b[0], a[1], b[1], a[2], b[2]


def _task_order(key: tuple[str, str]) -> tuple[str, int, str]:
    env, task = key
    return (env, int(task), "") if task.isdigit() else (env, 1 << 62, task)


def _describe_tasks(scores: dict[tuple[str, str], Any]) -> str:
    envs = sorted({env for env, _ in scores})
    tasks = sorted((t for _, t in scores), key=lambda t: (not t.isdigit(), int(t) if t.isdigit() else 0, t))
    shown = ", ".join(tasks[:5]) + (" ..." if len(tasks) > 5 else "")
    return f"{len(scores)} tasks of {', '.join(envs)} ({shown})"
