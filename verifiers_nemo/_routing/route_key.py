"""The route-key codec: how a rollout's route key rides in its Gym row, is read back by the proxy, and is
taken out again before the upstream or the results see it.

The key travels in ``responses_create_params.metadata[ROUTE_METADATA_KEY]`` (Gym agents pass metadata
through to their policy unchanged) and in ``model`` (a fallback for agents that drop metadata).
"""

from __future__ import annotations

import copy
import secrets
from typing import Any

ROUTE_METADATA_KEY = "verifiers_nemo_route"
"""The ``metadata`` field a Gym row carries its route key in (the proxy reads it; results drop it)."""
_KEY_PREFIX = "vnr-"


def new_route_key() -> str:
    """A fresh, unguessable route key (192 bits from ``secrets``)."""
    return _KEY_PREFIX + secrets.token_urlsafe(24)


def row_with_route(row: dict[str, Any], key: str, gym_sampling: dict[str, Any] | None = None) -> dict[str, Any]:
    """A copy of ``row`` whose ``responses_create_params`` carry ``key`` (and the Gym sampling params)."""
    body = copy.deepcopy(row)
    params = body.setdefault("responses_create_params", {})
    params.update(gym_sampling or {})
    params["model"] = key
    params["metadata"] = {**(params.get("metadata") or {}), ROUTE_METADATA_KEY: key}
    return body


def route_key_of(body: dict[str, Any]) -> Any:
    """The route key a policy request carries (its metadata's, else its ``model``), or ``None``."""
    metadata = body.get("metadata")
    key = metadata.get(ROUTE_METADATA_KEY) if isinstance(metadata, dict) else None
    return key if key is not None else body.get("model")


def drop_route_metadata(body: dict[str, Any]) -> None:
    """Remove the route key from a policy request's metadata (in place; empty metadata removed)."""
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and ROUTE_METADATA_KEY in metadata:
        rest = {k: v for k, v in metadata.items() if k != ROUTE_METADATA_KEY}
        if rest:
            body["metadata"] = rest
        else:
            del body["metadata"]


def strip_route(gym_result: dict[str, Any], key: str, model: str | None) -> None:
    """Remove the route key from the echo of the request in a Gym result (in place)."""
    _strip_from(gym_result.get("responses_create_params"), key, model, empty_metadata=None)
    _strip_from(gym_result.get("response"), key, model, empty_metadata={})


def _strip_from(echo: Any, key: str, model: str | None, *, empty_metadata: dict[str, Any] | None) -> None:
    """``empty_metadata`` replaces metadata left empty: the request had none (``None``), while a
    Response keeps its (empty) object."""
    if not isinstance(echo, dict):
        return
    if echo.get("model") == key:
        echo["model"] = model
    metadata = echo.get("metadata")
    if isinstance(metadata, dict):
        metadata.pop(ROUTE_METADATA_KEY, None)
        if not metadata:
            echo["metadata"] = empty_metadata
