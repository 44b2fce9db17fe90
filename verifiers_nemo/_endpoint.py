"""Where a rollout's policy calls go: an OpenAI-compatible inference endpoint."""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from ._exceptions import ConfigurationError

ApiKind = Literal["responses", "chat"]
DEFAULT_API_KEY_VAR = "OPENAI_API_KEY"
_VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NOT_SECRETS = frozenset({"", "EMPTY", "dummy", "none", "None"})


@dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible server (vLLM, OpenAI, a trainer's recorder) and how to call it.

    ``base_url`` includes the version prefix (``http://host:8000/v1``). ``api`` picks the protocol
    the upstream speaks: ``responses`` passes Gym's Responses requests through, ``chat`` converts
    them to and from Chat Completions. ``sampling_args`` are defaults merged under each request's own.
    The API key is never shown by ``repr`` and never sent to Gym processes.

    ``return_tokens=True`` asks a vLLM server for what a trainer needs, whichever ``api``: prompt and
    completion token IDs and per-token logprobs, recorded on every ``PolicyCall`` (with ``api="chat"``
    it adds ``logprobs``/``return_token_ids``; with ``api="responses"`` ``enable_response_messages``
    and the output-logprobs ``include``). The sampling arg ``{"return_tokens": true}`` does the same
    per rollout. Those are vLLM request fields: servers without them may refuse the request.
    """

    base_url: str
    model: str
    api_key: str = field(default="EMPTY", repr=False)
    api: ApiKind = "responses"
    sampling_args: dict[str, Any] = field(default_factory=dict)
    extra_headers: dict[str, str] = field(default_factory=dict, repr=False)
    extra_body: dict[str, Any] = field(default_factory=dict)
    name: str | None = None
    return_tokens: bool = False
    exact_tokens: bool = False
    """Training-exact tokens from a stock vLLM (started with ``--enable-scale-out``): every turn after the
    first is generated from the exact token IDs already sampled plus what is new, rendered with the served
    model's own template; replies are parsed by vLLM's own tool and reasoning parsers (either ``api``)."""

    def __post_init__(self) -> None:
        parts = urlsplit(self.base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigurationError(
                f"Endpoint base_url {self.base_url!r} is not an http(s) URL with a host; "
                "pass something like 'http://127.0.0.1:8000/v1'."
            )
        if self.api not in ("responses", "chat"):
            raise ConfigurationError(f"Endpoint api must be 'responses' or 'chat', not {self.api!r}.")
        if not self.model:
            raise ConfigurationError("Endpoint model must be a non-empty model name.")
        object.__setattr__(self, "base_url", self.base_url.rstrip("/"))

    @property
    def secret_key(self) -> str | None:
        """The API key when it is a real secret (not a placeholder such as ``EMPTY``)."""
        return None if self.api_key in _NOT_SECRETS else self.api_key

    @property
    def label(self) -> str:
        """A name safe to log and save (never the key)."""
        return self.name or f"{self.model}@{self.base_url}"


@dataclass(frozen=True)
class ApiKey:
    """An endpoint's key (never logged) and the variable it came from."""

    value: str | None
    var: str
    explicit: bool
    """The variable was named (so it must be set)."""


def read_api_key(var: str | None, environ: Mapping[str, str] | None = None, *, option: str = "-k") -> ApiKey:
    """Read an API key variable. One named with ``option`` must be set; the default ``OPENAI_API_KEY``
    may be unset (keyless local servers)."""
    environ = os.environ if environ is None else environ
    explicit = var is not None
    name = var if var is not None else DEFAULT_API_KEY_VAR
    if not _VAR_NAME.fullmatch(name):  # never echo it: people sometimes pass the key itself
        raise ConfigurationError(
            f"{option} takes the NAME of the environment variable that holds the API key "
            f"(e.g. {option} OPENAI_API_KEY), not the key itself; what was given is no variable name."
        )
    value = environ.get(name) or None
    if explicit and value is None:
        raise ConfigurationError(
            f"The API key variable ${name} (named with {option}) is not set. Export it (export {name}=...) "
            f"or name another variable with {option}."
        )
    return ApiKey(value=value, var=name, explicit=explicit)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, IPv6 brackets allowed) is this machine's loopback."""
    if host.lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
