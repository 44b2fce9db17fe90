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
import atexit
import contextlib
import dataclasses
import ipaddress
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
from aiohttp import web

from .._endpoint import Endpoint
from .._exceptions import ConfigurationError, UpstreamConversionError, UpstreamError, UpstreamInternalError
from .._protocol import dumps, loads
from .._upstreams import ChatCompletionsUpstream, ResponsesUpstream, Upstream
from .._upstreams.http import post_chat
from .config import ROUTE_METADATA_KEY, ProxyConfig
from .trace import PolicyCall

logger = logging.getLogger(__name__)

"""Key in ``responses_create_params.metadata`` that carries a route key (stripped before upstream)."""

STATUS_UPSTREAM_FAILED = 424
"""Status for a call whose upstream failed for good (not in nemo-gym's retry list)."""

_KEY_PREFIX = "vnr-"
_CONVERSATION_FIELDS = frozenset({"input", "messages"})
_JSON = "application/json"


def _json_response(status: int, payload: Any) -> web.Response:
    return web.Response(status=status, body=dumps(payload), content_type=_JSON)


def _error_response(status: int, error_type: str, message: str, **extra: Any) -> web.Response:
    return _json_response(status, {"error": {"type": error_type, "message": message, "code": status, **extra}})


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
    ) -> None:
        self._proxy = proxy
        self.record_requests = record_requests
        self.key = key
        self.endpoint = endpoint
        self.upstream = upstream
        self.on_call = on_call
        self.port: int | None = None
        """A judge route's own port on the proxy (see ``RoutingProxy.open_judge_route``), else None."""
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
        self._inflight: set[asyncio.Task[Any]] = set()
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
        chosen = upstream if upstream is not None else self._proxy._upstreams.get(endpoint.api)
        if chosen is None:
            raise ConfigurationError(f"No upstream for endpoint api {endpoint.api!r}.")
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

    @property
    def usage(self) -> dict[str, int]:
        """Token usage summed over the recorded calls."""
        totals = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}
        for call in self.calls:
            if call.usage:
                for name in totals:
                    totals[name] += call.usage.get(name) or 0
        return totals

    def close(self) -> None:
        """Revoke the key (idempotent); calls in flight are cancelled and answered 410."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            tasks = list(self._inflight)
            waiters, self._waiters = self._waiters, []
        self._proxy._forget(self)
        loop = self._proxy._loop
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

    # -- used by the proxy on its loop ------------------------------------------------------

    def _body_for_upstream(self, body: dict[str, Any]) -> dict[str, Any]:
        metadata = body.get("metadata")
        if isinstance(metadata, dict) and ROUTE_METADATA_KEY in metadata:
            rest = {k: v for k, v in metadata.items() if k != ROUTE_METADATA_KEY}
            if rest:
                body["metadata"] = rest
            else:
                del body["metadata"]
        body.pop("stream", None)
        forwarded = {**self._defaults, **body, **self.endpoint.extra_body}
        forwarded["model"] = self.endpoint.model
        return forwarded

    def _begin(self, task: asyncio.Task[Any]) -> int | None:
        with self._lock:
            if self._closed:
                return None
            self._inflight.add(task)
            index = self._started
            self._started += 1
            return index

    def _end(self, task: asyncio.Task[Any]) -> None:
        with self._lock:
            self._inflight.discard(task)

    def _request_json(self, request: dict[str, Any], encoded: bytes | None) -> bytes:
        if not self.record_requests:
            return dumps({k: v for k, v in request.items() if k not in _CONVERSATION_FIELDS})
        return encoded if encoded is not None else dumps(request)

    def _record(self, call: PolicyCall) -> None:
        with self._lock:
            self._calls.append(call)
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


def _wake(loop: asyncio.AbstractEventLoop, future: asyncio.Future[None]) -> None:
    def resolve() -> None:
        if not future.done():
            future.set_result(None)

    with contextlib.suppress(RuntimeError):  # that loop is closed: nobody is waiting any more
        loop.call_soon_threadsafe(resolve)


class RoutingProxy:
    """An aiohttp server on 127.0.0.1, on its own event loop in a daemon thread, that routes Gym's
    policy calls to each rollout's endpoint.

    One per process is the intended use (see ``get_proxy``). ``start()`` blocks until the port is
    bound and ``stop()`` is bounded; both are idempotent. ``open_route`` is thread-safe. What it is
    configured with (bounds, connector limits) is a ``ProxyConfig``.
    """

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
        if not _is_loopback(config.host):
            raise ConfigurationError(
                f"RoutingProxy binds loopback only (the route keys are its only protection); got {config.host!r}."
            )
        self.config = config
        self.host = config.host
        self.retry = config.retry
        overflow = config.context_overflow_as_incomplete
        self._upstreams: dict[str, Upstream] = {
            "responses": ResponsesUpstream(self.retry, context_overflow_as_incomplete=overflow),
            "chat": ChatCompletionsUpstream(self.retry, context_overflow_as_incomplete=overflow),
            **(upstreams or {}),
        }
        self._lock = threading.Lock()
        self._lifecycle = threading.Lock()
        self._routes: dict[str, Route] = {}
        self._tombstones: dict[str, None] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._port: int | None = None
        self._judge_sites: dict[int, tuple[web.TCPSite, Route]] = {}

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> RoutingProxy:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._port is not None

    @property
    def port(self) -> int:
        """The bound port (after ``start()``)."""
        if self._port is None:
            raise RuntimeError("RoutingProxy is not running; call start() first.")
        return self._port

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>`` (Gym's ``policy_model`` host and port)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI-style base URL, ``<url>/v1``."""
        return f"{self.url}/v1"

    def start(self, timeout: float = 30.0) -> RoutingProxy:
        """Start the loop thread and bind the port; returns once serving (idempotent)."""
        self._refuse_on_own_thread("start")
        with self._lifecycle:
            if self._port is not None:
                return self
            _raise_open_file_limit()
            loop = _new_event_loop(self.config.use_uvloop)
            thread = threading.Thread(target=_run_loop, args=(loop,), name="verifiers-nemo-proxy", daemon=True)
            thread.start()
            self._loop, self._thread = loop, thread
            try:
                self._port = asyncio.run_coroutine_threadsafe(self._startup(), loop).result(timeout)
            except BaseException:
                self._teardown_loop(timeout=5.0)
                raise
            logger.debug("routing proxy listening on %s", self.url)
            return self

    def stop(self, timeout: float = 5.0) -> None:
        """Close every route, the server and the upstream session, within ``timeout`` (idempotent)."""
        self._refuse_on_own_thread("stop")
        with self._lifecycle:
            if self._loop is None:
                return
            with self._lock:
                routes = list(self._routes.values())
            for route in routes:
                route.close()
            try:
                asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout)
            except Exception as exc:  # includes a timeout: go on and stop the loop anyway
                logger.warning("routing proxy did not shut down cleanly: %r", exc)
            self._teardown_loop(timeout=max(timeout, 1.0))

    def _teardown_loop(self, timeout: float) -> None:
        loop, thread = self._loop, self._thread
        self._loop = self._thread = None
        self._port = None
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                logger.warning("routing proxy thread did not exit within %.1f s", timeout)

    def _refuse_on_own_thread(self, what: str) -> None:
        if self._thread is not None and threading.current_thread() is self._thread:
            raise RuntimeError(f"RoutingProxy.{what}() cannot be called from the proxy's own event loop.")

    async def _startup(self) -> int:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(
                limit=self.config.connector_limit,
                limit_per_host=self.config.connector_limit_per_host,
                keepalive_timeout=self.config.keepalive_timeout,
            ),
            timeout=aiohttp.ClientTimeout(total=None),
            cookie_jar=aiohttp.DummyCookieJar(),
        )
        app = web.Application(client_max_size=self.config.max_request_bytes)
        app.router.add_post("/v1/responses", self._handle_responses)
        app.router.add_post("/responses", self._handle_responses)
        app.router.add_post("/v1/chat/completions", self._handle_judge_chat)
        app.router.add_get("/", self._handle_health)
        app.router.add_get("/health", self._handle_health)
        app.router.add_get("/v1/models", self._handle_models)
        app.router.add_route("*", "/{tail:.*}", self._handle_unknown_path)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=self.config.shutdown_grace)
        await runner.setup()
        self._runner = runner
        try:
            site = web.TCPSite(runner, self.host, self.config.port, backlog=self.config.backlog)
            await site.start()
        except BaseException:
            await self._shutdown()
            raise
        return int(runner.addresses[0][1])

    async def _shutdown(self) -> None:
        self._judge_sites.clear()  # their sites are the runner's: cleaned up with it
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- routes ------------------------------------------------------------------------------

    def open_route(
        self,
        endpoint: Endpoint,
        *,
        sampling_args: Mapping[str, Any] | None = None,
        upstream: Upstream | None = None,
        on_call: Callable[[PolicyCall], None] | None = None,
        record_requests: bool | None = None,
    ) -> Route:
        """Open a route to ``endpoint`` under a fresh 192-bit key; thread-safe.

        Sampling args merge as endpoint ``sampling_args`` < ``sampling_args`` here < the request's
        own values < endpoint ``extra_body``. ``upstream`` replaces the one picked by
        ``endpoint.api`` (e.g. a replay upstream). ``on_call`` runs on the proxy's thread after each
        call is recorded; keep it short. ``record_requests=False`` keeps the recorded requests
        without their conversation (``input``/``messages``), which otherwise grows quadratically
        with the number of turns; default: the proxy's ``record_requests``.
        """
        chosen = upstream if upstream is not None else self._upstreams.get(endpoint.api)
        if chosen is None:
            raise ConfigurationError(f"No upstream for endpoint api {endpoint.api!r}.")
        key = _KEY_PREFIX + secrets.token_urlsafe(24)
        record = self.config.record_requests if record_requests is None else record_requests
        route = Route(self, key, endpoint, chosen, sampling_args, on_call, record)
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
        """Open a route with a port of its own: every ``POST /v1/responses`` on that port goes to
        ``endpoint`` (a judge's calls carry no route key; the port is what tells them apart). Closing the
        route closes the port. Like every port of the proxy it is bound on loopback only."""
        self._refuse_on_own_thread("open_judge_route")
        route = self.open_route(endpoint, upstream=upstream, record_requests=record_requests)
        loop = self._loop
        if loop is None:
            raise RuntimeError("RoutingProxy is not running; call start() first.")
        try:
            route.port = asyncio.run_coroutine_threadsafe(self._add_judge_site(route), loop).result(timeout)
        except BaseException:
            route.close()
            raise
        return route

    async def _add_judge_site(self, route: Route) -> int:
        assert self._runner is not None
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, 0))
            site = web.SockSite(self._runner, sock, backlog=self.config.backlog)
            await site.start()
        except BaseException:
            sock.close()
            raise
        port = int(sock.getsockname()[1])
        self._judge_sites[port] = (site, route)
        return port

    async def _remove_judge_site(self, port: int) -> None:
        entry = self._judge_sites.pop(port, None)
        if entry is not None:
            await entry[0].stop()

    @property
    def open_routes(self) -> int:
        """How many routes are open."""
        return len(self._routes)

    def _forget(self, route: Route) -> None:
        loop = self._loop
        if route.port is not None and loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                asyncio.run_coroutine_threadsafe(self._remove_judge_site(route.port), loop)
        with self._lock:
            if self._routes.pop(route.key, None) is None:
                return
            self._tombstones[route.key] = None
            while len(self._tombstones) > self.config.tombstones:
                del self._tombstones[next(iter(self._tombstones))]

    def _lookup(self, body: dict[str, Any]) -> tuple[Route | None, web.Response | None]:
        key: Any = None
        metadata = body.get("metadata")
        if isinstance(metadata, dict):
            key = metadata.get(ROUTE_METADATA_KEY)
        if key is None:
            key = body.get("model")
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

    def _judge_route(self, request: web.Request) -> Route | None:
        """The judge route whose port ``request`` came in on, if any."""
        judge = self._judge_sites.get(_local_port(request)) if self._judge_sites else None
        return judge[1] if judge is not None else None

    async def _handle_responses(self, request: web.Request) -> web.Response:
        body = await _json_object(request)
        if isinstance(body, web.Response):
            return body
        route = self._judge_route(request)
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
        forwarded = route._body_for_upstream(body)
        return await self._forward(route, forwarded)

    async def _handle_judge_chat(self, request: web.Request) -> web.Response:
        """A judge that asks in Chat Completions (e.g. simpleqa's ``use_chat_completions_for_judge``): passed
        through to the judge endpoint's ``/chat/completions`` as it is (model and key replaced), recorded."""
        route = self._judge_route(request)
        if route is None:
            return await self._handle_unknown_path(request)
        body = await _json_object(request)
        if isinstance(body, web.Response):
            return body
        if body.get("stream"):
            return _error_response(400, "invalid_request", "Expected a non-streaming Chat Completions request.")
        endpoint = route.endpoint
        sent = {**route._defaults, **body, **endpoint.extra_body, "model": endpoint.model}
        started_at, t0 = time.time(), time.perf_counter()
        index = route._begin(asyncio.current_task())  # type: ignore[arg-type]
        if index is None:
            return _error_response(410, "route_closed", "This judge route is closed.")
        try:
            status, raw, attempts = await post_chat(self._session, endpoint, sent, self.retry)  # type: ignore[arg-type]
        except UpstreamError as exc:
            return self._fail(route, sent, exc, index, started_at, time.perf_counter() - t0)
        finally:
            route._end(asyncio.current_task())  # type: ignore[arg-type]
        usage = None
        with contextlib.suppress(ValueError, AttributeError, TypeError):
            chat_usage = loads(raw).get("usage") or {}
            usage = {
                "input_tokens": chat_usage.get("prompt_tokens") or 0,
                "output_tokens": chat_usage.get("completion_tokens") or 0,
                "total_tokens": chat_usage.get("total_tokens") or 0,
            }
        route._record(
            PolicyCall(
                index=index,
                request_json=route._request_json(sent, None),
                response_json=raw if status < 400 else None,
                status=status,
                latency_s=time.perf_counter() - t0,
                attempts=attempts,
                started_at=started_at,
                upstream_status=status,
                usage=usage,
            )
        )
        return web.Response(status=status, body=raw, content_type=_JSON)

    async def _forward(self, route: Route, body: dict[str, Any]) -> web.Response:
        session = self._session
        assert session is not None
        started_at = time.time()
        t0 = time.perf_counter()
        task = asyncio.ensure_future(route.upstream.create_response(session, route.endpoint, body))
        index = route._begin(task)
        if index is None:
            task.cancel()
            return _error_response(410, "route_closed", "The route closed before the call could start.")
        try:
            reply = await task
        except asyncio.CancelledError:
            if not task.cancelled() or not route.closed:
                raise  # the handler itself was cancelled (shutdown)
            return _error_response(410, "route_closed", "The route closed while the call was in flight.")
        except Exception as exc:
            return self._fail(route, body, exc, index, started_at, time.perf_counter() - t0)
        finally:
            route._end(task)
        response_json = dumps(reply.response)
        route._record(
            PolicyCall(
                index=index,
                request_json=route._request_json(reply.request, reply.request_json),
                response_json=response_json,
                status=200,
                latency_s=time.perf_counter() - t0,
                attempts=reply.attempts,
                started_at=started_at,
                upstream_status=reply.status,
                usage=reply.response.get("usage"),
                prompt_token_ids=reply.prompt_token_ids,
                completion_token_ids=reply.completion_token_ids,
                completion_logprobs=reply.completion_logprobs,
                context_overflow=reply.context_overflow,
                finish_reason=reply.finish_reason,
            )
        )
        return web.Response(body=response_json, content_type=_JSON)

    def _fail(
        self,
        route: Route,
        body: dict[str, Any],
        exc: Exception,
        index: int,
        started_at: float,
        latency: float,
    ) -> web.Response:
        if isinstance(exc, UpstreamError):
            error = exc
            # A bare UpstreamError (e.g. from a custom upstream) carries no facts: count one attempt.
            attempts = 1 if type(exc) is UpstreamError else exc.attempts
        else:
            logger.warning("upstream %s raised %r", route.endpoint.label, exc, exc_info=exc)
            error = UpstreamInternalError(f"{type(exc).__name__}: {exc}")
            attempts = 1
        kind, upstream_status, sent = error.kind, error.upstream_status, error.request
        status = 400 if isinstance(error, UpstreamConversionError) else STATUS_UPSTREAM_FAILED
        logger.info("policy call %d of %s failed (%s): %s", index, route.endpoint.label, kind, error.message)
        route._record(
            PolicyCall(
                index=index,
                request_json=route._request_json(sent if sent is not None else body, None),
                status=status,
                latency_s=latency,
                attempts=attempts,
                started_at=started_at,
                upstream_status=upstream_status,
                error=error,
            )
        )
        return _error_response(
            status, error.type, error.message, kind=kind, upstream_status=upstream_status, attempts=attempts
        )


async def _json_object(request: web.Request) -> dict[str, Any] | web.Response:
    """The request's JSON object, or the 400 answer saying why it is not one."""
    try:
        body = loads(await request.read())
    except ValueError:
        return _error_response(400, "invalid_request", "The request body is not valid JSON.")
    if not isinstance(body, dict):
        return _error_response(400, "invalid_request", "The request body must be a JSON object.")
    return body


def _local_port(request: web.Request) -> int | None:
    sockname = request.transport.get_extra_info("sockname") if request.transport is not None else None
    return int(sockname[1]) if sockname else None


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        try:
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.wait(pending, timeout=1.0))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()


def _new_event_loop(use_uvloop: bool) -> asyncio.AbstractEventLoop:
    """uvloop when wanted and installed (it roughly halves the proxy's CPU per call), else asyncio's."""
    if use_uvloop:
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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
                atexit.register(_stop_shared)
            _shared = RoutingProxy(**options)
            _shared_pid = os.getpid()
        proxy = _shared
    return proxy.start()


def _stop_shared() -> None:
    with _shared_lock:
        proxy = _shared
    if proxy is not None and _shared_pid == os.getpid():
        proxy.stop()
