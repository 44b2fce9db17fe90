"""Reading a JSONL file of rows: streamed, each row checked, bad rows raised or skipped, a ``limit``
that stops reading or (shuffled) a uniform reservoir sample. A file's rows are held as where they are in it
(``FileRows``: offsets, not text; a row is read back when its task is built); rows from elsewhere (a dataset)
as compact JSON bytes (``RowStore``)."""

from __future__ import annotations

import json
import logging
import os
import random
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .._exceptions import TasksetError
from .saved_results import as_recording
from .validation import RowChecker, RowError

logger = logging.getLogger(__name__)

OnError = Literal["raise", "skip"]
_MAX_SKIP_REASONS = 5


@dataclass(frozen=True)
class SkippedRows:
    """What ``on_error="skip"`` left out: how many rows, and why (the first few)."""

    count: int = 0
    reasons: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return self.count > 0


class RowStore:
    """Rows as compact JSON bytes plus their line, row index and agent; cheap to hold by the million."""

    def __init__(self) -> None:
        self.lines: list[bytes] = []
        self.line_nos = array("q")
        self.row_indexes = array("q")
        self.agents: list[str | None] = []

    @property
    def size(self) -> int:
        return len(self.lines)

    def append(self, line: bytes, line_no: int, row_index: int, agent: str | None) -> None:
        self.lines.append(line)
        self.line_nos.append(line_no)
        self.row_indexes.append(row_index)
        self.agents.append(agent)

    def put(self, slot: int, line: bytes, line_no: int, row_index: int, agent: str | None) -> None:
        self.lines[slot] = line
        self.line_nos[slot] = line_no
        self.row_indexes[slot] = row_index
        self.agents[slot] = agent

    def get(self, slot: int) -> tuple[bytes, int, int, str | None]:
        return self.lines[slot], self.line_nos[slot], self.row_indexes[slot], self.agents[slot]

    def shuffle(self, rng: random.Random) -> None:
        order = list(range(self.size))
        rng.shuffle(order)
        self.lines = [self.lines[i] for i in order]
        self.line_nos = array("q", (self.line_nos[i] for i in order))
        self.row_indexes = array("q", (self.row_indexes[i] for i in order))
        self.agents = [self.agents[i] for i in order]


class FileRows:
    """Rows of a JSONL file held as where they are in it: offset, length, line, row index and agent, about 24
    bytes a row (a million rows: ~24 MB, whatever their size). ``get`` reads a row's bytes back from the file,
    which must not change meanwhile (a ``TasksetError`` says so when it has)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offsets = array("q")
        self.lengths = array("I")
        self.line_nos = array("I")
        self.row_indexes = array("I")
        self.agent_ids = array("I")
        self._agent_names: list[str | None] = []
        self._agent_ids: dict[str | None, int] = {}
        self._stamp: tuple[int, int, int] | None = None

    @property
    def size(self) -> int:
        return len(self.offsets)

    @property
    def agents(self) -> Iterator[str | None]:
        """Each row's agent, in row order."""
        names = self._agent_names
        return (names[i] for i in self.agent_ids)

    def _agent_id(self, agent: str | None) -> int:
        found = self._agent_ids.get(agent)
        if found is None:
            found = self._agent_ids[agent] = len(self._agent_names)
            self._agent_names.append(agent)
        return found

    def append(self, offset: int, length: int, line_no: int, row_index: int, agent: str | None) -> None:
        self.offsets.append(offset)
        self.lengths.append(length)
        self.line_nos.append(line_no)
        self.row_indexes.append(row_index)
        self.agent_ids.append(self._agent_id(agent))

    def put(self, slot: int, offset: int, length: int, line_no: int, row_index: int, agent: str | None) -> None:
        self.offsets[slot] = offset
        self.lengths[slot] = length
        self.line_nos[slot] = line_no
        self.row_indexes[slot] = row_index
        self.agent_ids[slot] = self._agent_id(agent)

    def seal(self) -> None:
        """Remember the file as read: a row read back later must come from that same file."""
        self._stamp = _stamp(os.stat(self.path))

    def get(self, slot: int) -> tuple[bytes, int, int, str | None]:
        with open(self.path, "rb") as handle:
            if self._stamp is not None and _stamp(os.fstat(handle.fileno())) != self._stamp:
                raise TasksetError(
                    f"{self.path} changed since its tasks were loaded (a row is read back from the file when its "
                    "task is built). Fix: leave the file as it is while its tasks run, or load the taskset again."
                )
            line = os.pread(handle.fileno(), self.lengths[slot], self.offsets[slot])
        return line, self.line_nos[slot], self.row_indexes[slot], self._agent_names[self.agent_ids[slot]]

    def shuffle(self, rng: random.Random) -> None:
        order = list(range(self.size))
        rng.shuffle(order)
        for name in ("offsets", "lengths", "line_nos", "row_indexes", "agent_ids"):
            column = getattr(self, name)
            setattr(self, name, array(column.typecode, (column[i] for i in order)))


def _stamp(info: os.stat_result) -> tuple[int, int, int]:
    return info.st_ino, info.st_size, info.st_mtime_ns


@dataclass(frozen=True)
class LoadedRows:
    """A taskset's rows and what they are: read from a JSONL file, or rebuilt from a dataset."""

    store: FileRows | RowStore
    path: Path
    """The JSONL file the rows came from."""
    env_name: str | None
    recorded: bool
    """Whether the rows are recorded rollouts (replayable)."""
    rollouts_per_task: int
    skipped: SkippedRows = SkippedRows()
    """Rows left out by ``on_error="skip"``."""


def read_rows(
    path: Path,
    checker: RowChecker,
    *,
    limit: int | None,
    shuffle: bool,
    seed: int,
    on_error: OnError,
) -> tuple[FileRows, SkippedRows]:
    store = FileRows(path)
    rng = random.Random(seed)
    sampling = shuffle and limit is not None
    seen_rows = 0  # non-blank lines
    valid_rows = 0
    skipped = 0
    reasons: list[str] = []
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        raise TasksetError(
            f"{path}: no such file. Fix: check the path (relative paths are taken from {Path.cwd()})."
        ) from None
    except OSError as exc:
        raise TasksetError(
            f"{path}: cannot be opened ({exc.strerror}). Fix: check the path and its permissions."
        ) from None
    with handle:
        end = 0
        for line_no, raw in enumerate(handle, 1):
            start, end = end, end + len(raw)
            line = raw.strip()
            start += len(raw) - len(raw.lstrip())
            if line_no == 1 and line.startswith(b"\xef\xbb\xbf"):
                start += len(line) - len(line[3:].lstrip())
                line = line[3:].strip()
            if not line:
                continue
            row_index = seen_rows
            seen_rows += 1
            try:
                try:
                    row = json.loads(line)
                except (ValueError, RecursionError) as exc:
                    raise RowError(_json_problem(exc), "make the line one complete JSON object") from None
                agent = checker.check(as_recording(row) if checker.recorded else row)
            except RowError as exc:
                if on_error == "raise":
                    raise checker.error(line_no, exc.problem, exc.fix) from None
                skipped += 1
                if len(reasons) < _MAX_SKIP_REASONS:
                    reasons.append(f"line {line_no}: {exc.problem}")
                continue
            if sampling:
                assert limit is not None
                if valid_rows < limit:
                    store.append(start, len(line), line_no, row_index, agent)
                else:
                    slot = rng.randrange(valid_rows + 1)
                    if slot < limit:
                        store.put(slot, start, len(line), line_no, row_index, agent)
                valid_rows += 1
                continue
            store.append(start, len(line), line_no, row_index, agent)
            valid_rows += 1
            if limit is not None and valid_rows >= limit:
                break
    if shuffle:
        store.shuffle(rng)
    store.seal()
    if seen_rows == 0:
        raise TasksetError(
            f"{path}: the file is empty (no JSON lines). Fix: write one task per line, "
            '{"responses_create_params": {"input": [...]}}, or point at another file.'
        )
    if store.size == 0:
        raise TasksetError(
            f"{path}: no usable rows, all {skipped} were skipped (first: {reasons[0]}). "
            "Fix: correct the rows, or load with on_error='raise' to see the first error in full."
        )
    if skipped:
        logger.warning(
            "skipped %d bad row(s) of %s (on_error='skip'); first: %s", skipped, path, "; ".join(reasons[:3])
        )
    return store, SkippedRows(skipped, tuple(reasons))


def _json_problem(exc: BaseException) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"malformed JSON ({exc.msg} at column {exc.colno})"
    if isinstance(exc, UnicodeDecodeError):
        return f"the line is not UTF-8 text ({exc.reason} at byte {exc.start})"
    if isinstance(exc, RecursionError):
        return "malformed JSON (nested too deeply)"
    return f"malformed JSON ({exc})"
