"""Exceptions raised by verifiers_nemo, as one tree (catch at the level you care about)::

    VerifiersNemoError
    ├── ConfigurationError (ValueError)        bad input from the caller
    │   ├── UnknownEnvironmentError (LookupError)
    │   └── TasksetError
    ├── GymRuntimeError (RuntimeError)         no interpreter with nemo-gym
    ├── MissingRequirementsError (RuntimeError)
    ├── StackStartError (RuntimeError)
    └── RolloutError                           error.type "error"
        ├── RolloutTimeout                     "timeout"
        ├── UpstreamError                      "upstream"
        │   ├── UpstreamHTTPError              "upstream_http"
        │   ├── UpstreamTimeout                "upstream_timeout"
        │   ├── UpstreamConnectionError        "upstream_connection"
        │   ├── UpstreamProtocolError          "upstream_protocol"
        │   ├── UpstreamConversionError        "upstream_conversion"
        │   └── UpstreamInternalError          "upstream_internal"
        ├── GymAgentError                      "gym_agent"
        ├── GymServerDown                      "gym_server_down"
        ├── WorkerLost                         "worker_lost"
        ├── InvalidResult                      "invalid_result"
        └── VerifiersEpisodeError              "verifiers_episode"

The ``ConfigurationError``/runtime branch is raised to the caller (one clear message naming the
problem and the fix). ``RolloutError`` subclasses are carried on a ``RolloutResult`` (never raised
out of a batch); each class's ``type`` is the ``error.type`` string of results files and summaries.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


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
    """A Gym server needs Python packages that the Gym runtime does not have, and they could not be
    installed for it (into an environment derived from the runtime; see ``reason``: uv's explanation).

    ``missing`` maps each server to its missing requirements; ``describe(fix)`` words the message
    with another way to ask for isolated venvs (the CLI names its ``-a`` flag)."""

    def __init__(self, env: str, python: str, missing: dict[str, list[str]], reason: str | None = None) -> None:
        self.env, self.python, self.missing, self.reason = env, python, missing, reason
        super().__init__(self.describe("pass isolated_venvs=True"))

    def describe(self, isolated_venvs: str) -> str:
        lines = "\n".join(f"  {server}: {', '.join(reqs)}" for server, reqs in self.missing.items())
        if self.reason is None:
            return (
                f"Gym environment {self.env} needs packages the Gym runtime ({self.python}) does not have:\n"
                f"{lines}\nInstall them into that interpreter, or {isolated_venvs} to let nemo-gym build a "
                "separate venv per server from PyPI."
            )
        reason = "\n".join(f"  {line}" if line.strip() else "" for line in self.reason.splitlines())
        if "not in the offline folder" in self.reason:
            return (
                f"Gym environment {self.env} needs packages the Gym runtime ({self.python}) does not have:\n"
                f"{lines}\nand the offline folder does not hold them all:\n{reason}\nGather them on a connected "
                f"machine (`verifiers-nemo prepare {self.env} --gather DIR`) and copy the folder here again."
            )
        return (
            f"Gym environment {self.env} needs packages the Gym runtime ({self.python}) does not have:\n"
            f"{lines}\nand they could not be installed into an environment derived from it (constrained to "
            f"the versions nemo-gym needs):\n{reason}\nFix or install them yourself, or {isolated_venvs} to "
            "let nemo-gym build a separate, unconstrained venv per server from PyPI."
        )

    def __reduce__(self) -> tuple[type, tuple[str, str, dict[str, list[str]], str | None]]:
        return type(self), (self.env, self.python, self.missing, self.reason)


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

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RolloutError:
        """The error a results line holds (``to_dict``) as the class its ``type`` names; a type this release does not
        know keeps its string on a plain ``RolloutError``."""
        kind, message = str(data.get("type") or cls.type), str(data.get("message") or "")
        found = _error_class(RolloutError, kind)
        error = found(message) if found is not None else RolloutError(message)
        if found is None:
            error.type = kind
        return error


def _error_class(base: type[RolloutError], kind: str) -> type[RolloutError] | None:
    if base.type == kind:
        return base
    for sub in base.__subclasses__():
        found = _error_class(sub, kind)
        if found is not None:
            return found
    return None


class RolloutTimeout(RolloutError):
    """The rollout did not finish within its time limit."""

    type = "timeout"


class UpstreamError(RolloutError):
    """The policy's inference endpoint failed (after bounded retries) or answered garbage.

    Raised as one of its leaves below; ``upstream_status``, ``attempts`` and ``request`` (what was
    sent) are the facts of the failed call where known. ``kind`` is the short word the proxy puts in
    its error answer to the Gym agent. Results written before the leaves existed carry ``upstream``.
    """

    type = "upstream"
    kind = "upstream"

    def __init__(
        self,
        message: str,
        *,
        upstream_status: int | None = None,
        attempts: int = 0,
        request: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.upstream_status = upstream_status
        self.attempts = attempts
        self.request = request


class UpstreamHTTPError(UpstreamError):
    """A status that will not heal: a 4xx, or a 408/429/5xx still there when the retries ran out."""

    type = "upstream_http"
    kind = "http"


class UpstreamTimeout(UpstreamError):
    """No connection, or no complete answer, within the call's time budget."""

    type = "upstream_timeout"
    kind = "timeout"


class UpstreamConnectionError(UpstreamError):
    """The connection was refused or broke on every attempt."""

    type = "upstream_connection"
    kind = "connection"


class UpstreamProtocolError(UpstreamError):
    """The upstream answered, but not with JSON or not with an object Gym can accept."""

    type = "upstream_protocol"
    kind = "protocol"


class UpstreamConversionError(UpstreamError):
    """The request has no equivalent in the upstream's API (e.g. a hosted tool over Chat Completions)."""

    type = "upstream_conversion"
    kind = "conversion"


class UpstreamInternalError(UpstreamError):
    """The upstream implementation itself raised something unexpected (a bug, not the endpoint)."""

    type = "upstream_internal"
    kind = "internal"


class GymAgentError(RolloutError):
    """The Gym agent (or a server behind it) answered the run with an error."""

    type = "gym_agent"


class GymServerDown(RolloutError):
    """A process of the Gym stack died or stopped answering during the rollout, or its restart failed."""

    type = "gym_server_down"


class GymEpisodeFailed(RolloutError):
    """Gym said the episode failed (its ``_ng_failure_class``: an environment server's ``failure``, an agent's own
    failure row): no rollout to score. ``terminal`` ones are never tried again; the others were tried as often as
    Gym's collector tries them."""

    type = "gym_episode_failed"


class WorkerLost(RolloutError):
    """The worker running the rollout (a Ray actor, or its node) died, and no other worker could run it."""

    type = "worker_lost"


class InvalidResult(RolloutError):
    """The Gym agent returned a result that cannot be mapped (e.g. a non-numeric reward)."""

    type = "invalid_result"


class VerifiersEpisodeError(RolloutError):
    """verifiers failed the episode around a Gym rollout that did not fail (its env, interception or scoring)."""

    type = "verifiers_episode"
