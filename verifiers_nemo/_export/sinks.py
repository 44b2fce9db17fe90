"""Where training-data rows go: a JSONL file (one row a line, its description in a ``.schema.json`` file beside it) or
a Parquet file (the format's Arrow schema, each column's description as field metadata, the description as key-value
metadata). Rows are written as they come, a row group at a time, to a temporary file in the same folder that replaces
the output only when everything was written: a failed export leaves no half file behind."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from .._exceptions import ConfigurationError
from .._protocol import dumps
from .schema import arrow_schema

SUFFIXES = (".jsonl", ".parquet")
SIDECAR_SUFFIX = ".schema.json"
METADATA_KEY = "verifiers_nemo"
"""The Parquet key-value metadata key (and the sidecar's content): the description of the file."""
ROW_GROUP_CELLS = 1 << 19
"""Rows are buffered until they hold about this many values (tokens, characters / 8), then written as a row group:
what a Parquet export holds in memory, whatever the size of the run."""


def sidecar_path(path: Path) -> Path:
    """The description file of a JSONL export: ``sft.jsonl`` → ``sft.jsonl.schema.json``."""
    return path.with_name(path.name + SIDECAR_SUFFIX)


class Sink:
    """Rows of one format into ``path`` (``.jsonl`` or ``.parquet``), atomically; ``describe`` is the file's
    description, written with it (its ``counts`` may be filled in until ``commit``)."""

    def __init__(self, path: Path, format_name: str, description: dict[str, Any]) -> None:
        if path.suffix not in SUFFIXES:
            raise ConfigurationError(
                f"{path}: a training-data export is a .jsonl or .parquet file; name the output with one of them."
            )
        self.path = path
        self.format_name = format_name
        self.description = description
        self.rows = 0
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            handle, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        except OSError as exc:
            raise ConfigurationError(
                f"cannot write {path}: {exc.strerror or exc}; pass -o PATH somewhere writable."
            ) from None
        os.close(handle)
        self._tmp = Path(tmp)
        self._buffer: list[dict[str, Any]] = []
        self._cells = 0
        self._writer: Any = None
        self._file: IO[bytes] | None = None
        if path.suffix == ".jsonl":
            self._file = open(self._tmp, "wb")  # noqa: SIM115 - closed in commit/discard
        else:
            import pyarrow.parquet as pq

            self._schema = arrow_schema(format_name)
            self._writer = pq.ParquetWriter(self._tmp, self._schema, compression="zstd")

    def write(self, row: Mapping[str, Any], cells: int = 1) -> None:
        """Add one row; ``cells``: about how many values it holds (it decides when a row group is written)."""
        self.rows += 1
        if self._file is not None:
            self._file.write(dumps(row) + b"\n")
            return
        self._buffer.append(dict(row))
        self._cells += cells
        if self._cells >= ROW_GROUP_CELLS:
            self._flush()

    def _flush(self) -> None:
        if self._buffer:
            import pyarrow as pa

            self._writer.write_table(pa.Table.from_pylist(self._buffer, schema=self._schema))
            self._buffer, self._cells = [], 0

    def commit(self) -> Path:
        """Finish the file (and its description) and move it into place."""
        text = json.dumps(self.description, indent=2, ensure_ascii=False)
        if self._file is not None:
            self._file.close()
            self._file = None
            sidecar = sidecar_path(self.path)
            tmp = sidecar.with_name(f".{sidecar.name}.tmp")
            tmp.write_text(text + "\n")
            os.replace(self._tmp, self.path)
            os.replace(tmp, sidecar)
        else:
            self._flush()
            self._writer.add_key_value_metadata({METADATA_KEY: text})
            self._writer.close()
            self._writer = None
            os.replace(self._tmp, self.path)
        return self.path

    def discard(self) -> None:
        """Drop what was written (the output is left as it was)."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()
            self._writer = None
        self._tmp.unlink(missing_ok=True)


def training_data_description(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The description an export was written with (format, version, source run, options, counts, columns): from a
    Parquet file's key-value metadata, or a JSONL file's ``.schema.json`` beside it."""
    path = Path(path)
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        metadata = pq.read_metadata(path).metadata or {}
        raw = metadata.get(METADATA_KEY.encode())
        if raw is None:
            raise ConfigurationError(f"{path} holds no verifiers-nemo description (was it written by this package?)")
        return json.loads(raw)
    sidecar = sidecar_path(path)
    try:
        return json.loads(sidecar.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigurationError(f"cannot read the description of {path} ({sidecar}): {exc}") from None
