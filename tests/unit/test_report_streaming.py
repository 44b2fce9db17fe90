"""The report reads a run streaming: every figure from tallies taken a rollout at a time (the same numbers and plots
as the list-based computation over every rollout that the report used before), distributions exact until a bounded
seeded sample, and a bounded, deterministic choice of the rollouts it embeds, said on the page (synthetic runs)."""

from __future__ import annotations

import base64
import gzip
import json
import math
import random
import re
import statistics
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from tests.unit.report_runs import write_run
from verifiers_nemo._cli.main import main
from verifiers_nemo._eval.stats import pass_at_k, pass_power_k
from verifiers_nemo._report import figures, load_run
from verifiers_nemo._report.records import Rollout
from verifiers_nemo._report.stats import compare, k_values, mean_interval
from verifiers_nemo._report.values import DISTINCT_LIMIT, ValueTally


def _data(html: str) -> dict:
    found = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', html, re.S)
    assert found
    return json.loads(found.group(1))


def _details(html: str) -> dict:
    packed = re.search(r'<script type="text/plain" id="report-details">([^<]*)</script>', html)
    assert packed
    return json.loads(gzip.decompress(base64.b64decode(packed.group(1))))


# -- the reference: the report's overview as it was computed over a list of every rollout ---------------------


def _quantiles(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    ordered = sorted(values)

    def q(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(p * (len(ordered) - 1) + 0.5))]

    return {"mean": math.fsum(ordered) / len(ordered), "p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "max": ordered[-1]}


def _is_identifier(name: str) -> bool:
    return name.lower() in ("id", "idx", "index") or name.lower().endswith(("_id", "_idx", "_index"))


def reference_overview(rollouts: list[Rollout], threshold: float) -> dict[str, Any]:
    """Every figure from the whole list: tasks grouped, per-task means listed, quantiles of sorted values."""
    groups: dict[tuple[str, str], list[Rollout]] = defaultdict(list)
    for r in rollouts:
        groups[(r.env, r.task)].append(r)
    scored = [r for r in rollouts if r.status == "scored" and r.reward is not None]
    scored_groups = [[r for r in g if r in scored] for g in groups.values()]
    scored_groups = [g for g in scored_groups if g]
    counts = [(len(g), sum(r.reward >= threshold for r in g)) for g in scored_groups]
    curves: dict[str, list[Any]] = {"k": [], "pass_at": [], "pass_power": [], "tasks": []}
    for k in k_values(max(n for n, _ in counts)) if counts else []:
        eligible = [(n, c) for n, c in counts if n >= k]
        curves["k"].append(k)
        curves["pass_at"].append(math.fsum(pass_at_k(n, c, k) for n, c in eligible) / len(eligible))
        curves["pass_power"].append(math.fsum(pass_power_k(n, c, k) for n, c in eligible) / len(eligible))
        curves["tasks"].append(len(eligible))
    reward_ci = mean_interval([math.fsum(r.reward for r in g) / len(g) for g in scored_groups])
    metrics = []
    for name in sorted({n for r in scored for n in r.metrics if not _is_identifier(n)}):
        values = ([r.metrics[name] for r in g if name in r.metrics] for g in scored_groups)
        per_task = [math.fsum(v) / len(v) for v in values if v]
        mean, low, high, method = mean_interval(per_task)
        metrics.append({"name": name, "mean": mean, "low": low, "high": high, "method": method, "tasks": len(per_task)})
    errors = Counter(r.kind or "error" for r in rollouts if r.status == "error")
    masked = Counter(r.kind or "masked" for r in rollouts if r.status == "masked")
    examples: dict[str, str] = {}
    for r in rollouts:
        if r.status != "scored" and r.kind and r.kind not in examples and r.message:
            examples[r.kind] = r.message[:300]
    recorded = [r for r in rollouts if r.recorded_reward is not None]
    rewards = [r.reward for r in scored]
    return {
        "rollouts": len(rollouts),
        "scored": len(scored),
        "errored": sum(errors.values()),
        "masked": sum(masked.values()),
        "tasks": len(groups),
        "reward": {
            "mean": math.fsum(rewards) / len(rewards),
            "task_mean": reward_ci[0],
            "low": reward_ci[1],
            "high": reward_ci[2],
            "method": reward_ci[3],
            "std": statistics.pstdev(rewards),
            "min": min(rewards),
            "max": max(rewards),
        },
        "pass": curves,
        "threshold": threshold,
        "metrics": metrics,
        "errors": dict(errors.most_common()),
        "masked_by_kind": dict(masked.most_common()),
        "examples": examples,
        "replay": {
            "compared": len(recorded),
            "reproduced": sum(
                1 for r in recorded if r.status == "scored" and abs(r.reward - r.recorded_reward) <= 1e-6
            ),
        }
        if recorded
        else None,
        "latency": _quantiles([r.latency_s for r in rollouts if r.latency_s is not None]),
        "call_latency": _quantiles([x for r in rollouts for x in r.call_latencies]),
        "output_tokens": _quantiles([float(r.output_tokens) for r in rollouts if r.output_tokens is not None]),
        "turns": _quantiles([float(r.turns) for r in rollouts]),
        "training": _training(rollouts),
    }


def _training(rollouts: list[Rollout]) -> dict[str, Any] | None:
    """Training samples over the rollouts that have them (verifiers' training client), from the list."""
    trained = [r for r in rollouts if r.samples is not None]
    if not trained:
        return None
    forked = [r for r in trained if r.fork is not None]
    return {
        "rollouts": len(trained),
        "samples_per_rollout": sum(r.samples for r in trained) / len(trained),  # type: ignore[misc]
        "one_sample": sum(1 for r in trained if r.samples == 1),
        "forked": sum(1 for r in trained if r.samples > 1),  # type: ignore[operator]
        "fork_example": {"task": forked[0].task, **forked[0].fork} if forked else None,  # type: ignore[dict-item]
        "policy_versions": _versions([r.policy_versions for r in trained if r.policy_versions]),
    }


def _versions(labelled: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The oldest and newest of the rollouts' policy versions (integers here), and how many crossed one."""
    if not labelled:
        return None
    versions = [int(v[end]) for v in labelled for end in ("oldest", "newest")]
    return {
        "labelled": len(labelled),
        "oldest": str(min(versions)),
        "newest": str(max(versions)),
        "across_versions": sum(1 for v in labelled if v["versions"] > 1),
    }


def _mixed_run(tmp_path: Path) -> Path:
    """Two environments in one results.jsonl (a mix: env_b's task indices from 1,000,000), 3 rollouts a task,
    rewards in [0, 1] with recorded ones, errors and masked rows, lines shuffled and one repeated."""
    folder = tmp_path / "mix"
    lines = []
    for env, base, seed in (("env_a", 0, 1), ("env_b", 1_000_000, 2)):
        forced = {(1, 0): "masked", (2, 1): "error", (4, 2): "error"}
        part = write_run(tmp_path / env, tasks=9, repeats=3, seed=seed, env=env, quality=0.5, outcomes=forced)
        for line in (part / "results.jsonl").read_text().splitlines():
            record = json.loads(line)
            record["task_index"] += base
            record["example_id"] = str(record["task_index"])
            if record["metrics"]:
                record["metrics"]["solved"] = float(record["task_index"] % 2)  # per task 0 or 1: a Wilson interval
            if record["task_index"] % 5:  # most rollouts ran under the training client; every third task forked
                forked = record["task_index"] % 3 == 0
                fork = {
                    "turn": 2,
                    "message": 3,
                    "role": "assistant",
                    "token": 40,
                    "cause": "retokenized",
                    "detail": "x",
                }
                record["training"] = {"branches": 2 if forked else 1, **({"fork": fork} if forked else {})}
                if record["task_index"] % 2:  # labelled by the engine: from step task % 7, one or two steps
                    first, steps = record["task_index"] % 7, 1 + record["rollout_index"] % 2
                    versions = [str(first + i) for i in range(steps)]
                    record["training"]["policy_versions"] = {
                        "oldest": versions[0], "newest": versions[-1], "versions": steps, "by_turn": [versions],
                    }  # fmt: skip
            if record["reward"] is not None and not record.get("masked"):
                record["reward"] = round(record["reward"] * 0.5 + record["metrics"]["set_overlap"] * 0.5, 3)
                record["recorded_reward"] = record["reward"] if record["task_index"] % 4 else 1.0
            lines.append(json.dumps(record))
    random.Random(3).shuffle(lines)
    lines.insert(20, lines[5])  # a resumed run may repeat a line: the first counts
    folder.mkdir()
    (folder / "results.jsonl").write_text("\n".join(lines) + "\n")
    metadata = json.loads((tmp_path / "env_a" / "metadata.json").read_text())
    metadata["settings"]["env"] = "env_a,env_b"
    (folder / "metadata.json").write_text(json.dumps(metadata))
    return folder


def test_streamed_figures_are_the_ones_computed_over_every_rollout(tmp_path: Path) -> None:
    run = load_run(_mixed_run(tmp_path))
    rollouts = list(run.rollouts())
    assert run.total == len(rollouts) == 54 and any("1 duplicate lines" in note for note in run.notes)
    for env in (None, "env_a", "env_b"):
        chosen = [r for r in rollouts if env is None or r.env == env]
        streamed = run.tally.scope(env).overview()
        assert streamed == reference_overview(chosen, run.pass_threshold), env
    overall = run.tally.overall
    reward = overall.overview()
    assert reward["errored"] and reward["masked"] and reward["replay"]["reproduced"] < reward["replay"]["compared"]
    assert {m["method"] for m in reward["metrics"]} == {"Wilson", "bootstrap"}, "both interval paths are covered"
    as_lists = {
        "reward": [r.reward for r in rollouts if r.status == "scored"],
        "latency": [r.latency_s for r in rollouts],
        "calls": [x for r in rollouts for x in r.call_latencies],
        "tokens": [float(r.output_tokens) for r in rollouts if r.output_tokens],
        "turns": [float(r.turns) for r in rollouts],
    }
    assert figures.reward_distribution([("A", overall.reward)]) == figures.reward_distribution(
        [("A", as_lists["reward"])]
    )
    for tally, values, whole in (
        (overall.latency, as_lists["latency"], False),
        (overall.call_latency, as_lists["calls"], False),
        (overall.output_tokens, as_lists["tokens"], True),
        (overall.turns, as_lists["turns"], True),
    ):
        drawn = figures.distribution([("A", tally)], "t", "x", counts=whole, skip_zero=whole)
        assert drawn == figures.distribution([("A", values)], "t", "x", counts=whole)


def test_runs_compared_list_the_flipped_tasks_first_when_there_are_more_than_the_table_holds(tmp_path: Path) -> None:
    a = load_run(write_run(tmp_path / "a", tasks=30, repeats=2, seed=1, quality=0.5), keep_tasks=True)
    b = load_run(write_run(tmp_path / "b", tasks=30, repeats=2, seed=2, quality=0.5), keep_tasks=True)
    whole = compare(a, b)
    flipped = [t["task"] for t in whole["tasks"] if t["flip"]]
    assert 0 < len(flipped) < 28
    listed = compare(a, b, listed=len(flipped) + 2)
    assert [t["task"] for t in listed["tasks"] if t["flip"]] == flipped and len(listed["tasks"]) == len(flipped) + 2
    assert (listed["fixed"], listed["broken"], listed["reward_diff"]) == (
        whole["fixed"],
        whole["broken"],
        whole["reward_diff"],
    ), "the figures are over every common task"
    assert any(f"show {len(flipped) + 2} of the 30 common tasks" in note for note in listed["notes"])


# -- the rollouts a report embeds ---------------------------------------------------------------------------


def _report(tmp_path: Path, run: Path, name: str, *extra: str) -> dict:
    out = tmp_path / f"{name}.html"
    assert main(["report", str(run), "-o", str(out), *extra]) == 0
    html = out.read_text()
    data, details = _data(html), _details(html)
    assert len(details["D"]) == len(data["rows"])
    return data


def test_a_larger_run_shows_max_rollouts_of_whole_tasks_and_examples_of_every_failure(tmp_path: Path, capsys) -> None:
    outcomes = {(3, 1): "error", (17, 0): "error", (17, 2): "masked", (29, 1): "masked"}
    run = write_run(tmp_path / "run", tasks=40, repeats=3, seed=5, outcomes=outcomes)
    data = _report(tmp_path, run, "small", "--max-rollouts", "12")
    assert "its rollout table shows" in capsys.readouterr().err
    rows = data["rows"]
    tasks = Counter(row[2] for row in rows if row[5] == "scored")
    chosen = [task for task, n in tasks.items() if n == 3]
    assert len(chosen) >= 3, "whole tasks: each chosen task with all its rollouts"
    kinds = {(row[5], row[6]) for row in rows}
    records = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    failures = {("error", r["error"]["type"]) for r in records if r["error"]} | {
        ("masked", "judge_failed") for r in records if r.get("masked") and not r["error"]
    }
    assert failures <= kinds, "every error type and masked kind has its examples"
    summary = data["runs"][0]
    assert (summary["rollouts"], summary["shown"]) == (120, len(rows)) and 12 < len(rows) <= 12 + 20 * len(failures)
    assert summary["choice"].startswith(f"{len(rows)} of 120 rollouts: 12 of whole tasks picked at random")
    assert data["overview"]["synthetic_env"]["stats"][0]["rollouts"] == 120, "the figures count every rollout"

    shuffled = tmp_path / "shuffled"
    shuffled.mkdir()
    lines = (run / "results.jsonl").read_text().splitlines()
    random.Random(1).shuffle(lines)
    (shuffled / "results.jsonl").write_text("\n".join(lines) + "\n")
    (shuffled / "metadata.json").write_text((run / "metadata.json").read_text())
    again = _report(tmp_path, shuffled, "shuffled", "--max-rollouts", "12")
    assert sorted(map(tuple, again["rows"])) == sorted(map(tuple, rows)), "the same rollouts, whatever the order"
    other = write_run(tmp_path / "other", tasks=40, repeats=3, seed=6, quality=0.9)
    other_rows = _report(tmp_path, other, "other", "--max-rollouts", "12")["rows"]
    assert {row[2] for row in other_rows} >= set(chosen), "another run of the same tasks shows the same tasks"

    whole = _report(tmp_path, run, "whole", "--max-rollouts", "120")
    assert whole["runs"][0]["choice"] is None and [row[3] for row in whole["rows"][:3]] == [0, 1, 2]


# -- distributions ------------------------------------------------------------------------------------------


def test_a_distribution_is_exact_until_its_sample_size_then_a_seeded_uniform_sample() -> None:
    values = [i / 1000 for i in range(5000)]
    random.Random(0).shuffle(values)
    tally, twin = ValueTally(sample_size=500), ValueTally(sample_size=500)
    for value in values:
        tally.add(value)
        twin.add(value)
    assert tally.sampled and tally.held == 500 and sum(c for _, c in tally.weighted()) == 500
    assert tally.weighted() == twin.weighted(), "seeded: the same run gives the same sample"
    q = tally.quantiles()
    assert (q["mean"], q["max"], q["sample"]) == (math.fsum(values) / 5000, 4.999, 500), "mean and max are exact"
    assert abs(q["p50"] - 2.5) < 0.3 and abs(q["p90"] - 4.5) < 0.2

    few = ValueTally(sample_size=500)
    for i in range(20_000):
        few.add(float(i % 3))
    assert not few.sampled and few.weighted() == [(0.0, 6667), (1.0, 6667), (2.0, 6666)], "few values: exact"

    switching = ValueTally(sample_size=500)  # exact counts of 600 values, then too many distinct ones
    for i in range(600 + DISTINCT_LIMIT):
        switching.add(0.5 if i < 600 else float(i))
    assert switching.sampled and switching.held == 500 and switching.count == 600 + DISTINCT_LIMIT
    assert Counter(v for v, c in switching.weighted() for _ in range(c))[0.5] > 100, "a uniform sample of them all"


def test_max_rollouts_0_shows_no_rollout_and_says_the_figures_only() -> None:
    from verifiers_nemo._report.selection import RolloutChoice

    choice = RolloutChoice(0)
    for index in range(5):
        choice.offer(Rollout(env="e", task="t", rollout_index=index, status="error", kind="timeout"), index)

    assert choice.chosen() == []
    assert choice.describe(0) == "0 of 5 rollouts (--max-rollouts 0: the figures only)"
