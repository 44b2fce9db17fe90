"""The report's statistics: confidence intervals over tasks, pass@k/pass^k over every k, and runs compared task
by task (the per-run figures are taken rollout by rollout in ``tally.py``).

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
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._eval.exact import ExactSum
from .._eval.stats import pass_at_k, pass_power_k
from .errors import ReportError

if TYPE_CHECKING:
    from .runs import Run

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
    values: Sequence[float] | Counter[float], resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED
) -> tuple[float, float]:
    """The 95% percentile bootstrap interval of the mean of ``values`` (resampled with replacement, seeded).

    ``values``: a list, or a multiset (``Counter``: value → how many tasks have it); the interval depends only on
    the multiset, not on the order the tasks came in. Resampling n values is a multinomial draw over the distinct
    values, so few distinct values (rewards, pass shares) cost a few binomial draws per resample whatever n is."""
    counts = values if isinstance(values, Counter) else Counter(values)
    n = counts.total()
    rng = random.Random(seed)
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
        population = [value for value in distinct for _ in range(counts[value])]
        for _ in range(max(200, min(resamples, _BOOTSTRAP_DRAWS // n))):
            means.append(math.fsum(rng.choices(population, k=n)) / n)
    means.sort()
    last = len(means) - 1
    return means[round(0.025 * last)], means[round(0.975 * last)]


def multiset_mean(counts: Counter[float]) -> float:
    """The mean of a multiset of finite floats, rounded once (``math.fsum`` of the values over their count)."""
    total = ExactSum()
    for value, times in counts.items():
        numerator, denominator = value.as_integer_ratio()
        total.add_ratio(numerator * times, denominator.bit_length() - 1)
    return total.total / counts.total()


def mean_interval(
    values: Sequence[float] | Counter[float], *, proportion: bool = True
) -> tuple[float | None, float | None, float | None, str | None]:
    """``(mean, low, high, method)``: the mean over tasks and its 95% interval (``method`` names it: ``WILSON``
    when every value is 0 or 1 and ``proportion`` allows reading them as pass/fail, else ``BOOTSTRAP``); no
    interval for fewer than 2 values. ``values``: a list or a multiset (``Counter``). Differences (B - A) are no
    proportion: ``proportion=False``."""
    counts = values if isinstance(values, Counter) else Counter(values)
    n = counts.total()
    if not n:
        return None, None, None, None
    mean = multiset_mean(counts)
    if n < 2:
        return mean, None, None, None
    if proportion and all(v in (0.0, 1.0) for v in counts):
        low, high = wilson_interval(counts[1.0], n)
        return mean, low, high, WILSON
    low, high = bootstrap_interval(counts)
    return mean, low, high, BOOTSTRAP


def is_identifier(name: str) -> bool:
    """Whether a metric's name says it is an identifier (``id``, ``question_id``, ...): not averaged."""
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


def pass_curves(counts: Counter[tuple[int, int]]) -> dict[str, list[Any]]:
    """pass@k and pass^k over k (unbiased, per task over its scored rollouts, averaged over the tasks with at
    least k of them), and how many tasks each k averages. ``counts``: per task with a scored rollout, its
    (scored, correct), as a multiset."""
    out: dict[str, list[Any]] = {"k": [], "pass_at": [], "pass_power": [], "tasks": []}
    if not counts:
        return out
    for k in k_values(max(n for n, _ in counts)):
        eligible = [(n, c, times) for (n, c), times in counts.items() if n >= k]
        tasks = sum(times for _, _, times in eligible)
        out["k"].append(k)
        out["pass_at"].append(_weighted_mean([(pass_at_k(n, c, k), times) for n, c, times in eligible], tasks))
        out["pass_power"].append(_weighted_mean([(pass_power_k(n, c, k), times) for n, c, times in eligible], tasks))
        out["tasks"].append(tasks)
    return out


def _weighted_mean(pairs: list[tuple[float, int]], n: int) -> float:
    counts: Counter[float] = Counter()
    for value, times in pairs:
        counts[value] += times
    return multiset_mean(counts) if n else math.nan


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


TaskScores = Mapping[tuple[str, str], Sequence[Any]]
"""(env, task) → [reward sum (``ExactSum``), scored, correct] of one run (``RunTally.task_scores``)."""
MAX_TASK_ROWS = 10_000
"""Tasks a comparison lists one by one (every flipped one first); its figures count them all."""


def _task_scores(scores: TaskScores) -> dict[tuple[str, str], tuple[float | None, float | None, int]]:
    out: dict[tuple[str, str], tuple[float | None, float | None, int]] = {}
    for key, (total, scored, correct) in scores.items():
        out[key] = (total.total / scored, correct / scored, scored) if scored else (None, None, 0)
    return out


def compare(a: Run, b: Run, *, listed: int = MAX_TASK_ROWS) -> dict[str, Any]:
    """Run ``b`` against run ``a`` on their common tasks (both loaded with ``keep_tasks``): per task side by side
    (at most ``listed``: every flipped task first), the flips, and the difference in mean reward and pass@1
    with a paired 95% interval over tasks.

    Raises ReportError when the runs share no task (the message names what each ran)."""
    if a.tally.task_scores is None or b.tally.task_scores is None:
        raise ValueError("runs are compared task by task when loaded with keep_tasks=True")
    a_label, a_threshold, b_label, b_threshold = a.label, a.pass_threshold, b.label, b.pass_threshold
    scores_a, scores_b = _task_scores(a.tally.task_scores), _task_scores(b.tally.task_scores)
    common = sorted(set(scores_a) & set(scores_b), key=_task_order)
    if not common:
        raise ReportError(
            f"{a_label} and {b_label} ran different tasks, so they cannot be compared task by task: "
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
            f"compared on the {len(common)} tasks both ran; {only_a} tasks only in {a_label}, "
            f"{only_b} only in {b_label} are left out"
        )
    if len(both) < len(pairs):
        notes.append(
            f"{len(pairs) - len(both)} common tasks have no scored rollout in one of the runs; "
            "left out of the differences"
        )
    if a_threshold != b_threshold:
        notes.append(f"pass thresholds differ ({a_threshold:g} vs {b_threshold:g}); each run's own is used")
    gym_a, gym_b = a.info.get("nemo-gym"), b.info.get("nemo-gym")
    if gym_a and gym_b and gym_a != gym_b:
        notes.append(
            f"the runs ran different nemo-gym releases ({gym_a} vs {gym_b}): tasks are matched by index, the same "
            "row only where both releases ship the same rows; to compare on the same rows, run both on one file "
            "(-a '{\"jsonl_path\": FILE}')"
        )
    shown = _listed(pairs, listed)
    if len(shown) < len(pairs):
        notes.append(
            f"the per-task table and plot show {len(shown):,} of the {len(pairs):,} common tasks (the flipped "
            "ones first, then the others in task order); the differences and flip counts are over all of them"
        )
    return {
        "a": a_label,
        "b": b_label,
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
            for p in shown
        ],
        "common_tasks": len(pairs),
        "paired_tasks": len(both),
        "reward_diff": dict(zip(("mean", "low", "high", "method"), reward_diff, strict=True)),
        "pass1_diff": dict(zip(("mean", "low", "high", "method"), pass_diff, strict=True)),
        "fixed": sum(p.flip == "fixed" for p in pairs),
        "broken": sum(p.flip == "broken" for p in pairs),
        "notes": notes,
    }


def _listed(pairs: list[TaskPair], limit: int) -> list[TaskPair]:
    """The pairs a comparison lists: all of them, or the flipped ones first and then the others, in task order."""
    if len(pairs) <= limit:
        return pairs
    flipped = [i for i, p in enumerate(pairs) if p.flip][:limit]
    others = [i for i, p in enumerate(pairs) if not p.flip][: limit - len(flipped)]
    return [pairs[i] for i in sorted(flipped + others)]


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
