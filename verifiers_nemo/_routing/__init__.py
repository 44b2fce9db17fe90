"""The routing proxy Gym's ``policy_model`` points at: ``proxy`` (``RoutingProxy``, configured by ``config``'s
``ProxyConfig``), ``route`` (one rollout's ``Route``), ``route_key`` (how a key rides in a Gym row and is
taken out again), ``ports`` (routes with a port of their own: judges), ``trace`` (``PolicyCall``, contiguity)."""

from .config import ProxyConfig
from .proxy import STATUS_UPSTREAM_FAILED, RoutingProxy, get_proxy
from .route import Route
from .route_key import ROUTE_METADATA_KEY, row_with_route, strip_route
from .trace import ContiguityCheck, PolicyCall, check_contiguity
from .training_sample import TrainingSample, TrainingSamples, training_samples

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
    "row_with_route",
    "strip_route",
    "training_samples",
    "TrainingSample",
    "TrainingSamples",
]
