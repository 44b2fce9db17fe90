"""The Gym server stack: configured by ``StackConfig`` (plain data), run by ``GymStack`` under a supervisor.

config (what to run) → plan (pure: servers, argv, environment) → launch (one generation of processes, started
and waited for) → supervisor (start/stop a supervised launcher, or hold one a warm parent forked) → stack
(lifecycle) ← monitor (death from process exit) → deaths (who is told); registry (one refcounted object per key:
stacks, leases on Ray heads and warm parents); leases (machine-wide helpers held by leases); ray_head (the
machine's shared Ray head); warm_parent (the machine's warm parents a stack's processes are forked from) and
launchers (the launcher venv a warm stack links as its servers' venvs); requirements; logs; procs (Linux helpers).
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
