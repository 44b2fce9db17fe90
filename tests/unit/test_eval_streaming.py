"""An eval of any size keeps nothing per rollout: its summary is a tally whose size does not grow with the
rollouts, its tasks are made one at a time as slots free up, and a taskset holds where its rows are, not them."""

from __future__ import annotations

import itertools
import json
import random
import sys
import tracemalloc
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from verifiers_nemo import NeMoGymTaskset, Task, TasksetError
from verifiers_nemo._eval import EvalSettings, RunTally, format_summary, run_metadata
from verifiers_nemo._eval.results import DoneRollouts
from verifiers_nemo._eval.stats import KEPT_ROWS, SummaryTally, summarize
from verifiers_nemo._eval.tasks import EnvRows, RunTasks

R = 8


def _record(task: int, rollout: int, rng: random.Random) -> dict[str, Any]:
    """A result line of every kind: scored (odd floats), errored, masked; with metrics, usage and latency."""
    roll = rng.random()
    record: dict[str, Any] = {
        "task_index": task,
        "rollout_index": rollout,
        "env": "e",
        "reward": rng.choice([0.0, 1.0, 0.1, 1 / 3, rng.random()]),
        "error": None,
        "metrics": {"acc": rng.random(), "steps": rng.randrange(5)},
        "usage": {"input_tokens": rng.randrange(100), "output_tokens": rng.randrange(50)},
        "timing": {"rollout_s": rng.random() * 3},
        "recorded_reward": rng.choice([0.0, 1.0]),
    }
    if roll < 0.1:
        record.update(reward=None, error={"type": rng.choice(["timeout", "upstream_error"]), "message": "m"})
    elif roll < 0.15:
        record.update(masked=True, failure_kind="judge_failed", failure_reason="the judge did not answer")
    return record


def _run(tasks: int, rng: random.Random, window: int = 16) -> Iterator[dict[str, Any]]:
    """Records of ``tasks`` x ``R`` rollouts finishing out of order within a window of ``window`` in flight, as a
    run's do (tasks are admitted ``aabbcc`` as slots free up)."""
    pairs = [(t, r) for t in range(tasks) for r in range(R)]
    in_flight: list[tuple[int, int]] = []
    for pair in pairs:
        in_flight.append(pair)
        if len(in_flight) >= window:
            yield _record(*in_flight.pop(rng.randrange(len(in_flight))), rng)
    rng.shuffle(in_flight)
    for pair in in_flight:
        yield _record(*pair, rng)


def _settings(**overrides: Any) -> EvalSettings:
    return EvalSettings(
        **{"env": "e", "nemo_env": "e", "policy": "replay", "model": "replay", "rollouts_per_example": R, **overrides}
    )


def _deep_size(value: Any, seen: set[int] | None = None) -> int:
    """Bytes an object holds, following containers and attributes (not functions or classes)."""
    seen = set() if seen is None else seen
    if id(value) in seen or isinstance(value, types.FunctionType | types.MethodType | type):
        return 0
    seen.add(id(value))
    size = sys.getsizeof(value)
    if isinstance(value, dict):
        size += sum(_deep_size(k, seen) + _deep_size(v, seen) for k, v in value.items())
    elif isinstance(value, list | tuple | set | frozenset):
        size += sum(_deep_size(item, seen) for item in value)
    for name in getattr(type(value), "__slots__", ()):
        size += _deep_size(getattr(value, name, None), seen)
    if hasattr(value, "__dict__"):
        size += _deep_size(vars(value), seen)
    return size


# ---- the tally


def test_a_streamed_summary_is_exactly_the_summary_of_the_list() -> None:
    records = list(_run(60, random.Random(1)))
    streamed = SummaryTally(rollouts_per_example=R, complete_at=R)
    for record in records:
        streamed.add(record)

    assert streamed.summary() == summarize(records, rollouts_per_example=R)  # equal, not approximately
    assert streamed.open_tasks == 0  # every task was folded as its last rollout came in


def test_an_interrupted_run_summarises_its_open_tasks_too() -> None:
    records = list(_run(20, random.Random(2)))[:-37]  # cut off with rollouts of several tasks missing
    streamed = SummaryTally(rollouts_per_example=R, complete_at=R)
    for record in records:
        streamed.add(record)

    assert streamed.open_tasks > 0
    assert streamed.summary() == summarize(records, rollouts_per_example=R)


def test_the_run_tally_does_not_grow_with_the_rollouts() -> None:
    def tally_of(tasks: int) -> RunTally:
        tally = RunTally(_settings(exact_tokens=True))
        for record in _run(tasks, random.Random(3)):
            tally.add(record)
        return tally

    small, large = tally_of(25), tally_of(2500)  # 200 and 20,000 rollouts

    assert large.count == 100 * small.count
    assert _deep_size(large) < _deep_size(small) + 2_000  # its sums' integers grow by a few digits, nothing more
    assert large.overall.open_tasks == 0
    replay = large.replay.result()
    assert replay is not None and len(replay["mismatches"]) == KEPT_ROWS < large.replay.mismatched


def test_the_metadata_of_a_tally_is_that_of_its_records() -> None:
    records = list(_run(10, random.Random(4)))
    tally = RunTally(_settings())
    for record in records:
        tally.add(record)

    streamed = run_metadata({}, _settings(), None, 80, tally, [])
    listed = run_metadata({}, _settings(), None, 80, records, [])

    assert streamed["summary"] == listed["summary"] and streamed["counts"] == listed["counts"]


def test_rollouts_left_out_of_the_replay_verdict_are_counted_but_a_few_listed() -> None:
    tally = RunTally(_settings())
    tally.replay.known = lambda task: "ends in a reasoning item" if task in (3, 4, 5) else None
    for task, rollout in [(t, r) for t in range(6) for r in range(R)]:
        tally.add({"task_index": task, "rollout_index": rollout, "reward": 1.0, "recorded_reward": 1.0})

    metadata = run_metadata({}, _settings(), None, 6 * R, tally, [])
    replay = metadata["summary"]["replay"]

    assert (replay["compared"], replay["reproduced"]) == (3 * R, 3 * R)
    assert replay["known_unreproducible_count"] == 3 * R > KEPT_ROWS == len(replay["known_unreproducible"])
    assert replay["known_unreproducible"][0] == {
        "task_index": 3,
        "rollout_index": 0,
        "reason": "ends in a reasoning item",
    }
    assert "left out: 24 rollouts of tasks 3, 4, 5, whose recording" in format_summary(metadata)


# ---- the tasks


def _rows(rows: int, made: list[int]) -> EnvRows:
    def first_rollout(row: int) -> Task:
        made.append(row)
        return Task(task_index=row, rollout_index=0, row={}, agent_name=None, env="e", example_id=str(row), source="")

    return EnvRows("e", rows, first_rollout)


def test_a_run_of_a_million_rows_makes_its_tasks_one_at_a_time() -> None:
    made: list[int] = []
    tasks = RunTasks([_rows(1_000_000, made)], rollouts_per_example=3)

    taken = list(itertools.islice(tasks, 7))

    assert len(tasks) == 3_000_000
    assert [(t.task_index, t.rollout_index) for t in taken] == [(t, r) for t in range(3) for r in range(3)][:7]
    assert made == [0, 1, 2]  # one row read for each row reached, and no further
    assert taken[0].row is taken[2].row  # a row's rollouts share its row


def test_a_resumed_run_skips_what_is_done_without_making_it() -> None:
    made: list[int] = []
    tasks = RunTasks([_rows(4, made), _rows(2, made)], rollouts_per_example=2, stride=100)
    done = DoneRollouts(tasks.expected)
    for task_index, rollout in [(0, 0), (0, 1), (1, 1), (100, 0), (100, 1), (101, 0)]:
        done.add({"task_index": task_index, "rollout_index": rollout})

    pending = [(t.task_index, t.rollout_index) for t in tasks.pending(done)]

    assert pending == [(1, 0), (2, 0), (2, 1), (3, 0), (3, 1), (101, 1)]
    assert made == [1, 2, 3, 1]  # rows 0 and 100 are done: never read
    assert list(tasks.task_indices(done)) == [1, 2, 3, 101]


# ---- the taskset


def _write_rows(path: Path, rows: int, text_bytes: int) -> Path:
    filler = "x" * text_bytes
    with path.open("w") as handle:
        for index in range(rows):
            content = f"question {index} {filler}"
            handle.write(json.dumps({"responses_create_params": {"input": [{"role": "user", "content": content}]}}))
            handle.write("\n")
    return path


def test_a_taskset_holds_where_its_rows_are_not_the_rows(tmp_path: Path) -> None:
    path = _write_rows(tmp_path / "big.jsonl", rows=5_000, text_bytes=2_000)  # ~10 MB of rows
    tracemalloc.start()
    try:
        tasks = NeMoGymTaskset(jsonl_path=path, agent="a", rollouts_per_task=4)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert held < path.stat().st_size / 20  # offsets, not text (today ~24 bytes a row)
    assert len(tasks) == 20_000
    assert tasks[4 * 4_321 + 3].prompt == [{"role": "user", "content": f"question 4321 {'x' * 2_000}"}]


def test_a_taskset_whose_file_changed_says_so_when_a_task_is_built(tmp_path: Path) -> None:
    path = _write_rows(tmp_path / "rows.jsonl", rows=3, text_bytes=10)
    tasks = NeMoGymTaskset(jsonl_path=path, agent="a")
    _write_rows(path, rows=3, text_bytes=11)

    with pytest.raises(TasksetError, match="changed since its tasks were loaded"):
        tasks[1]


def test_a_run_of_many_repeats_prints_a_bounded_line_of_their_means() -> None:
    """-r 200000 must not print 200,000 means: the first and last few and their range; all are in metadata.json.
    Counts print with thousands separators."""
    repeats = 5_000
    settings = _settings(num_examples=1, rollouts_per_example=repeats)
    tally = RunTally(settings)
    for rollout in range(repeats):
        tally.add({"task_index": 0, "rollout_index": rollout, "reward": 0.0 if rollout == 7 else 1.0})

    metadata = run_metadata({}, settings, None, repeats, tally, [])
    (line,) = [line for line in format_summary(metadata).splitlines() if line.startswith("  by repeat")]

    assert len(metadata["summary"]["reward_by_rollout_index"]) == repeats
    assert line.endswith("(5,000 repeats: min 0.000, max 1.000; each in metadata.json)")
    assert "1.000, 1.000, 1.000, 0.000, 1.000" in line and ", …, " in line and len(line) < 200
    assert "Rollouts     5,000 of 5,000 (1 example x 5,000) · 5,000 scored" in format_summary(metadata)
