"""The results folder of a saved run (``results.jsonl`` + ``metadata.json``) and the resume
bookkeeping over its records: reading a possibly cut-off file, deduplicating, what is missing."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import secrets
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO, Any

from .._exceptions import ConfigurationError

logger = logging.getLogger(__name__)

Pair = tuple[int, int]
RESULTS_FILE = "results.jsonl"
METADATA_FILE = "metadata.json"
DEFAULT_OUTPUT_DIR = Path("outputs") / "evals"
_UNSAFE_PATH_CHARS = re.compile(r"[^A-Za-z0-9._=+-]+")


def run_folder_name(env: str, model: str) -> str:
    """``<env>--<model>`` with ``/`` as ``--`` and anything unsafe in a path as ``_``."""
    return f"{_safe(env)}--{_safe(model.replace('/', '--'))}"


def _safe(text: str) -> str:
    return _UNSAFE_PATH_CHARS.sub("_", text).strip("._") or "_"


def new_run_id() -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def missing_pairs(expected: Iterable[Pair], records: Iterable[Mapping[str, Any]]) -> list[Pair]:
    """The expected (task_index, rollout_index) pairs no record covers, in expected order."""
    done = {(int(r["task_index"]), int(r["rollout_index"])) for r in records}
    return [pair for pair in expected if pair not in done]


def dedupe_records(
    records: Iterable[Mapping[str, Any]], expected: set[Pair] | None = None
) -> tuple[list[dict[str, Any]], int, int]:
    """Records keeping the first of each pair and (when given) only expected pairs.

    Returns ``(kept, duplicates, unexpected)``.
    """
    seen: set[Pair] = set()
    kept, duplicates, unexpected = [], 0, 0
    for record in records:
        pair = (int(record["task_index"]), int(record["rollout_index"]))
        if expected is not None and pair not in expected:
            unexpected += 1
        elif pair in seen:
            duplicates += 1
        else:
            seen.add(pair)
            kept.append(dict(record))
    return kept, duplicates, unexpected


def read_results(path: Path, *, repair: bool = False) -> tuple[list[dict[str, Any]], bool]:
    """Records of a ``results.jsonl``; returns ``(records, truncated_tail)``.

    A last line cut short (the run was killed mid-write) is tolerated, and with ``repair`` cut off
    the file so new lines append cleanly. A bad line anywhere else is an error naming file:line.
    """
    if not path.exists():
        return [], False
    lines = path.read_bytes().split(b"\n")
    records: list[dict[str, Any]] = []
    good_end = 0  # byte offset just past the last good line
    truncated = False
    for number, line in enumerate(lines, start=1):
        if line.strip():
            try:
                record = json.loads(line)
                if not isinstance(record, dict) or "task_index" not in record or "rollout_index" not in record:
                    raise ValueError("not a rollout record (no task_index/rollout_index)")
            except ValueError as exc:
                if any(rest.strip() for rest in lines[number:]):
                    raise ConfigurationError(
                        f"{path}:{number} is not a valid result line ({exc}). Delete that line (its rollout "
                        "then runs again when the run is resumed) or fix it, then resume."
                    ) from None
                truncated = True
                break
            records.append(record)
        good_end += len(line) + 1
    if repair:
        with open(path, "r+b") as f:
            size = f.seek(0, os.SEEK_END)
            if truncated:
                logger.warning("%s: dropping a truncated last line (the run was cut off writing it)", path)
                f.truncate(good_end)
                size = good_end
            if size:
                f.seek(size - 1)
                if f.read(1) != b"\n":
                    f.write(b"\n")
    return records, truncated


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

    def close(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            self._file.close()
            self._file = None
