"""Judge routing, in one place: the judge names a Gym config's resources servers call (``config``), which
endpoint answers each (``endpoints``), and the router that refuses a missing judge, opens their proxy
ports, rewrites the configs to call them and hands back their recorded calls (``router``)."""

from .config import JudgePlan, JudgeRef, judge_names, judge_refs, plan_judges
from .endpoints import ANY_JUDGE, JudgeEndpoints, judge_endpoint

__all__ = [
    "ANY_JUDGE",
    "JudgeEndpoints",
    "JudgePlan",
    "JudgeRef",
    "judge_endpoint",
    "judge_names",
    "judge_refs",
    "plan_judges",
]
