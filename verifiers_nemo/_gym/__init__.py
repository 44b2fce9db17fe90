"""NeMo Gym as files and an interpreter, never imported here: ``config`` (the one reader of Gym config YAML),
``catalogue`` (the packaged environments), ``runtime`` (the interpreter that has nemo-gym, and its root)."""

from .catalogue import (
    EXAMPLE_ROLLOUTS,
    GymEnvironment,
    canonical_reference,
    classify_config,
    env_label,
    find_agent,
    get_environment,
    is_path_reference,
    list_environments,
    locate_environment,
)
from .config import (
    POLICY_MODEL,
    RESOURCES_SERVERS,
    RESPONSES_API_AGENTS,
    RESPONSES_API_MODELS,
    ServerInstance,
    merged_configs,
    requirements_beyond_nemo_gym,
    server_instances,
)
from .runtime import GymRuntime, cache_dir, find_gym_runtime, gym_root
from .tree import GYM_ROOT_VAR, GymTree, tree_of_configs

__all__ = [
    "EXAMPLE_ROLLOUTS",
    "GYM_ROOT_VAR",
    "GymTree",
    "canonical_reference",
    "env_label",
    "is_path_reference",
    "locate_environment",
    "tree_of_configs",
    "POLICY_MODEL",
    "RESOURCES_SERVERS",
    "RESPONSES_API_AGENTS",
    "RESPONSES_API_MODELS",
    "GymEnvironment",
    "GymRuntime",
    "ServerInstance",
    "cache_dir",
    "classify_config",
    "find_agent",
    "find_gym_runtime",
    "get_environment",
    "gym_root",
    "list_environments",
    "merged_configs",
    "requirements_beyond_nemo_gym",
    "server_instances",
]
