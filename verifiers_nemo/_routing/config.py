"""``ProxyConfig``: what a ``RoutingProxy`` is configured with, as plain data (uvicorn's ``Config``)."""

from __future__ import annotations

from dataclasses import dataclass

from .._upstreams import RetryPolicy


@dataclass(frozen=True)
class ProxyConfig:
    """Bind address, per-call bounds, connector limits and server knobs of a ``RoutingProxy``.

    Upstream calls share one ``ClientSession`` whose ``TCPConnector`` allows ``connector_limit``
    connections in all (default 8192; 0 means unlimited) and ``connector_limit_per_host`` per host
    (default 0: only the total applies), so thousands of concurrent rollouts are not queued behind
    aiohttp's default of 100. Each policy call is bounded by ``upstream_timeout`` seconds over all
    attempts, and retried at most ``max_retries`` times with exponential backoff and jitter.
    """

    host: str = "127.0.0.1"
    port: int = 0
    upstream_timeout: float = 600.0
    connect_timeout: float = 10.0
    max_retries: int = 3
    backoff: float = 0.5
    backoff_max: float = 8.0
    connector_limit: int = 8192
    connector_limit_per_host: int = 0
    keepalive_timeout: float = 30.0
    max_request_bytes: int = 256 * 1024 * 1024
    tombstones: int = 16384
    backlog: int = 4096
    shutdown_grace: float = 1.0
    context_overflow_as_incomplete: bool = True
    record_requests: bool = True
    use_uvloop: bool = True

    @property
    def retry(self) -> RetryPolicy:
        """The bounds of one policy call."""
        return RetryPolicy(
            max_retries=self.max_retries,
            backoff=self.backoff,
            backoff_max=self.backoff_max,
            timeout=self.upstream_timeout,
            connect_timeout=self.connect_timeout,
        )
