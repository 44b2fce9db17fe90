"""A recorded rollout as a runnable task: the task's own fields put back from its environment's dataset.

Gym's recordings (``example_rollouts.jsonl``) store what ``/verify`` returned, which often lacks the fields the
resources server needs (``/seed_session`` and ``/verify`` inputs: ground truth, a starting state...) and adds
verify outputs some servers reject when sent back. The environment's dataset row with the same input is the
task: its fields, with the recording's input, response, reward and agent kept (``Task.recorded_row`` keeps the
recording as written, judge calls included). A recording no dataset row matches is run as it is (its verify
outputs are left out of the row sent to Gym, ``Task.gym_row``).

Finding those rows costs one pass over the environment's dataset files, when the first recorded task is built;
what is kept is where each row is (a hash of its input, its file, offset and length: about 20 bytes a row), never
its text, so a large downloaded dataset is not held in memory, and the recordings themselves are read as any
taskset reads its rows.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import threading
from array import array
from bisect import bisect_left
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .._exceptions import TasksetError
from .task import AGENT_REF, RECORDED_OUTPUTS, RESPONSES_CREATE_PARAMS, Task


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


class DatasetRows:
    """Where each row of some JSONL files is, by the hash of its input (the first row of an input wins)."""

    def __init__(self, paths: Iterable[Path]) -> None:
        self.paths = list(dict.fromkeys(paths))
        self._stamps = [_stamp(path) for path in self.paths]
        hashes, files, offsets, lengths = array("q"), array("H"), array("q"), array("I")
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
                    offset += len(line)
        order = sorted(range(len(hashes)), key=hashes.__getitem__)  # stable: file order among equal hashes
        self._hashes = array("q", (hashes[i] for i in order))
        self._files = array("H", (files[i] for i in order))
        self._offsets = array("q", (offsets[i] for i in order))
        self._lengths = array("I", (lengths[i] for i in order))

    def __len__(self) -> int:
        return len(self._hashes)

    def find(self, key: str) -> dict[str, Any] | None:
        """The first row whose input is ``key`` (``input_key``), read back from its file; None when none is."""
        wanted = _hash(key)
        slot = bisect_left(self._hashes, wanted)
        while slot < len(self._hashes) and self._hashes[slot] == wanted:
            line = self._read(slot)
            if _input_of(line) == key:  # not just an equal hash
                return json.loads(line)
            slot += 1
        return None

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

    def restore(self, task: Task) -> Task:
        """``task`` with the fields of its dataset row (see the module docs); unchanged when no row matches."""
        original = self._dataset_rows().find(input_key(task.row[RESPONSES_CREATE_PARAMS].get("input")))
        if original is None:
            return task
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
