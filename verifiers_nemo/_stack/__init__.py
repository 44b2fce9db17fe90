"""The Gym server stack: configured by ``StackConfig`` (plain data), run by ``GymStack`` under a supervisor.

config (what to run) → plan (pure: servers, argv, environment) → launch (one generation of processes, started
and waited for) → supervisor (start/stop a supervised launcher) → stack (lifecycle) ← monitor (death from
process exit) → deaths (who is told); registry (one refcounted object per key: stacks, leases on Ray heads);
ray_head (the machine's shared Ray head, held through leases); requirements; logs; procs (Linux helpers).
"""

from .config import StackConfig, StackInfo
from .launch import Launch
from .requirements import check_requirements
from .stack import GymStack, acquire_stack, release_stack, stop_all_stacks

__all__ = [
    "GymStack",
    "Launch",
    "StackConfig",
    "StackInfo",
    "acquire_stack",
    "check_requirements",
    "release_stack",
    "stop_all_stacks",
]
