"""The routing proxy Gym's ``policy_model`` points at: routes by key, configured by ``ProxyConfig``,
each policy call recorded as a ``PolicyCall``."""

from .config import ProxyConfig
from .proxy import ROUTE_METADATA_KEY, STATUS_UPSTREAM_FAILED, Route, RoutingProxy, get_proxy
from .trace import ContiguityCheck, PolicyCall, check_contiguity

__all__ = [
    "ROUTE_METADATA_KEY",
    "STATUS_UPSTREAM_FAILED",
    "ContiguityCheck",
    "PolicyCall",
    "ProxyConfig",
    "Route",
    "RoutingProxy",
    "check_contiguity",
    "get_proxy",
]
