"""``Replicas``: several endpoints serving one model (vLLM replicas), with health.

Each rollout starts on the least-loaded live replica. A replica whose call fails to connect (or times out) leaves
the rotation at once: that call, and the rollout's later calls, go to a live replica (a policy call is stateless:
the whole conversation, or its exact token IDs, is resent), so a rollout is lost only when no replica is left.
A replica that answers with an HTTP error (a 400 context overflow, a 500) answered: it stays. A replica that is
down is probed (``GET {base_url}/models``, with backoff) and rejoins when it answers anything at all; so does a
replica that answers a call. Every outage is kept (when, how long, why) for the progress line and the summary.

A replica that *hangs* (it accepts connections and never answers: a frozen process, an engine stuck in a
collective) is found while it hangs, not at the end of each call's budget: when its oldest call has waited
``hang_after`` seconds and it has answered nothing in that time, it is probed (``GET {base_url}/models`` within
``hang_probe_timeout`` seconds); no answer while another replica is live, and it leaves the rotation and its
unanswered calls are sent again to a live replica. A replica that is merely slow (long generations, a loaded
engine) answers the probe, so it stays, however long its calls take. An engine whose HTTP front still answers
while its engine hangs is found only by the call's ``--timeout``.

Safe to use from several threads: rollouts are placed on the run's event loop, calls fail over on the routing
proxy's, probes of replicas that are out run on a thread of their own that exists only while one is down, and the
hang watch on another that exists only while calls are in flight.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ._endpoint import Endpoint
from ._exceptions import ConfigurationError

logger = logging.getLogger(__name__)

Probe = Callable[[Endpoint], bool]
"""``probe(endpoint)`` → whether the replica answers (any HTTP answer counts; only no answer is "down")."""

PROBE_TIMEOUT_S = 5.0
PROBE_FIRST_S = 0.5
PROBE_MAX_S = 15.0
HANG_AFTER_S = 5.0
"""A replica whose oldest call has waited this long, with no answer from it meanwhile, is probed."""
HANG_PROBE_TIMEOUT_S = 2.0
"""A probed replica that gives no HTTP answer within this is hung (while another replica is live)."""
HANG_CHECK_S = 0.5


def http_probe(endpoint: Endpoint, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Whether ``GET {base_url}/models`` gets any HTTP answer (a 401 or 404 is an answer too)."""
    request = urllib.request.Request(f"{endpoint.base_url}/models", method="GET")
    if endpoint.api_key:
        request.add_header("Authorization", f"Bearer {endpoint.api_key}")
    for name, value in endpoint.extra_headers.items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            reply.read(1)
        return True
    except urllib.error.HTTPError:
        return True
    except (OSError, ValueError):  # refused, reset, unreachable, timed out
        return False


@dataclass(slots=True)
class Outage:
    """One time a replica was out of the rotation."""

    replica: str
    """The replica's label (``model@url`` or its name; never its key)."""
    started_at: float
    """Wall-clock time it left the rotation."""
    reason: str
    seconds: float | None = None
    """How long it was out (None: still out)."""
    _t0: float = field(default=0.0, repr=False)
    _closed_at: float | None = field(default=None, repr=False)

    def duration(self, now: float | None = None) -> float:
        """Seconds out so far (its whole length once it rejoined; until ``Replicas.close()`` when it never did)."""
        if self.seconds is not None:
            return self.seconds
        end = self._closed_at if self._closed_at is not None else time.monotonic() if now is None else now
        return end - self._t0

    def to_dict(self) -> dict[str, Any]:
        return {
            "replica": self.replica,
            "started_at": self.started_at,
            "seconds": round(self.duration(), 3),
            "rejoined": self.seconds is not None,
            "reason": self.reason,
        }


class CallWatch:
    """One policy call waiting on a replica, as the hang watch sees it (``Replicas.watch``)."""

    __slots__ = ("hung", "loop", "replica", "started", "task")

    def __init__(self, replica: _Replica, task: asyncio.Future[Any], loop: asyncio.AbstractEventLoop) -> None:
        self.replica = replica
        self.task = task
        self.loop = loop
        self.started = time.monotonic()
        self.hung: str | None = None
        """Why the watch cancelled the call (its replica hung), else None."""


class _Replica:
    __slots__ = (
        "calls",
        "endpoint",
        "in_flight",
        "last_answer",
        "last_used",
        "next_probe",
        "outage",
        "probe_wait",
        "rejoined_at",
    )

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.in_flight = 0
        self.last_used = 0
        self.outage: Outage | None = None
        self.next_probe = 0.0
        self.probe_wait = PROBE_FIRST_S
        self.rejoined_at = 0.0
        self.calls: set[CallWatch] = set()
        self.last_answer = time.monotonic()


class Replicas:
    """Several endpoints serving the same model (e.g. vLLM replicas) as one policy, with health.

    Pass it (or a plain list, which makes one per run) as ``endpoints=`` of ``NeMoGymHarness.run`` /
    ``NeMoGymPool.run``. ``probe`` says whether a replica that is out answers (default: ``GET
    {base_url}/models``, any HTTP answer); ``probe_first`` / ``probe_max`` bound the backoff between probes.
    ``hang_after`` / ``hang_probe_timeout`` find a replica that hangs (see the module docs; ``hang_after=None``:
    never). ``close()`` stops the probing (idempotent; also a context manager).
    """

    def __init__(
        self,
        endpoints: Iterable[Endpoint],
        *,
        probe: Probe | None = None,
        probe_first: float = PROBE_FIRST_S,
        probe_max: float = PROBE_MAX_S,
        hang_after: float | None = HANG_AFTER_S,
        hang_probe_timeout: float = HANG_PROBE_TIMEOUT_S,
    ) -> None:
        self._replicas = [_Replica(e) for e in endpoints]
        if not self._replicas:
            raise ConfigurationError("endpoints is an empty list; pass at least one Endpoint.")
        for replica in self._replicas:
            if not isinstance(replica.endpoint, Endpoint):
                raise ConfigurationError(f"Replicas takes Endpoint objects, not {type(replica.endpoint).__name__}.")
        self._probe = probe or http_probe
        self._hang_probe: Probe = probe or (lambda endpoint: http_probe(endpoint, timeout=hang_probe_timeout))
        self.hang_after = hang_after
        self._watcher: threading.Thread | None = None
        self._probe_first = probe_first
        self._probe_max = probe_max
        self._lock = threading.Lock()
        self._clock = 0
        self._outages: list[Outage] = []
        self._wake = threading.Event()
        self._prober: threading.Thread | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"Replicas({', '.join(self.labels)}; {len(self.down())} down)"

    @property
    def endpoints(self) -> list[Endpoint]:
        return [r.endpoint for r in self._replicas]

    @property
    def labels(self) -> list[str]:
        return [r.endpoint.label for r in self._replicas]

    # -- placing rollouts ----------------------------------------------------------------------

    def acquire(self, prefer: Endpoint | None = None) -> Lease:
        """A lease on the replica a rollout starts on: ``prefer`` when given (and one of these), else the live
        replica with the fewest rollouts in flight (ties: the one used least recently, so an idle set is used
        round-robin); when none is live, the least loaded of all (its calls then fail as they would alone)."""
        with self._lock:
            chosen = self._find(prefer) if prefer is not None else None
            if chosen is None:
                chosen = self._least_loaded(exclude=None)
            chosen.in_flight += 1
            self._clock += 1
            chosen.last_used = self._clock
            return Lease(self, chosen)

    def _find(self, endpoint: Endpoint) -> _Replica | None:
        for replica in self._replicas:
            if replica.endpoint == endpoint:
                return replica
        return None

    def _least_loaded(self, exclude: _Replica | None) -> _Replica:
        live = [r for r in self._replicas if r.outage is None and r is not exclude]
        pool = live or [r for r in self._replicas if r is not exclude] or self._replicas
        return min(pool, key=lambda r: (r.in_flight, r.last_used))

    def _move(self, lease: Lease, failed: Endpoint, reason: str) -> Endpoint | None:
        with self._lock:
            source = self._find(failed) or lease._replica
            self._mark_down(source, reason)
            live = [r for r in self._replicas if r.outage is None]
            if not live:
                return None
            target = min(live, key=lambda r: (r.in_flight, r.last_used))
            if lease._replica is not None:
                lease._replica.in_flight -= 1
            target.in_flight += 1
            self._clock += 1
            target.last_used = self._clock
            lease._replica = target
            return target.endpoint

    def in_flight(self) -> list[int]:
        """Rollouts in flight on each replica, in the order given."""
        with self._lock:
            return [r.in_flight for r in self._replicas]

    def live_besides(self, endpoint: Endpoint) -> bool:
        """Whether a replica other than ``endpoint`` is in the rotation (a call could move there)."""
        with self._lock:
            return any(r.outage is None and r.endpoint != endpoint for r in self._replicas)

    def _release(self, replica: _Replica) -> None:
        with self._lock:
            replica.in_flight -= 1

    # -- health --------------------------------------------------------------------------------

    def report_down(self, endpoint: Endpoint | str, reason: str, *, seen_at: float | None = None) -> None:
        """Take the replica (an endpoint, or its label) out of the rotation now and start probing it; nothing
        happens when it is out already, is none of these, or rejoined after ``seen_at`` (``time.time()`` when the
        failure was seen: old news)."""
        with self._lock:
            for replica in self._replicas:
                named = replica.endpoint == endpoint or replica.endpoint.label == endpoint
                if named and (seen_at is None or replica.rejoined_at <= seen_at):
                    self._mark_down(replica, reason)

    def report_up(self, endpoint: Endpoint) -> None:
        """The replica answered: back into the rotation (when it was out)."""
        with self._lock:
            replica = self._find(endpoint)
            if replica is not None:
                replica.last_answer = time.monotonic()
                if replica.outage is not None:
                    self._mark_up(replica)

    # -- the hang watch ------------------------------------------------------------------------

    def watch(self, endpoint: Endpoint, task: asyncio.Future[Any]) -> CallWatch | None:
        """Watch a call (``task``, on the running loop) waiting on ``endpoint``: when the replica hangs, the task is
        cancelled and the watch says why (``hung``), so the caller sends the call elsewhere. ``unwatch`` it when the
        call ends. None when there is nothing to watch (one replica, the watch off, ``endpoint`` none of these)."""
        if self.hang_after is None or len(self._replicas) < 2:
            return None
        with self._lock:
            replica = self._find(endpoint)
            if replica is None or self._closed:
                return None
            call = CallWatch(replica, task, asyncio.get_running_loop())
            if replica.outage is not None and any(o.outage is None for o in self._replicas if o is not replica):
                call.hung = f"{replica.endpoint.label} is out of the rotation ({replica.outage.reason})"
                call.loop.call_soon(task.cancel)  # a later call of a rollout still on it: sent elsewhere at once
                return call
            replica.calls.add(call)
            if self._watcher is None or not self._watcher.is_alive():
                self._watcher = threading.Thread(target=self._watch_loop, name="verifiers-nemo-hang-watch", daemon=True)
                self._watcher.start()
            return call

    def unwatch(self, call: CallWatch | None) -> None:
        """The watched call ended (idempotent)."""
        if call is not None:
            with self._lock:
                call.replica.calls.discard(call)

    def _watch_loop(self) -> None:
        assert self.hang_after is not None
        while True:
            with self._lock:
                if self._closed or not any(r.calls for r in self._replicas):
                    self._watcher = None
                    return
                now = time.monotonic()
                suspects = [
                    r
                    for r in self._replicas
                    if r.outage is None
                    and r.calls
                    and now - min(c.started for c in r.calls) >= self.hang_after
                    and now - r.last_answer >= self.hang_after
                    and any(o.outage is None for o in self._replicas if o is not r)
                ]
            for replica in suspects:
                if self._answers(self._hang_probe, replica.endpoint):
                    with self._lock:
                        replica.last_answer = time.monotonic()  # slow, not hung: look again after hang_after
                    continue
                self._hung(replica)
            time.sleep(HANG_CHECK_S)

    def _hung(self, replica: _Replica) -> None:
        with self._lock:
            if replica.outage is not None or not any(o.outage is None for o in self._replicas if o is not replica):
                return
            waited = time.monotonic() - min((c.started for c in replica.calls), default=time.monotonic())
            reason = (
                f"hung: {len(replica.calls)} call(s) unanswered for {waited:.1f} s and no answer to GET /models; "
                "its calls moved to a live replica"
            )
            self._mark_down(replica, reason)
            calls, replica.calls = list(replica.calls), set()
        for call in calls:
            call.hung = reason
            call.loop.call_soon_threadsafe(call.task.cancel)

    def _mark_down(self, replica: _Replica, reason: str) -> None:
        if replica.outage is not None or self._closed:
            return
        outage = Outage(replica.endpoint.label, time.time(), reason, _t0=time.monotonic())
        replica.outage = outage
        replica.probe_wait = self._probe_first
        replica.next_probe = time.monotonic() + replica.probe_wait
        self._outages.append(outage)
        live = sum(1 for r in self._replicas if r.outage is None)
        logger.warning(
            "replica %s is out of the rotation (%s); %d of %d live", outage.replica, reason, live, len(self._replicas)
        )
        if self._prober is None or not self._prober.is_alive():
            self._prober = threading.Thread(target=self._probe_loop, name="verifiers-nemo-replica-probe", daemon=True)
            self._prober.start()
        self._wake.set()

    def _mark_up(self, replica: _Replica) -> None:
        outage = replica.outage
        assert outage is not None
        outage.seconds = time.monotonic() - outage._t0
        replica.outage = None
        replica.last_answer = time.monotonic()
        replica.rejoined_at = time.time()
        logger.warning("replica %s answers again: back in the rotation after %.1f s", outage.replica, outage.seconds)

    def down(self) -> list[tuple[str, float]]:
        """The replicas out of the rotation now: (label, seconds out so far)."""
        now = time.monotonic()
        with self._lock:
            return [(r.endpoint.label, r.outage.duration(now)) for r in self._replicas if r.outage is not None]

    def outages(self) -> list[Outage]:
        """Every outage so far, in the order they began (the ongoing ones too)."""
        with self._lock:
            return list(self._outages)

    def _probe_loop(self) -> None:
        while True:
            with self._lock:
                if self._closed:
                    return
                now = time.monotonic()
                out = [r for r in self._replicas if r.outage is not None]
                if not out:
                    self._prober = None
                    return
                due = [r for r in out if r.next_probe <= now]
                wait = min(r.next_probe for r in out) - now
            if not due:
                self._wake.wait(max(0.01, wait))
                self._wake.clear()
                continue
            for replica in due:
                answered = self._answers(self._probe, replica.endpoint)
                with self._lock:
                    if replica.outage is None or self._closed:
                        continue
                    if answered:
                        self._mark_up(replica)
                    else:
                        replica.probe_wait = min(self._probe_max, replica.probe_wait * 2)
                        replica.next_probe = time.monotonic() + replica.probe_wait

    @staticmethod
    def _answers(probe: Probe, endpoint: Endpoint) -> bool:
        try:
            return bool(probe(endpoint))
        except Exception:  # a probe of the user's that raised: still out
            logger.debug("probe of %s raised", endpoint.label, exc_info=True)
            return False

    def close(self) -> None:
        """Stop probing (bounded; idempotent). Outages still open stay open in ``outages()``."""
        with self._lock:
            if not self._closed:
                now = time.monotonic()
                for replica in self._replicas:
                    if replica.outage is not None:
                        replica.outage._closed_at = now  # still out when the run ended: its length stops here
            self._closed = True
            prober, watcher = self._prober, self._watcher
        self._wake.set()
        for thread in (prober, watcher):
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout=PROBE_TIMEOUT_S + 1.0)

    def __enter__(self) -> Replicas:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Lease:
    """One rollout's hold on a replica: where its calls go now, moved by ``fail_over``, ended by ``release``."""

    def __init__(self, replicas: Replicas, replica: _Replica) -> None:
        self.replicas = replicas
        self._replica: _Replica | None = replica

    @property
    def endpoint(self) -> Endpoint:
        assert self._replica is not None, "released"
        return self._replica.endpoint

    def fail_over(self, failed: Endpoint, reason: str) -> Endpoint | None:
        """``failed`` did not answer: take it out of the rotation and move this rollout to the least-loaded live
        replica (returned); None when no replica is live."""
        if self._replica is None:
            return None
        return self.replicas._move(self, failed, reason)

    def answered(self, endpoint: Endpoint) -> None:
        """A call on ``endpoint`` was answered: it is alive."""
        self.replicas.report_up(endpoint)

    def release(self) -> None:
        """The rollout ended (idempotent)."""
        replica, self._replica = self._replica, None
        if replica is not None:
            self.replicas._release(replica)


class ReplicaViews:
    """One health view per list of replica endpoints a caller passes (keyed by their labels), so the same list given
    to many rollouts shares what was learnt about it; a ``Replicas`` is its own view."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._views: dict[tuple[str, ...], Replicas] = {}

    def view(self, replicas: Replicas | Iterable[Endpoint]) -> Replicas:
        if isinstance(replicas, Replicas):
            return replicas
        endpoints = list(replicas)
        key = tuple(e.label for e in endpoints)
        with self._lock:
            view = self._views.get(key)
            if view is None:
                view = self._views[key] = Replicas(endpoints)
            return view

    def close(self) -> None:
        """Stop the probes of the views made here (not of a ``Replicas`` passed in)."""
        with self._lock:
            views, self._views = list(self._views.values()), {}
        for view in views:
            view.close()
