"""``JudgeRouter``: the judges of one harness's environment, from the refusal of a missing judge to the
proxy ports their calls arrive on and the calls recorded there.

The harness, the CLI and the verifiers environment call it; none of them knows how judges are routed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._endpoint import Endpoint
from .._exceptions import ConfigurationError
from .._gym import POLICY_MODEL, cache_dir, classify_config, merged_configs
from .._protocol import sum_usage
from .config import plan_judges
from .endpoints import NO_POLICY_YET, NO_POLICY_YET_UPSTREAM, JudgeEndpoints

if TYPE_CHECKING:
    from .._routing import PolicyCall, Route, RoutingProxy
    from .._upstreams import Upstream

logger = logging.getLogger(__name__)

JUDGE_FLAGS_HINT = (
    "Pass --judge-base-url URL --judge-model MODEL [--judge-api-key-var VAR] (CLI), or judge=Endpoint(...) "
    "(Python); a mapping {name: Endpoint} (CLI: --judge NAME=URL,MODEL) gives each judge name its own."
)


class JudgeRouter:
    """Which endpoint answers each judge name of an environment (``judge=``: one ``Endpoint``, or a
    mapping with ``"*"`` for the rest), and the routes their calls take once the stack starts.

    A ``policy_model`` judge with no judge given follows the policy endpoint of the latest rollout
    (``follow_policy``), unless ``policy_may_judge=False`` refuses it (under verifiers its calls would be
    recorded as turns of the rollout)."""

    def __init__(self, env_name: str, judge: Endpoint | Mapping[str, Endpoint] | None = None) -> None:
        self.env_name = env_name
        self.endpoints = JudgeEndpoints.of(judge)
        self._routes: dict[str, Route] = {}
        self._policy_route: Route | None = None

    def __bool__(self) -> bool:
        """Whether a judge endpoint was given."""
        return bool(self.endpoints)

    def replace(self, judge: Endpoint | Mapping[str, Endpoint] | None) -> None:
        """Replace ``judge=`` (before the routes open)."""
        if self._routes:
            raise ConfigurationError("The judges cannot change once the stack has started.")
        self.endpoints = JudgeEndpoints.of(judge)

    def secrets(self) -> set[str]:
        """The judges' API keys (Gym processes must never see them)."""
        return self.endpoints.secrets()

    def check(
        self,
        config_paths: Sequence[Path],
        gym_root: Path,
        *,
        policy_may_judge: bool = True,
        hint: str = JUDGE_FLAGS_HINT,
    ) -> tuple[str, ...]:
        """Refuse, before anything starts, an environment whose judge was not given (a ``policy_model``
        judge defaults to the policy when ``policy_may_judge``) or that calls a judge URL itself. Returns why
        the environment may need an external service."""
        judges, external = classify_config(merged_configs(list(config_paths)), gym_root)
        direct = [j for j in judges if j.startswith("${")]
        if direct:
            raise ConfigurationError(
                f"Gym environment {self.env_name} calls its judge at {', '.join(direct)} itself (not through "
                "a Gym model server), so its calls cannot be routed; it is not supported."
            )
        if not policy_may_judge and POLICY_MODEL in judges and self.endpoints.for_name(POLICY_MODEL) is None:
            raise ConfigurationError(
                f"NeMo Gym environment {self.env_name!r} is judged by the policy model; under verifiers its "
                "judge calls would be recorded as turns of the rollout. Name the judge (it may be the "
                f"policy's own server): {hint}"
            )
        missing = [j for j in dict.fromkeys(judges) if j != POLICY_MODEL and self.endpoints.for_name(j) is None]
        if missing:
            raise ConfigurationError(
                f"Gym environment {self.env_name} scores with a judge model ({', '.join(missing)}) and no "
                f"judge endpoint was given. {hint}"
            )
        return tuple(external)

    def open(
        self, proxy: RoutingProxy, config_paths: Sequence[Path]
    ) -> tuple[tuple[Path, ...], tuple[tuple[str, str], ...]]:
        """Open a port on ``proxy`` for each judge name and rewrite the configs to call them:
        ``(configs to launch, (placeholder instance, URL) pairs)``."""
        plan = plan_judges(config_paths, cache_dir() / "judge-configs")
        placeholders = []
        for target in plan.targets:
            endpoint = self.endpoints.for_name(target)
            if endpoint is None:  # a policy_model judge with no judge given: it follows the policy
                route = proxy.open_judge_route(NO_POLICY_YET, upstream=NO_POLICY_YET_UPSTREAM)
                self._policy_route = route
            else:
                route = proxy.open_judge_route(endpoint)
            self._routes[target] = route
            placeholders.append((plan.placeholders[target], route.url))
        if plan.targets:
            logger.info(
                "Gym environment %s: judge calls go to %s",
                self.env_name,
                ", ".join(f"{t} → {self.label(t)}" for t in plan.targets),
            )
        return plan.config_paths, tuple(placeholders)

    def follow_policy(self, endpoint: Endpoint, upstream: Upstream | None = None) -> None:
        """Point a ``policy_model`` judge that was given no endpoint at this rollout's policy."""
        route = self._policy_route
        if route is not None and route.endpoint is not endpoint:
            route.retarget(endpoint, upstream)

    def label(self, name: str) -> str:
        """Where the judge ``name``'s calls go, in words (for summaries)."""
        endpoint = self.endpoints.for_name(name)
        if endpoint is not None:
            return endpoint.label
        return "the policy endpoint (no judge given)" if name == POLICY_MODEL else "nowhere (no judge given)"

    @property
    def names(self) -> tuple[str, ...]:
        """The judge names of the running stack's environment (empty before start or without judges)."""
        return tuple(self._routes)

    def take_calls(self) -> dict[str, list[PolicyCall]]:
        """Judge calls recorded since the last call of this method, by judge name (taken, not copied)."""
        return {name: route.take_calls() for name, route in self._routes.items()}

    def close(self) -> None:
        """Close every judge route (and so its port). Idempotent."""
        routes, self._routes, self._policy_route = self._routes, {}, None
        for route in routes.values():
            route.close()


def tally_judge_calls(tally: dict[str, dict[str, Any]], calls: Mapping[str, list[PolicyCall]], label: Any) -> None:
    """Add ``calls`` (by judge name) to ``tally``: where they went (``label(name)``), how many, how many
    failed, and their tokens."""
    for name, judged in calls.items():
        entry = tally.setdefault(
            name, {"target": label(name), "calls": 0, "failed": 0, "input_tokens": 0, "output_tokens": 0}
        )
        entry["calls"] += len(judged)
        entry["failed"] += sum(1 for c in judged if c.error is not None or c.status >= 400)
        usage = sum_usage([c.usage for c in judged])
        entry["input_tokens"] += usage["input_tokens"]
        entry["output_tokens"] += usage["output_tokens"]
