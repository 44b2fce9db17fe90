"""The routing proxy that stands in for NeMo Gym's ``policy_model``.

The Gym config's ``policy_model`` points at this proxy. Each rollout opens a ``Route`` (an endpoint
plus an unguessable key) and its row carries the key in ``responses_create_params.metadata``
(``ROUTE_METADATA_KEY``) and ``model``. Every ``POST /v1/responses`` from a Gym agent is looked up
by that key, rewritten for the route's endpoint (real model, sampling args, extra body; the key
stripped), sent with the route's API key, and recorded on the route. Unknown keys get 404 and
closed keys 410: a call is never delivered to another route.

Status codes returned to the agent are chosen so that nemo-gym, which retries 429/500/502/503/504/
520 (some forever), never loops on a failure that will not heal: upstream failures (after bounded
retries) answer 424, requests that cannot be converted or are malformed answer 400.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from .._endpoint import Endpoint, is_loopback
from .._exceptions import (
    ConfigurationError,
    UpstreamConnectionError,
    UpstreamConversionError,
    UpstreamError,
    UpstreamInternalError,
    UpstreamTimeout,
)
from .._protocol import dumps, loads
from .._serving import LoopThreadServer
from .._signals import at_exit
from .._upstreams import ChatCompletionsUpstream, ResponsesUpstream, Upstream, UpstreamReply
from .._upstreams.exact_tokens import ExactTokensUpstream
from .._upstreams.http import FAIL_FAST_UNREACHABLE
from .config import ProxyConfig
from .ports import RoutePorts
from .route import CallInFlight, Route
from .route_key import ROUTE_METADATA_KEY, new_route_key, route_key_of
from .trace import PolicyCall

if TYPE_CHECKING:
    from .._replicas import Lease

logger = logging.getLogger(__name__)

EXACT_TOKENS = "exact_tokens"
"""The key of the exact-token upstream among a proxy's upstreams (one per proxy: it remembers each rollout's
latest turn by the output items it handed out)."""
STATUS_UPSTREAM_FAILED = 424
"""Status for a call whose upstream failed for good (not in nemo-gym's retry list)."""
JUDGE_CALLS_KEPT = 10_000
"""Judge calls a judge route keeps until they are taken (the latest): a long run whose judge calls nobody takes
(a trainer, verifiers' env server) holds no more than these."""

_JSON = "application/json"


def _json_response(status: int, payload: Any) -> web.Response:
    return web.Response(status=status, body=dumps(payload), content_type=_JSON)


def _error_response(status: int, error_type: str, message: str, **extra: Any) -> web.Response:
    return _json_response(status, {"error": {"type": error_type, "message": message, "code": status, **extra}})


ROLLOUT_PREFIXES = ("/ng-rollout/{rollout_id}", "/ng-rollout/{rollout_id}/training-token-capture")
"""Path prefixes nemo-gym 0.7 puts before a model server's routes to say which rollout a call is of."""


class RoutingProxy(LoopThreadServer):
    """An aiohttp server on 127.0.0.1, on its own event loop in a daemon thread, that routes Gym's
    policy calls to each rollout's endpoint.

    One per process is the intended use (see ``get_proxy``). ``start()`` blocks until the port is
    bound and ``stop()`` is bounded; both are idempotent. ``open_route`` is thread-safe. What it is
    configured with (bounds, connector limits) is a ``ProxyConfig``.
    """

    thread_name = "verifiers-nemo-proxy"

    def __init__(
        self,
        config: ProxyConfig | None = None,
        *,
        upstreams: Mapping[str, Upstream] | None = None,
        **options: Any,
    ) -> None:
        """``config``, with any ``ProxyConfig`` field given as a keyword (``RoutingProxy(max_retries=1)``)
        overriding it; ``upstreams`` adds or replaces upstreams by ``Endpoint.api`` name."""
        config = dataclasses.replace(config or ProxyConfig(), **options)
        if not is_loopback(config.host):
            raise ConfigurationError(
                f"RoutingProxy binds loopback only (the route keys are its only protection); got {config.host!r}."
            )
        super().__init__(
            config.host,
            config.port,
            backlog=config.backlog,
            shutdown_grace=config.shutdown_grace,
            use_uvloop=config.use_uvloop,
        )
        self.config = config
        self.retry = config.retry
        overflow = config.context_overflow_as_incomplete
        self._upstreams: dict[str, Upstream] = {
            "responses": ResponsesUpstream(self.retry, context_overflow_as_incomplete=overflow),
            "chat": ChatCompletionsUpstream(self.retry, context_overflow_as_incomplete=overflow),
            EXACT_TOKENS: ExactTokensUpstream(self.retry, context_overflow_as_incomplete=overflow),
            **(upstreams or {}),
        }
        self._lock = threading.Lock()
        self._routes: dict[str, Route] = {}
        self._tombstones: dict[str, None] = {}
        self._session: aiohttp.ClientSession | None = None
        self._ports = RoutePorts(config.host, config.backlog)

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """The OpenAI-style base URL, ``<url>/v1``."""
        return f"{self.url}/v1"

    def start(self, timeout: float = 30.0) -> RoutingProxy:
        """Start the loop thread and bind the port; returns once serving (idempotent)."""
        _raise_open_file_limit()
        return super().start(timeout)

    def before_stop(self) -> None:
        with self._lock:
            routes = list(self._routes.values())
        for route in routes:
            route.close()

    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.max_request_bytes)
        # nemo-gym 0.7's rollout correlation: an agent run by an environment server calls the model at
        # <base>/ng-rollout/<rollout id>[/training-token-capture]/v1/...; Gym's model servers strip that prefix.
        for prefix in ("", *ROLLOUT_PREFIXES):
            app.router.add_post(f"{prefix}/v1/responses", self._handle_responses)
            app.router.add_post(f"{prefix}/v1/chat/completions", self._handle_judge_chat)
            app.router.add_get(f"{prefix}/v1/models", self._handle_models)
        app.router.add_post("/responses", self._handle_responses)
        app.router.add_get("/", self._handle_health)
        app.router.add_get("/health", self._handle_health)
        app.router.add_route("*", "/{tail:.*}", self._handle_unknown_path)
        return app

    async def on_startup(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(
                limit=self.config.connector_limit,
                limit_per_host=self.config.connector_limit_per_host,
                keepalive_timeout=self.config.keepalive_timeout,
            ),
            timeout=aiohttp.ClientTimeout(total=None),
            cookie_jar=aiohttp.DummyCookieJar(),
        )

    async def on_shutdown(self) -> None:
        self._ports.clear()  # their sites were the runner's: cleaned up with it
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- routes ------------------------------------------------------------------------------

    def upstream_for(self, endpoint: Endpoint) -> Upstream:
        """The proxy's upstream for ``endpoint.api`` (exact-token mode, whichever api, when asked for)."""
        chosen = self._upstreams.get(EXACT_TOKENS if endpoint.exact_tokens else endpoint.api)
        if chosen is None:
            raise ConfigurationError(f"No upstream for endpoint api {endpoint.api!r}.")
        return chosen

    def open_route(
        self,
        endpoint: Endpoint,
        *,
        sampling_args: Mapping[str, Any] | None = None,
        upstream: Upstream | None = None,
        on_call: Callable[[PolicyCall], None] | None = None,
        record_requests: bool | None = None,
        lease: Lease | None = None,
    ) -> Route:
        """Open a route to ``endpoint`` under a fresh 192-bit key; thread-safe.

        Sampling args merge as endpoint ``sampling_args`` < ``sampling_args`` here < the request's
        own values < endpoint ``extra_body``. ``upstream`` replaces the one picked by
        ``endpoint.api``. ``on_call`` runs on the proxy's thread after each
        call is recorded; keep it short. ``record_requests=False`` keeps the recorded requests
        without their conversation (``input``/``messages``), which otherwise grows quadratically
        with the number of turns; default: the proxy's ``record_requests``. ``lease``: the rollout's hold on one of
        several replicas (``Replicas.acquire``; ``endpoint`` is where it stands now): a call whose replica does
        not connect (or times out) is sent again to a live replica, and the route stays there.
        """
        chosen = upstream if upstream is not None else self.upstream_for(endpoint)
        key = new_route_key()
        record = self.config.record_requests if record_requests is None else record_requests
        route = Route(self, key, endpoint, chosen, sampling_args, on_call, record, lease, upstream is not None)
        with self._lock:
            self._routes[key] = route
        return route

    def open_judge_route(
        self,
        endpoint: Endpoint,
        *,
        upstream: Upstream | None = None,
        record_requests: bool | None = None,
        timeout: float = 30.0,
    ) -> Route:
        """Open a route with a port of its own: every ``POST /v1/responses`` (or ``/v1/chat/completions``)
        on that port goes to ``endpoint`` (a judge's calls carry no route key; the port is what tells them
        apart). Closing the route closes the port. Like every port of the proxy it is bound on loopback. It keeps
        the latest ``JUDGE_CALLS_KEPT`` calls until they are taken (``Route.take_calls``)."""
        self._refuse_on_own_thread("open_judge_route")
        route = self.open_route(endpoint, upstream=upstream, record_requests=record_requests)
        route.keep_calls = JUDGE_CALLS_KEPT
        try:
            route.port = self.call(self._ports.add(self.runner, route), timeout)
        except BaseException:
            route.close()
            raise
        return route

    @property
    def open_routes(self) -> int:
        """How many routes are open."""
        return len(self._routes)

    def model_waits(self) -> tuple[int, float]:
        """Policy calls now waiting on their model, and how long the oldest has waited (seconds)."""
        with self._lock:
            routes = list(self._routes.values())
        now = time.perf_counter()
        since = [t for t in (route.waiting_since() for route in routes) if t is not None]
        return sum(route.in_flight for route in routes), (now - min(since)) if since else 0.0

    def forget(self, route: Route) -> None:
        """Drop a closed route (its key is kept as a tombstone: later calls get 410, not 404)."""
        loop = self.loop
        if route.port is not None and loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                asyncio.run_coroutine_threadsafe(self._ports.remove(route.port), loop)
        with self._lock:
            if self._routes.pop(route.key, None) is None:
                return
            self._tombstones[route.key] = None
            while len(self._tombstones) > self.config.tombstones:
                del self._tombstones[next(iter(self._tombstones))]

    def _lookup(self, body: dict[str, Any]) -> tuple[Route | None, web.Response | None]:
        key = route_key_of(body)
        if not isinstance(key, str) or not key:
            return None, _error_response(
                404,
                "route_not_found",
                f"No route key in the request: set metadata[{ROUTE_METADATA_KEY!r}] or model to a key "
                "from RoutingProxy.open_route().",
            )
        route = self._routes.get(key)
        if route is not None and not route.closed:
            return route, None
        if route is not None or key in self._tombstones:
            return None, _error_response(
                410, "route_closed", f"Route {key[:10]}… is closed; its rollout has ended or timed out."
            )
        return None, _error_response(404, "route_not_found", f"No route with key {key[:10]}… is open.")

    # -- handlers ----------------------------------------------------------------------------

    async def _handle_health(self, request: web.Request) -> web.Response:
        return _json_response(200, {"status": "ok", "open_routes": len(self._routes)})

    async def _handle_models(self, request: web.Request) -> web.Response:
        model = {"id": "verifiers-nemo-route", "object": "model", "created": 0, "owned_by": "verifiers-nemo"}
        return _json_response(200, {"object": "list", "data": [model]})

    async def _handle_unknown_path(self, request: web.Request) -> web.Response:
        return _error_response(
            404,
            "not_found",
            f"{request.method} {request.path} is not served; the proxy answers POST /v1/responses, "
            "GET /, /health and /v1/models.",
        )

    async def _handle_responses(self, request: web.Request) -> web.Response:
        body = await _json_object(request)
        if isinstance(body, web.Response):
            return body
        route = self._ports.route_for(request)
        if route is not None:
            refusal = None
            if route.closed:
                route, refusal = None, _error_response(410, "route_closed", "This judge route is closed.")
        else:
            route, refusal = self._lookup(body)
        if route is None:
            assert refusal is not None
            logger.debug("refused a policy call: HTTP %d", refusal.status)
            return refusal
        if body.get("stream"):
            return _error_response(
                400,
                "streaming_unsupported",
                "stream=true is not supported by the verifiers-nemo proxy; Gym agents call the policy "
                "without streaming.",
            )
        resend = dumps(body) if route.lease is not None else None  # upstreams change the body they are given
        return await self._forward(route, route.body_for_upstream(body), resend=resend)

    async def _handle_judge_chat(self, request: web.Request) -> web.Response:
        """A judge that asks in Chat Completions (e.g. simpleqa's ``use_chat_completions_for_judge``): passed
        through to the judge endpoint's ``/chat/completions`` by the route's upstream (``pass_chat``)."""
        route = self._ports.route_for(request)
        if route is None:
            return await self._handle_unknown_path(request)
        body = await _json_object(request)
        if isinstance(body, web.Response):
            return body
        if body.get("stream"):
            return _error_response(400, "invalid_request", "Expected a non-streaming Chat Completions request.")
        return await self._forward(route, route.body_for_upstream(body), chat=True)

    async def _forward(
        self, route: Route, body: dict[str, Any], *, chat: bool = False, resend: bytes | None = None
    ) -> web.Response:
        """Answer ``body`` through the route's upstream and record the call (``chat``: a Chat Completions
        request handed on as it is, its answer too, whatever its status; ``resend``: the agent's request as it
        came, for another replica)."""
        session = self._session
        assert session is not None
        if chat:
            call = _pass_chat(route.upstream, session, route.endpoint, body)
        elif route.lease is not None and resend is not None:
            call = _on_replicas(route, route.lease, session, body, resend)
        else:
            call = route.upstream.create_response(session, route.endpoint, body)
        task = asyncio.ensure_future(call)
        in_flight = route.begin(task, body)
        if in_flight is None:
            task.cancel()
            return _error_response(410, "route_closed", "The route closed before the call could start.")
        try:
            reply = await task
        except asyncio.CancelledError:
            if not task.cancelled() or not route.closed:
                raise  # the handler itself was cancelled (shutdown)
            return _error_response(410, "route_closed", "The route closed while the call was in flight.")
        except Exception as exc:
            return self._fail(in_flight, exc)
        finally:
            route.end(task)
        status = reply.status if chat else 200
        response_json = reply.response_json if chat and reply.response_json is not None else dumps(reply.response)
        route.record(in_flight.answered(reply, status, response_json))
        return web.Response(status=status, body=response_json, content_type=_JSON)

    def _fail(self, in_flight: CallInFlight, exc: Exception) -> web.Response:
        route = in_flight.route
        if isinstance(exc, UpstreamError):
            error = exc
            # A bare UpstreamError (e.g. from a custom upstream) carries no facts: count one attempt.
            attempts = 1 if type(exc) is UpstreamError else exc.attempts
        else:
            logger.warning("upstream %s raised %r", route.endpoint.label, exc, exc_info=exc)
            error = UpstreamInternalError(f"{type(exc).__name__}: {exc}")
            attempts = 1
        status = 400 if isinstance(error, UpstreamConversionError) else STATUS_UPSTREAM_FAILED
        logger.info(
            "policy call %d of %s failed (%s): %s", in_flight.index, route.endpoint.label, error.kind, error.message
        )
        route.record(in_flight.failed(error, status, attempts))
        return _error_response(
            status, error.type, error.message, kind=error.kind, upstream_status=error.upstream_status, attempts=attempts
        )


async def _on_replicas(
    route: Route, lease: Lease, session: aiohttp.ClientSession, body: dict[str, Any], resend: bytes
) -> UpstreamReply:
    """The call on the rollout's replica; when that replica does not connect (or times out), it leaves the
    rotation and the call is sent again, as the agent sent it, to a live one (where the route stays). While
    another replica is live a failed connection is not retried on the same one; the last one left gets the
    usual retries. A call moves at most twice per replica (replicas that leave and rejoin while it moves)."""
    moves_left = 2 * len(lease.replicas.endpoints)
    while True:
        endpoint = route.endpoint
        alone = not lease.replicas.live_besides(endpoint)
        token = FAIL_FAST_UNREACHABLE.set(not alone)
        call = asyncio.ensure_future(route.upstream.create_response(session, endpoint, body))
        watch = lease.replicas.watch(endpoint, call)
        try:
            try:
                reply = await call
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if watch is None or watch.hung is None or (current is not None and current.cancelling()):
                    raise
                call.cancel()
                raise UpstreamTimeout(watch.hung) from None  # the replica hung: its call goes to a live one
            finally:
                lease.replicas.unwatch(watch)
        except (UpstreamConnectionError, UpstreamTimeout) as exc:
            moved = lease.fail_over(endpoint, f"{exc.kind}: {exc.message}")
            moves_left -= 1
            if moved is None or moves_left < 0:
                raise
            route.failed_over.append(endpoint.label)
            route.retarget(moved, route.upstream if route.fixed_upstream else None)
            logger.info("policy call of route %s… moved from %s to %s", route.key[:10], endpoint.label, moved.label)
            body = route.body_for_upstream(loads(resend))
            continue
        finally:
            FAIL_FAST_UNREACHABLE.reset(token)
        lease.answered(endpoint)
        return reply


async def _pass_chat(
    upstream: Upstream, session: aiohttp.ClientSession, endpoint: Endpoint, body: dict[str, Any]
) -> UpstreamReply:
    pass_chat = getattr(upstream, "pass_chat", None)
    if pass_chat is None:
        raise UpstreamError(f"{type(upstream).__name__} does not pass Chat Completions calls through (no pass_chat)")
    return await pass_chat(session, endpoint, body)


async def _json_object(request: web.Request) -> dict[str, Any] | web.Response:
    """The request's JSON object, or the 400 answer saying why it is not one."""
    try:
        body = loads(await request.read())
    except ValueError:
        return _error_response(400, "invalid_request", "The request body is not valid JSON.")
    if not isinstance(body, dict):
        return _error_response(400, "invalid_request", "The request body must be a JSON object.")
    return body


def _raise_open_file_limit() -> None:
    """Raise the soft open-file limit to the hard one: each concurrent rollout holds two sockets."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on POSIX
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 16)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            logger.debug("raised the open-file limit from %d to %d", soft, target)


_shared: RoutingProxy | None = None
_shared_pid: int | None = None
_shared_lock = threading.Lock()


def get_proxy(**options: Any) -> RoutingProxy:
    """The process-wide proxy, started on first use and stopped at interpreter exit.

    ``options`` (``RoutingProxy`` keyword arguments) apply only when the proxy is created. After a
    ``fork`` the child gets its own proxy (the parent's thread does not exist there).
    """
    global _shared, _shared_pid
    with _shared_lock:
        if _shared is None or _shared_pid != os.getpid():
            if _shared is None:
                at_exit(_stop_shared)
            _shared = RoutingProxy(**options)
            _shared_pid = os.getpid()
        proxy = _shared
    return proxy.start()


def _stop_shared() -> None:
    with _shared_lock:
        proxy = _shared
    if proxy is not None and _shared_pid == os.getpid():
        proxy.stop()
