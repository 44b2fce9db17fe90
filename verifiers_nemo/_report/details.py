"""The transcripts a report embeds, written as they are read: one gzip stream of ``{"D": [detail, ...], "S":
[text, ...]}`` in a temporary file (``D``: each shown rollout's transcript, verdict and metrics; ``S``: the string
table they refer to, after them), so the report's transcripts and their long texts never sit in memory together.
The browser unpacks it when a transcript is first opened.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import math
import shutil
import tempfile
from collections.abc import Iterator
from typing import IO, Any

from .transcript import Strings

_CHUNK = 3 * (1 << 18)
"""Bytes base64-encoded at a time (a multiple of 3: the chunks' encodings join up)."""


class StreamedStrings(Strings):
    """A string table whose texts go to a file as they are added (as JSON array items); it remembers each text by
    a 64-bit hash, not the text. ``text()`` reads only what is still in memory: nothing."""

    def __init__(self, sink: IO[bytes]) -> None:
        super().__init__()
        self._sink = sink
        self._count = 0
        self._hashes: dict[int, int] = {}

    def _index_of(self, text: str) -> int:
        key = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")
        index = self._hashes.get(key)
        if index is None:
            index = self._hashes[key] = self._count
            self._sink.write((b"," if self._count else b"") + _json(text))
            self._count += 1
        return index

    def __len__(self) -> int:
        return self._count


class DetailsWriter:
    """Shown rollouts' details, gzip-compressed to a temporary file one at a time (``add``), then the string table
    (``finish``); ``base64_chunks`` reads the result back for the HTML. A context manager: the files go at exit."""

    def __init__(self) -> None:
        self._packed = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
        self._texts = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
        self._gzip = gzip.GzipFile(fileobj=self._packed, mode="wb", compresslevel=6, mtime=0)
        self._gzip.write(b'{"D":[')
        self.strings = StreamedStrings(self._texts)
        self.count = 0
        self.size = 0
        """Compressed bytes, once finished."""

    def __enter__(self) -> DetailsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add(self, detail: dict[str, Any]) -> None:
        self._gzip.write((b"," if self.count else b"") + _json(clean(detail)))
        self.count += 1

    def finish(self) -> None:
        """Write the string table after the details and end the stream."""
        self._gzip.write(b'],"S":[')
        self._texts.seek(0)
        shutil.copyfileobj(self._texts, self._gzip)
        self._gzip.write(b"]}")
        self._gzip.close()
        self.size = self._packed.tell()

    def base64_chunks(self) -> Iterator[str]:
        """The finished stream, base64-encoded, a piece at a time."""
        self._packed.seek(0)
        while chunk := self._packed.read(_CHUNK):
            yield base64.b64encode(chunk).decode("ascii")

    def close(self) -> None:
        self._texts.close()
        self._packed.close()


def clean(value: Any) -> Any:
    """``value`` with NaN and infinities as None (JSON has none)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    return value


def _json(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
