"""Scaling out: several Gym stacks (several environments, or Ray actors on many nodes) fed from one queue."""

from .pool import NeMoGymPool
from .ray_cluster import LOCAL, RayCluster, RayPlacement
from .worker import StackWorker

__all__ = ["LOCAL", "NeMoGymPool", "RayCluster", "RayPlacement", "StackWorker"]
