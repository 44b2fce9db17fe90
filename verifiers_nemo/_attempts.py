"""``RolloutAttempts``: the tries of one rollout, each on a route of its own, and the result read from them.

A try whose Gym stack died before it was answered is made again after the restart (``GymAgentClient.run``); an
episode Gym failed without calling it terminal is tried again as Gym's collector tries it (``run_episode``). Each try
opens its own route on the proxy, so a retry never shares a trace with the dead try; every route is closed when the
rollout ends, so a late call from an orphaned agent is refused, never delivered. The result's trace, usage, policy
time and Gym outcome are the last try's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._exceptions import RolloutError
from ._protocol import sum_usage
from ._result import RolloutResult, map_gym_result
from ._routing import Route, row_with_route

ATTEMPT_INDEX_KEY = "_ng_attempt_index"
"""nemo-gym's row field for a retried episode's attempt (0 when absent)."""

if TYPE_CHECKING:
    from ._endpoint import Endpoint
    from ._replicas import Lease
    from ._routing import RoutingProxy
    from ._upstreams import Upstream


@dataclass(slots=True)
class Attempt:
    """One try at a rollout: its row on its own route."""

    body: dict[str, Any]
    route: Route

    def abandon(self) -> None:
        self.route.close()


class RolloutAttempts:
    """The tries of one rollout of ``row`` against ``endpoint``: ``new()`` makes one (what ``GymAgentClient.run``
    posts), ``close()`` ends them all, ``fill(result, gym_result)`` writes the last one's record into the result.
    With a ``lease`` (one of several replicas) each try starts where the rollout stands and its calls move on.

    ``gym_args`` ride in the row's ``responses_create_params`` (Gym passes them on), ``extra_args`` on the route
    (the proxy adds them to the upstream request)."""

    def __init__(
        self,
        proxy: RoutingProxy,
        endpoint: Endpoint,
        row: dict[str, Any],
        gym_args: dict[str, Any],
        extra_args: dict[str, Any],
        upstream: Upstream | None = None,
        lease: Lease | None = None,
    ) -> None:
        self._proxy = proxy
        self._lease = lease
        self._endpoint = endpoint
        self._row = row
        self._gym_args = gym_args
        self._extra_args = extra_args or None
        self._upstream = upstream
        self.routes: list[Route] = []
        self.episode_attempt = 0
        """Gym's attempt index of the episode (``_ng_attempt_index``): 0, then 1, 2 as a failed episode is tried
        again (an environment server keys its episodes by rollout and attempt)."""

    def new(self) -> Attempt:
        endpoint = self._lease.endpoint if self._lease is not None else self._endpoint  # where it stands now
        route = self._proxy.open_route(
            endpoint, sampling_args=self._extra_args, upstream=self._upstream, lease=self._lease
        )
        self.routes.append(route)
        row = self._row if not self.episode_attempt else {**self._row, ATTEMPT_INDEX_KEY: self.episode_attempt}
        return Attempt(row_with_route(row, route.key, self._gym_args), route)

    def error(self, raised: RolloutError) -> RolloutError:
        """What failed the rollout: the last route's own error (an upstream failure the agent reported only as
        its own), else what ``GymAgentClient.run`` raised."""
        last = self.routes[-1].error if self.routes else None
        return last if last is not None else raised

    def close(self) -> None:
        for route in self.routes:
            route.close()  # an orphaned agent's later calls are refused from now on

    def fill(self, result: RolloutResult, gym_result: Any) -> None:
        """The last try's calls, usage and policy time, and Gym's answer (when there was one), into ``result``."""
        if not self.routes:  # the stack could not be reached before any try
            return
        route = self.routes[-1]
        result.failed_over = [label for r in self.routes for label in r.failed_over]
        if result.failed_over:
            result.endpoint = route.endpoint.label
        result.trace = list(route.calls)
        result.timing["policy_s"] = sum(getattr(c, "latency_s", 0.0) or 0.0 for c in result.trace)
        result.usage = sum_usage([getattr(c, "usage", None) for c in result.trace])
        if gym_result is not None:
            map_gym_result(result, gym_result, route.key, self._endpoint.model)
