"""A saved run's rollouts read one at a time: a scan of the whole file (each rollout with where it is), and any of
them read back from where it is, so no list of the run's rollouts is ever held.

Our ``results.jsonl`` holds a rollout a line (a resumed run may repeat a (task, rollout) pair: the first line
counts); verifiers' ``traces.jsonl`` holds an episode a line, each with its traces (numbered per task in the
order they come).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from .records import Rollout, rollout_of_record, rollout_of_trace, trace_task
from .transcript import Strings

RESULTS_FILE, TRACES_FILE = "results.jsonl", "traces.jsonl"
_BITSET_LIMIT = 1 << 27
"""Task indices below this are remembered in bits (a complete task: one bit); others as they are."""
_ROLLOUT_LIMIT = 1 << 22
"""Rollout indices below this are remembered as a bit of their task's mask; others as they are."""


class Where(NamedTuple):
    """Where a rollout is in its file: its line, which trace of the line (-1: the line is the rollout), and its
    number among its task's rollouts."""

    offset: int
    length: int
    trace: int
    rollout_index: int


class RolloutSource:
    """The rollouts of one ``results.jsonl`` or ``traces.jsonl``.

    ``default_env``: the environment of a results line that names none. ``complete_at``: how many rollouts a
    task has (the run's rollouts per example), so a complete task's pairs are remembered as one bit."""

    def __init__(self, path: Path, *, default_env: str = "?", complete_at: int | None = None) -> None:
        self.path = path
        self.traces = path.name == TRACES_FILE
        self.default_env = default_env
        self.complete_at = complete_at
        self.duplicates = 0
        self.versions: set[str] = set()
        """verifiers' versions named by the traces."""
        self.models: set[str] = set()
        """Models named by the traces' agent configs."""

    def scan(self, notes: list[str]) -> Iterator[tuple[Rollout, Where]]:
        """Every rollout in file order, with where it is (transcripts keep their texts: no string table); a bad
        or cut-off line is noted, not fatal."""
        if self.traces:
            repeats: Counter[tuple[str, str]] = Counter()
            for offset, length, episode in _lines(self.path, notes):
                for position, trace in enumerate(episode.get("traces") or []):
                    if isinstance(trace, Mapping):
                        self._note_versions(trace)
                        key = trace_task(episode, trace)
                        where = Where(offset, length, position, repeats[key])
                        repeats[key] += 1
                        yield rollout_of_trace(episode, trace, where.rollout_index, None), where
            return
        seen = _SeenPairs(self.complete_at)
        for offset, length, record in _lines(self.path, notes):
            if "task_index" not in record or "rollout_index" not in record:
                continue
            if not seen.add(record.get("env"), record["task_index"], record["rollout_index"]):
                self.duplicates += 1  # a resumed run may repeat a line; the first one counts (as in the summary)
                continue
            yield rollout_of_record(record, self.default_env, None), Where(offset, length, -1, -1)

    def _note_versions(self, trace: Mapping[str, Any]) -> None:
        version = (trace.get("verifiers") or {}).get("version")
        if version:
            self.versions.add(str(version))
        model = ((trace.get("agent") or {}).get("config") or {}).get("model")
        if model:
            self.models.add(str(model))

    def read(self, where: Where, strings: Strings | None) -> Rollout:
        """The rollout at ``where``, its transcript's long texts in ``strings``."""
        with open(self.path, "rb") as handle:
            handle.seek(where.offset)
            value = json.loads(handle.read(where.length))
        if not self.traces:
            return rollout_of_record(value, self.default_env, strings)
        return rollout_of_trace(value, value["traces"][where.trace], where.rollout_index, strings)


def _lines(path: Path, notes: list[str]) -> Iterator[tuple[int, int, dict[str, Any]]]:
    """``(offset, length, object)`` of each good line; a cut-off last line or a bad line is noted, not fatal."""
    bad: list[int] = []
    last_bad_is_tail = False
    offset = 0
    with open(path, "rb") as handle:
        for number, line in enumerate(handle, start=1):
            start, offset = offset, offset + len(line)
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except ValueError:
                bad.append(number)
                last_bad_is_tail = not line.endswith(b"\n")
                continue
            if isinstance(value, dict):
                yield start, len(line), value
            else:
                bad.append(number)
    if bad:
        if len(bad) == 1 and last_bad_is_tail:
            notes.append(f"{path.name}: the last line was cut off (the run was stopped while writing it); left out")
        else:
            where = ", ".join(map(str, bad[:5])) + (" ..." if len(bad) > 5 else "")
            notes.append(f"{path.name}: {len(bad)} unreadable lines left out (line {where})")


class _SeenPairs:
    """Which (env, task index, rollout index) pairs were read: per task still open a bitmask of its rollout indices;
    a task with all ``complete_at`` of them becomes one bit of its environment's ``bytearray``. Pairs that are not
    small non-negative integers are kept as they are."""

    def __init__(self, complete_at: int | None) -> None:
        self.complete_at = complete_at
        self._open: dict[tuple[Any, int], int] = {}
        self._complete: dict[Any, bytearray] = {}
        self._other: set[tuple[Any, Any, Any]] = set()

    def add(self, env: Any, task: Any, rollout: Any) -> bool:
        """Mark the pair read; False when it was already."""
        if not (_small(task, _BITSET_LIMIT) and _small(rollout, _ROLLOUT_LIMIT)):
            key = (env, task, rollout)
            if key in self._other:
                return False
            self._other.add(key)
            return True
        done = self._complete.get(env)
        if done is not None and task >> 3 < len(done) and done[task >> 3] >> (task & 7) & 1:
            return False
        mask = self._open.get((env, task), 0)
        if mask >> rollout & 1:
            return False
        mask |= 1 << rollout
        if self.complete_at and mask == (1 << self.complete_at) - 1:
            self._open.pop((env, task), None)
            done = self._complete.setdefault(env, bytearray())
            if len(done) <= task >> 3:
                done.extend(bytes((task >> 3) + 1 - len(done)))
            done[task >> 3] |= 1 << (task & 7)
        else:
            self._open[(env, task)] = mask
        return True


def _small(value: Any, limit: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < limit
