"""Checks before an eval starts anything: the endpoint URL, the API key variable, the server and model.

Each failure is a ``PreflightError`` with one message that names the problem and the fix, raised
within seconds (the Gym stack has not started yet).
"""

from __future__ import annotations

import asyncio
import difflib
import logging
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from .._endpoint import ApiKey, is_loopback, read_api_key
from .._exceptions import ConfigurationError

logger = logging.getLogger(__name__)

PREFLIGHT_TIMEOUT_S = 5.0
_API_ROUTES = ("/chat/completions", "/completions", "/responses", "/models")
OPENAI_PREFIX = "/v1"
"""Where OpenAI-compatible servers (vLLM, SGLang, TGI, OpenAI itself) serve their routes."""


class PreflightError(ConfigurationError):
    """The endpoint cannot be used; ``usage`` tells bad input (exit 2) from an unreachable server (1)."""

    def __init__(self, message: str, *, usage: bool = True) -> None:
        super().__init__(message)
        self.usage = usage


def check_base_url(url: str) -> str:
    """An http(s) base URL with a host (and a valid port when one is given), without a trailing ``/``."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        guess = f"http://{url}" if "://" not in url else None
        hint = f" Did you mean {guess}?" if guess else ""
        raise PreflightError(
            f"-b {url!r} has no http:// or https:// scheme.{hint} "
            "Pass the OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1."
        )
    try:
        port = parts.port
    except ValueError:
        raise PreflightError(f"-b {url!r} has an invalid port; e.g. http://127.0.0.1:8000/v1.") from None
    if not parts.hostname:
        raise PreflightError(f"-b {url!r} has no host; e.g. http://127.0.0.1:8000/v1.")
    if parts.scheme == "http" and port is None and is_loopback(parts.hostname):
        raise PreflightError(
            f"-b {url!r} names a local server without a port (so port 80); local inference servers "
            "listen on a port such as 8000: http://127.0.0.1:8000/v1."
        )
    url = url.rstrip("/")
    for route in _API_ROUTES:
        if url.endswith(route) and len(url) > len(route):
            raise PreflightError(
                f"-b {url!r} is the URL of one API route; -b takes the base URL the routes hang from. "
                f"Did you mean -b {url.removesuffix(route)}?"
            )
    return url


def resolve_api_key(var: str | None, environ: Mapping[str, str] | None = None) -> ApiKey:
    """Read the ``-k`` API key variable (see ``read_api_key``); bad input is a ``PreflightError``."""
    try:
        return read_api_key(var, environ, option="-k")
    except ConfigurationError as exc:
        raise PreflightError(str(exc)) from None


async def list_models(base_url: str, key: ApiKey, *, timeout: float = PREFLIGHT_TIMEOUT_S) -> list[str] | None:
    """``GET {base_url}/models``: the model ids served, or None when the server does not list them.

    Raises PreflightError when the server cannot be reached, refuses the key, answers garbage, or
    answers only under ``{base_url}/v1`` (the usual OpenAI-compatible prefix, left out of ``-b``).
    """
    import aiohttp

    url = f"{base_url}/models"
    headers = {"Authorization": f"Bearer {key.value}"} if key.value else {}
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
            status, text = await _get(session, url, headers)
            if status in (404, 405) and not urlsplit(base_url).path.rstrip("/").endswith(OPENAI_PREFIX):
                await _refuse_missing_prefix(session, base_url, headers)
    except TimeoutError:
        raise PreflightError(
            f"The endpoint {base_url} did not answer GET /models within {timeout:g}s. "
            "Is the inference server up and reachable from here?",
            usage=False,
        ) from None
    except aiohttp.ClientError as exc:
        raise PreflightError(
            f"Cannot reach the endpoint {base_url} ({_reason(exc)}). Is the inference server running, "
            "and is -b right (scheme, host, port, /v1)?",
            usage=False,
        ) from None
    if status in (401, 403):
        if key.value is None:
            raise PreflightError(
                f"The endpoint {base_url} needs an API key (GET /models answered {status}) and ${key.var} "
                f"is not set. Export {key.var}=... or name the variable holding the key with -k."
            )
        raise PreflightError(
            f"The endpoint {base_url} refused the API key in ${key.var} (GET /models answered {status}). "
            "Check the key, or name another variable with -k."
        )
    if status == 404 or status == 405:
        logger.warning("%s does not list its models (GET /models answered %d); not checking -m", base_url, status)
        return None
    if status >= 400:
        raise PreflightError(
            f"The endpoint {base_url} answered GET /models with HTTP {status}: {text[:200]!r}. "
            "Is -b the server's OpenAI-compatible base URL (usually ending in /v1)?",
            usage=False,
        )
    models = _model_ids(text)
    if models is None:
        raise PreflightError(
            f"{url} did not answer with an OpenAI model list ({text[:120]!r}). "
            "Is -b the OpenAI-compatible base URL (usually ending in /v1)?",
            usage=False,
        )
    return models


async def _get(session: Any, url: str, headers: Mapping[str, str]) -> tuple[int, str]:
    async with session.get(url, headers=headers, allow_redirects=True) as response:
        return response.status, await response.text(errors="replace")


async def _refuse_missing_prefix(session: Any, base_url: str, headers: Mapping[str, str]) -> None:
    """``{base_url}/models`` is not there: when ``{base_url}/v1/models`` is (a model list, or a refused
    key), ``-b`` left out the ``/v1`` prefix, and every rollout would fail with 404; say so now."""
    import aiohttp

    try:
        status, text = await _get(session, f"{base_url}{OPENAI_PREFIX}/models", headers)
    except (TimeoutError, aiohttp.ClientError):
        return
    if status in (401, 403) or (status == 200 and _model_ids(text) is not None):
        raise PreflightError(
            f"-b {base_url} answers GET /models with 404, but {base_url}{OPENAI_PREFIX}/models answers: "
            f"the server serves the OpenAI API under {OPENAI_PREFIX}. Did you mean -b {base_url}{OPENAI_PREFIX}?"
        )


def _model_ids(text: str) -> list[str] | None:
    """The ids of an OpenAI model list (``{"data": [{"id": ...}]}``), or None when ``text`` is none."""
    import json

    try:
        return [str(m["id"]) for m in json.loads(text)["data"]]
    except (ValueError, KeyError, TypeError):
        return None


def _reason(exc: BaseException) -> str:
    import aiohttp

    if isinstance(exc, aiohttp.ClientConnectorError):
        cause = exc.os_error
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror
    return str(exc) or type(exc).__name__


def choose_model(model: str | None, served: list[str] | None, base_url: str) -> str:
    """The model to evaluate: ``-m`` when the server serves it, else the only one it serves."""
    if served is None:
        if not model:
            raise PreflightError(f"Pass the model to evaluate with -m ({base_url} does not list its models).")
        return model
    if model:
        if model in served:
            return model
        close = difflib.get_close_matches(model, served, n=3, cutoff=0.4)
        hint = f" Closest: {', '.join(close)}." if close else ""
        listing = ", ".join(served[:10]) + (f" (+{len(served) - 10} more)" if len(served) > 10 else "")
        raise PreflightError(f"Model {model!r} is not served by {base_url}.{hint} It serves: {listing or '(nothing)'}.")
    if len(served) == 1:
        logger.info("using the only model %s serves: %s", base_url, served[0])
        return served[0]
    listing = ", ".join(served[:10]) or "(nothing)"
    raise PreflightError(f"Pass the model to evaluate with -m; {base_url} serves: {listing}.")


def preflight(base_url: str, model: str | None, key: ApiKey, *, timeout: float = PREFLIGHT_TIMEOUT_S) -> str:
    """Check the endpoint (every replica of ``URL1,URL2``) and return the model to evaluate (blocking; at
    most ``timeout`` seconds a replica). Every replica must serve that model."""
    for url in base_urls(base_url):
        served = asyncio.run(list_models(url, key, timeout=timeout))
        model = choose_model(model, served, url)
    assert model is not None
    return model


def base_urls(value: str) -> list[str]:
    """The replicas of ``-b``: one base URL, or several separated by commas (each checked)."""
    urls = [check_base_url(url.strip()) for url in value.split(",") if url.strip()]
    if not urls:
        raise PreflightError("-b is empty; pass the OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1.")
    return urls
