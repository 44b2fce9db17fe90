"""The report's numbers: per run and environment (reward, pass@k/pass^k over every k, metric means
with confidence intervals, failures by kind, latency and tokens) and runs compared task by task.

The pass@k estimators are the eval's own (``_eval.stats``). Confidence intervals treat tasks as the
unit (a task's rollouts are not independent draws) and stay within what they estimate can be: where every
task's value is 0 or 1 (a pass rate), the Wilson score interval; otherwise a percentile bootstrap over tasks
(``BOOTSTRAP_RESAMPLES`` resamples, seeded: the same report twice gives the same intervals), which never leaves
the range of the values observed, so a mean of rewards in [0, 1] or a paired difference in [-1, 1] gets an
interval inside those bounds (a t interval, symmetric about the mean, does not).
"""

from __future__ import annotations

import math
import random
import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .._eval.stats import pass_at_k, pass_power_k
from .runs import ReportError, Rollout, Run

MAX_K_POINTS = 64
"""pass@k is drawn for every k up to this many rollouts per task, then on powers of two."""
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
_BOOTSTRAP_DRAWS = 2_000_000
"""At most this many values drawn for one interval (many distinct values over many tasks get fewer resamples)."""
_Z975 = 1.959964
WILSON = "Wilson"
BOOTSTRAP = "bootstrap"


def wilson_interval(successes: int, n: int) -> tuple[float, float]:
    """The 95% Wilson score interval of a proportion: inside [0, 1], never empty at 0 or n successes."""
    p = successes / n
    z2 = _Z975 * _Z975
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = _Z975 * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def bootstrap_interval(
    values: Sequence[float], resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED
) -> tuple[float, float]:
    """The 95% percentile bootstrap interval of the mean of ``values`` (resampled with replacement, seeded).

    Resampling n values is a multinomial draw over the distinct values, so few distinct values (rewards,
    pass shares) cost a few binomial draws per resample whatever n is."""
    n = len(values)
    rng = random.Random(seed)
    counts = Counter(values)
    distinct = sorted(counts)
    means: list[float] = []
    if len(distinct) * 8 <= n:
        for _ in range(resamples):
            left, mass, total = n, 1.0, 0.0
            for value in distinct[:-1]:
                share = counts[value] / n
                drawn = rng.binomialvariate(left, min(1.0, share / mass)) if left else 0
                total += drawn * value
                left -= drawn
                mass -= share
            means.append((total + left * distinct[-1]) / n)
    else:
        population = list(values)
        for _ in range(max(200, min(resamples, _BOOTSTRAP_DRAWS // n))):
            means.append(math.fsum(rng.choices(population, k=n)) / n)
    means.sort()
    last = len(means) - 1
    return means[round(0.025 * last)], means[round(0.975 * last)]


def mean_interval(
    values: Sequence[float], *, proportion: bool = True
) -> tuple[float | None, float | None, float | None, str | None]:
    """``(mean, low, high, method)``: the mean over tasks and its 95% interval (``method`` names it: ``WILSON``
    when every value is 0 or 1 and ``proportion`` allows reading them as pass/fail, else ``BOOTSTRAP``); no
    interval for fewer than 2 values. Differences (B - A) are no proportion: ``proportion=False``."""
    if not values:
        return None, None, None, None
    mean = math.fsum(values) / len(values)
    if len(values) < 2:
        return mean, None, None, None
    if proportion and all(v in (0.0, 1.0) for v in values):
        low, high = wilson_interval(sum(v == 1.0 for v in values), len(values))
        return mean, low, high, WILSON
    low, high = bootstrap_interval(values)
    return mean, low, high, BOOTSTRAP


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
    reward_ci = mean_interval([math.fsum(r.reward for r in g) / len(g) for g in groups.values()])  # type: ignore[misc]
    names = sorted({name for r in scored for name in r.metrics if not _is_identifier(name)})
    metrics = []
    for name in names:
        per_task = [
            math.fsum(values) / len(values)
            for values in ([r.metrics[name] for r in g if name in r.metrics] for g in groups.values())
            if values
        ]
        mean, low, high, method = mean_interval(per_task)
        metrics.append({"name": name, "mean": mean, "low": low, "high": high, "method": method, "tasks": len(per_task)})
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
            "method": reward_ci[3],
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
    reward_diff = mean_interval([p.b_reward - p.a_reward for p in both], proportion=False)  # type: ignore[operator]
    pass_diff = mean_interval([p.b_pass - p.a_pass for p in both], proportion=False)  # type: ignore[operator]
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
        "reward_diff": dict(zip(("mean", "low", "high", "method"), reward_diff, strict=True)),
        "pass1_diff": dict(zip(("mean", "low", "high", "method"), pass_diff, strict=True)),
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
