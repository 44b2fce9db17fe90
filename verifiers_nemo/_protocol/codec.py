"""JSON encoding for everything on the wire and in traces: orjson when installed, plain json else."""

from __future__ import annotations

import json
from typing import Any

try:  # orjson is faster and ships with nemo-gym; plain json is the fallback.
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None  # type: ignore[assignment]


def dumps(obj: Any) -> bytes:
    """Serialize to compact JSON bytes."""
    if _orjson is not None:
        try:
            # orjson's bytes keep a 4 KiB buffer; a right-sized copy costs < 1 us and keeps
            # recorded calls small.
            return bytes(memoryview(_orjson.dumps(obj)))
        except TypeError:  # e.g. an integer beyond 64 bits
            pass
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def loads(data: bytes | str) -> Any:
    """Parse JSON (raises ``ValueError`` on garbage)."""
    if _orjson is not None:
        try:
            return _orjson.loads(data)
        except _orjson.JSONDecodeError:
            pass  # plain json accepts a few things orjson does not (huge integers)
    return json.loads(data)
