"""The results folder of a saved run (``results.jsonl`` + ``metadata.json``) and the resume bookkeeping over
its records: reading a possibly cut-off file one line at a time, which expected pairs are done (a bit each),
duplicates and strays counted."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import secrets
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from .._exceptions import ConfigurationError
from .._protocol import loads

logger = logging.getLogger(__name__)

Pair = tuple[int, int]
RESULTS_FILE = "results.jsonl"
METADATA_FILE = "metadata.json"
DEFAULT_OUTPUT_DIR = Path("outputs") / "evals"
_UNSAFE_PATH_CHARS = re.compile(r"[^A-Za-z0-9._=+-]+")


def run_folder_name(env: str, model: str) -> str:
    """``<env>--<model>`` with ``/`` as ``--`` and anything unsafe in a path as ``_`` (an environment of yours by
    its folder's name)."""
    from .._gym import env_label

    return f"{_safe(','.join(env_label(e) for e in env.split(',')))}--{_safe(model.replace('/', '--'))}"


def _safe(text: str) -> str:
    return _UNSAFE_PATH_CHARS.sub("_", text).strip("._") or "_"


def new_run_id() -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


class ExpectedRollouts:
    """The (task_index, rollout_index) pairs a run expects, numbered ``0..len-1`` without listing them.

    ``rows[i]`` is how many rows environment ``i`` has; with ``stride`` (a mix) its task indices start at
    ``i * stride``. Each row has ``rollouts_per_example`` rollouts, numbered from 0."""

    def __init__(self, rows: Sequence[int], rollouts_per_example: int, stride: int | None = None) -> None:
        if len(rows) > 1 and stride is None:
            raise ValueError("several environments need a stride")
        self.rows = list(rows)
        self.rollouts_per_example = rollouts_per_example
        self.stride = stride
        self._starts = [0]
        for count in self.rows:
            self._starts.append(self._starts[-1] + count * rollouts_per_example)

    def __len__(self) -> int:
        return self._starts[-1]

    def slot(self, task_index: int, rollout_index: int) -> int | None:
        """The pair's number, or None when the run does not expect it."""
        env, row = (task_index // self.stride, task_index % self.stride) if self.stride else (0, task_index)
        if not (
            0 <= env < len(self.rows) and 0 <= row < self.rows[env] and 0 <= rollout_index < self.rollouts_per_example
        ):
            return None
        return self._starts[env] + row * self.rollouts_per_example + rollout_index

    def __iter__(self) -> Iterator[Pair]:
        for env, count in enumerate(self.rows):
            base = env * self.stride if self.stride else 0
            for row in range(count):
                for rollout in range(self.rollouts_per_example):
                    yield base + row, rollout


class DoneRollouts:
    """Which expected pairs have a record: one bit a pair (a run of a million rollouts: 125 KB)."""

    def __init__(self, expected: ExpectedRollouts) -> None:
        self.expected = expected
        self._bits = bytearray((len(expected) + 7) // 8)
        self.count = 0
        self.duplicates = 0
        self.unexpected = 0

    def add(self, record: Mapping[str, Any]) -> bool:
        """Mark the record's pair done; False (and counted) when the run does not expect it or it is done."""
        slot = self.expected.slot(int(record["task_index"]), int(record["rollout_index"]))
        if slot is None:
            self.unexpected += 1
            return False
        byte, bit = divmod(slot, 8)
        if self._bits[byte] >> bit & 1:
            self.duplicates += 1
            return False
        self._bits[byte] |= 1 << bit
        self.count += 1
        return True

    def __contains__(self, pair: Pair) -> bool:
        slot = self.expected.slot(*pair)
        return slot is not None and bool(self._bits[slot // 8] >> (slot % 8) & 1)

    @property
    def complete(self) -> bool:
        return self.count == len(self.expected)


class SavedResults:
    """The records of a ``results.jsonl``, read one line at a time (the file is never held whole).

    A last line cut short (the run was killed mid-write) is tolerated: after reading, ``truncated`` says so
    and ``repair()`` cuts it off (and ends the file with a newline) so new lines append cleanly. A bad line
    anywhere else is an error naming file:line."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.truncated = False
        self._good_end = 0
        """Byte offset just past the last good line."""

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self.truncated, self._good_end = False, 0
        if not self.path.exists():
            return
        bad: tuple[int, str] | None = None
        with open(self.path, "rb") as handle:
            for number, line in enumerate(handle, start=1):
                if bad is not None:
                    if line.strip():
                        raise ConfigurationError(
                            f"{self.path}:{bad[0]} is not a valid result line ({bad[1]}). Delete that line (its "
                            "rollout then runs again when the run is resumed) or fix it, then resume."
                        )
                    continue
                if line.strip():
                    try:
                        record = loads(line)  # orjson when installed: a run's file can be gigabytes
                        if not isinstance(record, dict) or "task_index" not in record or "rollout_index" not in record:
                            raise ValueError("not a rollout record (no task_index/rollout_index)")
                    except ValueError as exc:
                        bad = (number, str(exc))
                        continue
                    yield record
                self._good_end += len(line)
        self.truncated = bad is not None

    def repair(self) -> None:
        """Cut off a truncated last line (read first) and end the file with a newline."""
        if not self.path.exists():
            return
        with open(self.path, "r+b") as f:
            size = f.seek(0, os.SEEK_END)
            if self.truncated:
                logger.warning("%s: dropping a truncated last line (the run was cut off writing it)", self.path)
                f.truncate(self._good_end)
                size = self._good_end
            if size:
                f.seek(size - 1)
                if f.read(1) != b"\n":
                    f.write(b"\n")


def read_results(path: Path, *, repair: bool = False) -> tuple[list[dict[str, Any]], bool]:
    """Records of a ``results.jsonl`` as a list; returns ``(records, truncated_tail)`` (see ``SavedResults``;
    with ``repair`` a cut-off last line is cut off the file)."""
    saved = SavedResults(path)
    records = list(saved)
    if repair:
        saved.repair()
    return records, saved.truncated


@dataclass
class ResumeState:
    """What a run folder's ``results.jsonl`` holds of the run: which pairs are done (the first record of each
    expected pair counts), and whether its last line was cut off."""

    done: DoneRollouts
    saved: SavedResults
    stamp: tuple[int, int, int] | None
    """The file's (inode, size, mtime) while it was read (None: it changed during the read, or is missing)."""

    @property
    def truncated(self) -> bool:
        return self.saved.truncated

    def unchanged(self) -> bool:
        """Whether the file is still as it was read (so what was read holds)."""
        return self.stamp is not None and self.stamp == _stamp(self.saved.path)

    def repair(self) -> None:
        """Cut off a cut-off last line so new lines append cleanly (``SavedResults.repair``)."""
        self.saved.repair()


def read_resume_state(path: Path, expected: ExpectedRollouts, keep: Callable[[dict[str, Any]], None]) -> ResumeState:
    """Stream the saved records of a run, handing ``keep`` the first record of each expected pair."""
    before = _stamp(path)
    saved = SavedResults(path)
    done = DoneRollouts(expected)
    for record in saved:
        if done.add(record):
            keep(record)
    after = _stamp(path)
    return ResumeState(done, saved, after if after == before else None)


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        info = path.stat()
    except OSError:
        return None
    return info.st_ino, info.st_size, info.st_mtime_ns


class ResultsFolder:
    """``<output-dir>/<env>--<model>/<run id>/``: ``results.jsonl`` and ``metadata.json``.

    Open for writing, it holds an exclusive lock on ``results.jsonl`` so two runs never write the
    same folder at once.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: IO[str] | None = None

    @property
    def results_path(self) -> Path:
        return self.path / RESULTS_FILE

    @property
    def metadata_path(self) -> Path:
        return self.path / METADATA_FILE

    @property
    def run_id(self) -> str:
        return self.path.name

    @classmethod
    def create(cls, output_dir: Path, env: str, model: str) -> ResultsFolder:
        parent = output_dir / run_folder_name(env, model)
        for _ in range(5):
            path = parent / new_run_id()
            try:
                path.mkdir(parents=True)
            except FileExistsError:
                continue
            except OSError as exc:
                raise ConfigurationError(f"cannot create the results folder {path}: {exc.strerror}") from None
            return cls(path)
        raise ConfigurationError(f"cannot find a fresh run folder name under {parent}")

    @classmethod
    def existing(cls, path: Path) -> ResultsFolder:
        """A folder to resume; it must hold ``metadata.json``."""
        folder = cls(path)
        if not folder.metadata_path.is_file():
            hint = ""
            if path.is_dir():
                runs = sorted(p.parent.name for p in path.glob(f"*/{METADATA_FILE}"))
                if runs:
                    hint = f" It holds runs: {', '.join(runs[-5:])}; pass one of them."
            raise ConfigurationError(f"-R {path}: no {METADATA_FILE} there, so it is no eval results folder.{hint}")
        return folder

    def read_metadata(self) -> dict[str, Any]:
        try:
            data = json.loads(self.metadata_path.read_text())
        except (OSError, ValueError) as exc:
            raise ConfigurationError(f"cannot read {self.metadata_path}: {exc}") from None
        if not isinstance(data, dict) or not isinstance(data.get("settings"), dict):
            raise ConfigurationError(f"{self.metadata_path} holds no run settings.")
        return data

    def write_metadata(self, metadata: Mapping[str, Any]) -> None:
        """Replace ``metadata.json`` atomically."""
        tmp = self.metadata_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(metadata, indent=2, ensure_ascii=False, default=str) + "\n")
        os.replace(tmp, self.metadata_path)

    def open_for_append(self) -> None:
        """Open ``results.jsonl`` for new lines, locked; the folder must be writable (metadata.json
        is replaced in it), else one ConfigurationError naming the folder."""
        if self._file is not None:
            return
        probe = self.path / f".write-test-{secrets.token_hex(4)}"
        try:
            probe.touch()
            probe.unlink()
            handle = open(self.results_path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        except OSError as exc:
            where = self.path if exc.filename in (None, str(probe)) else exc.filename
            raise ConfigurationError(
                f"cannot write to the run folder {self.path} ({exc.strerror}: {where}); the run saves its "
                "rollouts there. Make it writable, or copy the folder somewhere writable and pass that copy."
            ) from None
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            raise ConfigurationError(
                f"another run is writing to {self.path} right now; wait for it or stop it first."
            ) from None
        self._file = handle

    def append(self, record: Mapping[str, Any]) -> None:
        """Write one rollout as one line and flush it, so a killed run keeps every finished rollout."""
        assert self._file is not None, "open_for_append() first"
        self._file.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
        self._file.flush()

    def discard(self) -> None:
        """Remove a run folder that holds no rollout (a fresh run that failed to start), and its model's folder
        when that is left empty; a folder with anything else in it is left as it is."""
        if self.results_path.exists() and self.results_path.stat().st_size:
            return
        self.close()
        for name in (RESULTS_FILE, METADATA_FILE):
            with contextlib.suppress(FileNotFoundError):
                (self.path / name).unlink()
        for folder in (self.path, self.path.parent):
            with contextlib.suppress(OSError):  # not empty (another run's, a file of the user's): kept
                folder.rmdir()

    def close(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            self._file.close()
            self._file = None
