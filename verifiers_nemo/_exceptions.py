"""Exceptions raised by verifiers_nemo.

Two families:

* ``VerifiersNemoError`` subclasses raised to the caller for bad input or an environment that cannot
  start (one clear message naming the problem and the fix).
* ``RolloutError`` subclasses carried on a ``RolloutResult`` (never raised out of a batch). Each has a
  ``type`` string that is also what results files and summaries use.
"""

from __future__ import annotations

from typing import Any, Literal

FailureKind = Literal["http", "timeout", "connection", "protocol", "conversion", "internal"]


class VerifiersNemoError(Exception):
    """Base class of every error this package raises."""


class ConfigurationError(VerifiersNemoError, ValueError):
    """Bad input from the caller: an argument, a file, an environment name."""


class GymRuntimeError(VerifiersNemoError, RuntimeError):
    """No interpreter with nemo-gym could be found or built."""


class UnknownEnvironmentError(ConfigurationError, LookupError):
    """A NeMo Gym environment name that is not packaged."""


class TasksetError(ConfigurationError):
    """A JSONL task file that cannot be used (the message names file and line)."""


class MissingRequirementsError(VerifiersNemoError, RuntimeError):
    """A Gym server needs Python packages that the Gym runtime does not have.

    ``missing`` maps each server to its missing requirements; ``describe(fix)`` words the message
    with another way to ask for isolated venvs (the CLI names its ``-a`` flag)."""

    def __init__(self, env: str, python: str, missing: dict[str, list[str]]) -> None:
        self.env, self.python, self.missing = env, python, missing
        super().__init__(self.describe("pass isolated_venvs=True"))

    def describe(self, isolated_venvs: str) -> str:
        lines = "\n".join(f"  {server}: {', '.join(reqs)}" for server, reqs in self.missing.items())
        return (
            f"Gym environment {self.env} needs packages the Gym runtime ({self.python}) does not have:\n"
            f"{lines}\nInstall them into that interpreter, or {isolated_venvs} to let nemo-gym build a "
            "separate venv per server from PyPI."
        )

    def __reduce__(self) -> tuple[type, tuple[str, str, dict[str, list[str]]]]:
        return type(self), (self.env, self.python, self.missing)


class StackStartError(VerifiersNemoError, RuntimeError):
    """A Gym server stack failed to start or become ready in time."""


class RolloutError(VerifiersNemoError):
    """Why one rollout failed. Carried on its result; ``type`` names the failure kind."""

    type: str = "error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def to_dict(self) -> dict[str, str]:
        return {"type": self.type, "message": self.message}


class RolloutTimeout(RolloutError):
    """The rollout did not finish within its time limit."""

    type = "timeout"


class UpstreamError(RolloutError):
    """The policy's inference endpoint failed (after bounded retries) or answered garbage."""

    type = "upstream"


class UpstreamFailure(UpstreamError):
    """An ``UpstreamError`` with the facts of the failed call.

    ``kind`` is one of ``http`` (a non-retryable or exhausted HTTP status), ``timeout``,
    ``connection``, ``protocol`` (garbage JSON or a reply that does not validate), ``conversion``
    (a request that cannot be expressed to this upstream) or ``internal``.
    """

    def __init__(
        self,
        message: str,
        *,
        kind: FailureKind,
        upstream_status: int | None = None,
        attempts: int = 0,
        request: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.upstream_status = upstream_status
        self.attempts = attempts
        self.request = request


class GymAgentError(RolloutError):
    """The Gym agent (or a server behind it) answered the run with an error."""

    type = "gym_agent"


class GymServerDown(RolloutError):
    """A process of the Gym stack died or stopped answering during the rollout."""

    type = "gym_server_down"


class InvalidResult(RolloutError):
    """The Gym agent returned a result that cannot be mapped (e.g. a non-numeric reward)."""

    type = "invalid_result"


class RouteClosed(RolloutError):
    """A policy call arrived for a route that was already closed."""

    type = "route_closed"
