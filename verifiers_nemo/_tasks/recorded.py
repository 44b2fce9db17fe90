"""A recorded rollout as a runnable task: the task's own fields put back from its environment's dataset.

Gym's recordings (``example_rollouts.jsonl``) store what ``/verify`` returned, which often lacks the fields the
resources server needs (``/seed_session`` and ``/verify`` inputs: ground truth, a starting state...) and adds
verify outputs some servers reject when sent back. The environment's dataset row with the same input is the
task: its fields, with the recording's input, response, reward and agent kept (``Task.recorded_row`` keeps the
recording as written, judge calls included). A recording no dataset row matches is run as it is (its verify
outputs are left out of the row sent to Gym, ``Task.gym_row``).

Rows often share their input and differ only in what the model never sees (a game's seed, a hidden answer, a
ground truth). Of the rows with the recording's input, the one whose fields agree with the recording's wins: the
fewest fields that disagree, then the most that agree, then the row at the recording's ``_ng_task_index``, then
the first. A run saved with ``--save-trace`` records its row's own fields, so its replay gets its own row back;
a recording that carries none of them and shares its input with rows that differ is ambiguous, and said so once.

Finding those rows costs one pass over the environment's dataset files, when the first recorded task is built;
what is kept is where each row is (a hash of its input, its file, offset, length and place: 26 bytes a row), never
its text, so a large downloaded dataset is not held in memory, and the recordings themselves are read as any
taskset reads its rows.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import threading
from array import array
from bisect import bisect_left
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .._exceptions import TasksetError
from .task import AGENT_REF, GYM_STAMP_PREFIX, RECORDED_OUTPUTS, RESPONSES_CREATE_PARAMS, Task

TASK_INDEX = "_ng_task_index"
logger = logging.getLogger(__name__)


def input_key(value: Any) -> str:
    """An input, canonical: recordings add ``type: message`` and explicit nulls a live request lacks."""
    items = []
    for item in [{"role": "user", "content": value}] if isinstance(value, str) else list(value or []):
        if isinstance(item, dict):
            item = {k: v for k, v in item.items() if v is not None and not (k == "type" and v == "message")}
        items.append(item)
    return json.dumps(items, sort_keys=True, separators=(",", ":"))


def _hash(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little", signed=True)


def _input_of(line: bytes) -> str | None:
    try:
        return input_key(json.loads(line)[RESPONSES_CREATE_PARAMS]["input"])
    except (ValueError, KeyError, TypeError):
        return None


def row_fields(row: dict[str, Any]) -> dict[str, Any]:
    """A row's own fields: what is neither its input, its agent, a verify output nor a Gym stamp."""
    skipped = (RESPONSES_CREATE_PARAMS, AGENT_REF, *RECORDED_OUTPUTS)
    return {k: v for k, v in row.items() if k not in skipped and not k.startswith(GYM_STAMP_PREFIX)}


def best_row(recording: dict[str, Any], candidates: list[tuple[int, dict[str, Any]]]) -> tuple[dict[str, Any], bool]:
    """Of ``(place, row)`` candidates sharing the recording's input, the row that agrees with it best (see the
    module docs), and whether that choice was a guess (another candidate, with other fields, scored the same)."""
    recorded = row_fields(recording)
    wanted_place = recording.get(TASK_INDEX)

    def score(candidate: tuple[int, dict[str, Any]]) -> tuple[int, int, int, int]:
        place, row = candidate
        fields = row_fields(row)
        shared = [key for key in fields if key in recorded]
        disagree = sum(1 for key in shared if fields[key] != recorded[key])
        at_place = 0 if isinstance(wanted_place, int) and wanted_place == place else 1
        return disagree, -(len(shared) - disagree), at_place, place

    ranked = sorted(candidates, key=score)
    best = ranked[0]
    ties = [c for c in ranked[1:] if score(c)[:3] == score(best)[:3] and row_fields(c[1]) != row_fields(best[1])]
    return best[1], bool(ties)


class DatasetRows:
    """Where each row of some JSONL files is, by the hash of its input (``find_all`` gives every row of one)."""

    def __init__(self, paths: Iterable[Path]) -> None:
        self.paths = list(dict.fromkeys(paths))
        self._stamps = [_stamp(path) for path in self.paths]
        hashes, files, offsets, lengths, places = array("q"), array("H"), array("q"), array("I"), array("I")
        for file_no, path in enumerate(self.paths):
            with open(path, "rb") as handle:
                offset = 0
                for line in handle:
                    key = _input_of(line) if line.strip() else None
                    if key is not None:
                        hashes.append(_hash(key))
                        files.append(file_no)
                        offsets.append(offset)
                        lengths.append(len(line))
                        places.append(len(places))
                    offset += len(line)
        order = sorted(range(len(hashes)), key=hashes.__getitem__)  # stable: file order among equal hashes
        self._hashes = array("q", (hashes[i] for i in order))
        self._files = array("H", (files[i] for i in order))
        self._offsets = array("q", (offsets[i] for i in order))
        self._lengths = array("I", (lengths[i] for i in order))
        self._places = array("I", (places[i] for i in order))

    def __len__(self) -> int:
        return len(self._hashes)

    def find(self, key: str) -> dict[str, Any] | None:
        """The first row whose input is ``key`` (``input_key``), read back from its file; None when none is."""
        found = self.find_all(key)
        return found[0][1] if found else None

    def find_all(self, key: str) -> list[tuple[int, dict[str, Any]]]:
        """Every row whose input is ``key``, as ``(place, row)`` in file order (``place``: the row's 0-based
        position among the files' rows)."""
        wanted = _hash(key)
        slot = bisect_left(self._hashes, wanted)
        found = []
        while slot < len(self._hashes) and self._hashes[slot] == wanted:
            line = self._read(slot)
            if _input_of(line) == key:  # not just an equal hash
                found.append((self._places[slot], json.loads(line)))
            slot += 1
        return found

    def _read(self, slot: int) -> bytes:
        file_no = self._files[slot]
        path = self.paths[file_no]
        with open(path, "rb") as handle:
            if _stamp(path, handle.fileno()) != self._stamps[file_no]:
                raise TasksetError(
                    f"{path} changed since the recorded tasks were matched to its rows. Fix: leave the "
                    "environment's dataset files as they are while its recordings run, or load the taskset again."
                )
            return os.pread(handle.fileno(), self._lengths[slot], self._offsets[slot])


def _stamp(path: Path, fd: int | None = None) -> tuple[int, int, int]:
    info = os.fstat(fd) if fd is not None else os.stat(path)
    return info.st_ino, info.st_size, info.st_mtime_ns


class RecordedTasks:
    """Restores recorded tasks from the dataset files of their environment (found when first needed)."""

    def __init__(self, dataset_paths: Iterable[Path]) -> None:
        self._paths = list(dataset_paths)
        self._rows: DatasetRows | None = None
        self._lock = threading.Lock()
        self.ambiguous = 0
        """Recordings matched to one of several rows that share their input with nothing to tell them apart."""

    def restore(self, task: Task) -> Task:
        """``task`` with the fields of its dataset row (see the module docs); unchanged when no row matches."""
        candidates = self._dataset_rows().find_all(input_key(task.row[RESPONSES_CREATE_PARAMS].get("input")))
        if not candidates:
            return task
        original, guessed = best_row(task.row, candidates)
        if guessed:
            with self._lock:
                self.ambiguous += 1
                first = self.ambiguous == 1
            if first:
                logger.warning(
                    "%s: recordings share their prompt with several dataset rows that differ in other fields, and "
                    "carry none of those fields: each is replayed on the best guess among them, which may not be the "
                    "row it was recorded on (its reward can then differ). Fix: replay runs saved with --save-trace "
                    "(their rows' own fields are recorded), or give such rows distinct prompts.",
                    task.source,
                )
        row = {key: value for key, value in original.items() if key != RESPONSES_CREATE_PARAMS}
        row[RESPONSES_CREATE_PARAMS] = task.row[RESPONSES_CREATE_PARAMS]
        for key in (*RECORDED_OUTPUTS, AGENT_REF):
            if key in task.row:
                row[key] = task.row[key]
        return dataclasses.replace(task, row=row, recorded_row=task.row)

    def _dataset_rows(self) -> DatasetRows:
        with self._lock:
            if self._rows is None:
                self._rows = DatasetRows(self._paths)
            return self._rows
