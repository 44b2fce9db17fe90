"""The catalogue of NeMo Gym environments packaged with nemo-gym.

Everything here is read from files under the Gym root (the directory holding ``nemo_gym/``,
``resources_servers/``, ``responses_api_agents/``...): config YAML, requirement files, the servers'
source text. ``nemo_gym`` itself is never imported, so the catalogue works from an interpreter
that does not have nemo-gym (the Gym runtime may be another interpreter).

An environment is a directory ``resources_servers/<name>/`` with ``configs/*.yaml``. Several
configs may exist; the *default config* is ``configs/<name>.yaml`` when present, else the first
config (by file name) that defines an agent, else the first config. The environment-level flags
(``needs_judge``, ``needs_external``, ``requirements``...) describe the default config; each
``GymConfig`` carries its own. How judge and external needs are decided lives in one function,
``classify_config``.

Modules: ``entries`` (the data), ``needs`` (``classify_config``), ``reading`` (folders and YAML to entries),
``lookup`` (names to entries, caches).
"""

from .entries import EXAMPLE_ROLLOUTS, GymAgent, GymConfig, GymDataset, GymEnvironment, GymServer
from .lookup import (
    canonical_reference,
    env_label,
    find_agent,
    get_environment,
    is_path_reference,
    list_environments,
    locate_environment,
)
from .needs import classify_config

__all__ = [
    "EXAMPLE_ROLLOUTS",
    "GymAgent",
    "GymConfig",
    "GymDataset",
    "GymEnvironment",
    "GymServer",
    "canonical_reference",
    "classify_config",
    "env_label",
    "find_agent",
    "get_environment",
    "is_path_reference",
    "list_environments",
    "locate_environment",
]
