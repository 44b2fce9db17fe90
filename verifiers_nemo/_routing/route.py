"""``Route``: one rollout's way to its endpoint through the routing proxy, and the calls it recorded."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._endpoint import Endpoint
from .._exceptions import UpstreamError, UpstreamTimeout
from .._protocol import dumps, responses_usage, sum_usage
from .._upstreams import Upstream, UpstreamReply
from .route_key import drop_route_metadata
from .trace import PolicyCall

if TYPE_CHECKING:
    from .._replicas import Lease
    from .proxy import RoutingProxy

logger = logging.getLogger(__name__)

_CONVERSATION_FIELDS = frozenset({"input", "messages"})


def _flatten_sampling_args(args: Mapping[str, Any] | None) -> dict[str, Any]:
    """Sampling args as body fields; an OpenAI-SDK-style nested ``extra_body`` is spread in."""
    flat = dict(args or {})
    extra = flat.pop("extra_body", None)
    if isinstance(extra, Mapping):
        flat.update(extra)
    return flat


class Route:
    """One rollout's way to its endpoint through the proxy; records every policy call in order.

    Close it when the rollout ends (also on timeout): later calls with its key get HTTP 410 and
    calls in flight are cancelled. Safe to use from any thread or event loop.
    """

    def __init__(
        self,
        proxy: RoutingProxy,
        key: str,
        endpoint: Endpoint,
        upstream: Upstream,
        sampling_args: Mapping[str, Any] | None,
        on_call: Callable[[PolicyCall], None] | None,
        record_requests: bool,
        lease: Lease | None = None,
        fixed_upstream: bool = False,
    ) -> None:
        self._proxy = proxy
        self.record_requests = record_requests
        self.key = key
        self.endpoint = endpoint
        self.upstream = upstream
        self.on_call = on_call
        self.port: int | None = None
        """A judge route's own port on the proxy (see ``RoutingProxy.open_judge_route``), else None."""
        self.keep_calls: int | None = None
        """At most this many recorded calls are kept (the latest; a judge route lives as long as its stack, and
        its calls are taken by whoever counts them); None: all of them (a rollout's route)."""
        self.dropped_calls = 0
        """Calls recorded and dropped since, beyond ``keep_calls``."""
        self.lease = lease
        """The rollout's hold on one of several replicas (``Replicas``): a call whose replica does not answer
        moves to a live one, and so do the later calls. None: one endpoint."""
        self.fixed_upstream = fixed_upstream
        """``upstream`` was given (it stays when the route moves to another replica)."""
        self.failed_over: list[str] = []
        """The replicas this route's calls left because they did not answer (labels, in order)."""
        self._sampling_args = sampling_args
        self._defaults = {
            **_flatten_sampling_args(endpoint.sampling_args),
            **_flatten_sampling_args(sampling_args),
        }
        self._lock = threading.Lock()
        self._calls: list[PolicyCall] = []
        self._error: UpstreamError | None = None
        self._closed = False
        self._started = 0
        self._inflight: dict[asyncio.Task[Any], CallInFlight] = {}
        self._waiters: list[tuple[int, asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"Route({self.key[:10]}…, {self.endpoint.label}, {len(self._calls)} calls, {state})"

    def __enter__(self) -> Route:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def calls(self) -> list[PolicyCall]:
        """The calls recorded so far, in the order they finished (a copy); ``index`` is the order
        they arrived, the same for a Gym agent, which calls its policy one call at a time."""
        with self._lock:
            return list(self._calls)

    @property
    def error(self) -> UpstreamError | None:
        """The first upstream failure of this route (after retries), if any."""
        return self._error

    @property
    def url(self) -> str:
        """A judge route's address, ``http://127.0.0.1:<port>`` (what its Gym placeholder names)."""
        if self.port is None:
            raise RuntimeError("only a judge route has an address of its own")
        return f"http://{self._proxy.host}:{self.port}"

    def retarget(self, endpoint: Endpoint, upstream: Upstream | None = None) -> None:
        """Send later calls to ``endpoint`` (through ``upstream``, else the proxy's for its api); for a
        judge route that follows the policy's endpoint."""
        chosen = upstream if upstream is not None else self._proxy.upstream_for(endpoint)
        defaults = {**_flatten_sampling_args(endpoint.sampling_args), **_flatten_sampling_args(self._sampling_args)}
        with self._lock:
            self.endpoint, self.upstream, self._defaults = endpoint, chosen, defaults

    def take_calls(self) -> list[PolicyCall]:
        """The calls recorded so far, removed from the route (a long-lived judge route's are taken per run)."""
        with self._lock:
            calls, self._calls = self._calls, []
            return calls

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def in_flight(self) -> int:
        """Policy calls currently being answered."""
        return len(self._inflight)

    def waiting_since(self) -> float | None:
        """``perf_counter()`` time of the oldest call still waiting for its reply (None: none is)."""
        with self._lock:
            return min((pending.t0 for pending in self._inflight.values()), default=None)

    @property
    def usage(self) -> dict[str, int]:
        """Token usage summed over the recorded calls."""
        return sum_usage(call.usage for call in self.calls)

    def close(self) -> None:
        """Revoke the key (idempotent); calls in flight are cancelled and answered 410, and recorded as
        calls that got no reply (what was sent, how long it waited), so a timed-out rollout keeps them."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            tasks = list(self._inflight)
            now = time.perf_counter()
            for pending in self._inflight.values():
                self._calls.append(pending.unanswered(now))
            self._calls.sort(key=lambda call: call.index)
            waiters, self._waiters = self._waiters, []
        self._proxy.forget(self)
        loop = self._proxy.loop
        if tasks and loop is not None and not loop.is_closed():
            for task in tasks:
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(task.cancel)
        for _, waiter_loop, future in waiters:
            _wake(waiter_loop, future)

    async def wait_for_calls(self, n: int = 1, timeout: float | None = None) -> list[PolicyCall]:
        """Wait (on any event loop) until ``n`` calls are recorded or the route closes."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        entry = (n, loop, future)
        with self._lock:
            if len(self._calls) >= n or self._closed:
                return list(self._calls)
            self._waiters.append(entry)
        try:
            await asyncio.wait_for(future, timeout)
        finally:
            with self._lock, contextlib.suppress(ValueError):
                self._waiters.remove(entry)
        return self.calls

    # -- used by the proxy, on its loop ------------------------------------------------------

    def body_for_upstream(self, body: dict[str, Any]) -> dict[str, Any]:
        drop_route_metadata(body)
        body.pop("stream", None)
        forwarded = {**self._defaults, **body, **self.endpoint.extra_body}
        forwarded["model"] = self.endpoint.model
        return forwarded

    def begin(self, task: asyncio.Task[Any], body: dict[str, Any] | None = None) -> CallInFlight | None:
        """Register a call in flight (``body``: what is being sent); None when the route is closed."""
        with self._lock:
            if self._closed:
                return None
            call = CallInFlight(self, self._started, body or {}, time.time(), time.perf_counter())
            self._started += 1
            self._inflight[task] = call
            return call

    def end(self, task: asyncio.Task[Any]) -> None:
        with self._lock:
            self._inflight.pop(task, None)

    def request_json(self, request: dict[str, Any], encoded: bytes | None) -> bytes:
        if not self.record_requests:
            return dumps({k: v for k, v in request.items() if k not in _CONVERSATION_FIELDS})
        return encoded if encoded is not None else dumps(request)

    def record(self, call: PolicyCall) -> None:
        with self._lock:
            if self._closed and any(c.index == call.index for c in self._calls):
                return  # recorded as unanswered when the route closed, just before this reply came
            self._calls.append(call)
            if self.keep_calls is not None and len(self._calls) > self.keep_calls:
                del self._calls[0]
                self.dropped_calls += 1
            if call.error is not None and self._error is None:
                self._error = call.error
            count = len(self._calls)
            ready = [w for w in self._waiters if w[0] <= count]
            if ready:
                self._waiters = [w for w in self._waiters if w[0] > count]
        for _, waiter_loop, future in ready:
            _wake(waiter_loop, future)
        if self.on_call is not None:
            try:
                self.on_call(call)
            except Exception:
                logger.exception("on_call callback of route %s failed", self.endpoint.label)


@dataclass(frozen=True, slots=True)
class CallInFlight:
    """A policy call being answered: its route, index, what was sent and when; it builds the call's record."""

    route: Route
    index: int
    body: dict[str, Any]
    started_at: float
    t0: float

    def answered(self, reply: UpstreamReply, status: int, response_json: bytes) -> PolicyCall:
        """The record of a reply (``status``: what the caller gets; a body only below 400)."""
        return self._record(
            reply.request,
            reply.request_json,
            status,
            reply.attempts,
            response_json=response_json if status < 400 else None,
            upstream_status=reply.status,
            usage=responses_usage(reply.response.get("usage")),
            context_overflow=reply.context_overflow,
            **reply.token_fields(),
        )

    def failed(self, error: UpstreamError, status: int, attempts: int) -> PolicyCall:
        """The record of a call that failed with ``error`` (what it sent, if it says, else the body)."""
        sent = error.request if error.request is not None else self.body
        return self._record(sent, None, status, attempts, upstream_status=error.upstream_status, error=error)

    def unanswered(self, now: float) -> PolicyCall:
        """The record of this call when its route closes before the reply (the rollout ended or timed out)."""
        waited = now - self.t0
        error = UpstreamTimeout(
            f"no reply: the rollout ended while this call had waited {waited:.1f} s on the model", request=self.body
        )
        return self._record(self.body, None, 410, 1, now=now, error=error)

    def _record(
        self,
        request: dict[str, Any],
        encoded: bytes | None,
        status: int,
        attempts: int,
        now: float | None = None,
        **outcome: Any,
    ) -> PolicyCall:
        latency = (time.perf_counter() if now is None else now) - self.t0
        request_json = self.route.request_json(request, encoded)
        return PolicyCall(self.index, status, latency, attempts, self.started_at, request_json, **outcome)


def _wake(loop: asyncio.AbstractEventLoop, future: asyncio.Future[None]) -> None:
    def resolve() -> None:
        if not future.done():
            future.set_result(None)

    with contextlib.suppress(RuntimeError):  # that loop is closed: nobody is waiting any more
        loop.call_soon_threadsafe(resolve)
