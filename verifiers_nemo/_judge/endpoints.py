"""Which endpoint answers each judge of an environment: ``judge=`` of the harness, normalised, and the
one builder of a judge ``Endpoint`` from flags (the CLI's ``--judge-*`` and the verifiers harness's)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .._endpoint import ApiKind, Endpoint, read_api_key
from .._exceptions import ConfigurationError, UpstreamError
from .._upstreams import FunctionUpstream

ANY_JUDGE = "*"
"""The key of a judge mapping that serves every judge name the mapping does not list."""


@dataclass(frozen=True)
class JudgeEndpoints:
    """Judge name → endpoint, with a default for names not listed (``None``: no judge given)."""

    default: Endpoint | None = None
    by_name: Mapping[str, Endpoint] = field(default_factory=dict)

    @classmethod
    def of(cls, judge: Endpoint | Mapping[str, Endpoint] | JudgeEndpoints | None) -> JudgeEndpoints:
        """From ``judge=``: one endpoint for every judge, or a mapping (``"*"`` for the rest)."""
        if judge is None:
            return cls()
        if isinstance(judge, JudgeEndpoints):
            return judge
        if isinstance(judge, Endpoint):
            return cls(default=judge)
        if isinstance(judge, Mapping):
            by_name = dict(judge)
            for name, endpoint in by_name.items():
                if not isinstance(endpoint, Endpoint):
                    raise ConfigurationError(f"judge[{name!r}] must be an Endpoint, not {type(endpoint).__name__}.")
            return cls(default=by_name.pop(ANY_JUDGE, None), by_name=by_name)
        raise ConfigurationError(f"judge= takes an Endpoint or a mapping of names to Endpoints, not {judge!r}.")

    def __bool__(self) -> bool:
        return self.default is not None or bool(self.by_name)

    def for_name(self, name: str) -> Endpoint | None:
        return self.by_name.get(name, self.default)

    def secrets(self) -> set[str]:
        """The judges' API keys (kept out of Gym processes like the policy's)."""
        endpoints = [self.default, *self.by_name.values()]
        return {e.secret_key for e in endpoints if e is not None and e.secret_key is not None}


def judge_endpoint(
    base_url: str,
    model: str,
    *,
    api_key_var: str | None = None,
    api: ApiKind = "responses",
    key_option: str = "--judge-api-key-var",
    environ: Mapping[str, str] | None = None,
) -> Endpoint:
    """A judge as an ``Endpoint``, its key read now from ``api_key_var`` (default ``OPENAI_API_KEY``, which
    may be unset for a keyless server; a variable named with ``key_option`` must be set)."""
    key = read_api_key(api_key_var, environ, option=key_option)
    url = base_url.rstrip("/")
    return Endpoint(base_url=url, model=model, api_key=key.value or "EMPTY", api=api, name=f"{model} @ {url}")


def _no_policy_yet(endpoint: Endpoint, body: dict[str, Any]) -> dict[str, Any]:
    raise UpstreamError("the policy judges this environment, but no rollout has given a policy endpoint yet")


NO_POLICY_YET = Endpoint(base_url="http://127.0.0.1:9/v1", model="policy", name="policy (not yet known)")
"""Where a ``policy_model`` judge points until the first rollout names its policy endpoint."""
NO_POLICY_YET_UPSTREAM = FunctionUpstream(_no_policy_yet)
