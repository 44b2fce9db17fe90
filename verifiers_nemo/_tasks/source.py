"""Which file a taskset reads and which agents its rows may name: a packaged environment's dataset, its
recorded rollouts, or any JSONL file; and the checks of the taskset's arguments."""

from __future__ import annotations

from pathlib import Path

from .._exceptions import ConfigurationError, TasksetError
from .._gym import EXAMPLE_ROLLOUTS, GymEnvironment, gym_root
from .benchmark_rows import benchmark_data


def check_arguments(
    nemo_env: str | None,
    dataset: str | None,
    jsonl_path: str | Path | None,
    recorded: bool,
    limit: int | None,
    rollouts_per_task: int,
    on_error: str,
) -> None:
    if dataset is not None and nemo_env is None:
        raise ConfigurationError("dataset= names a dataset of an environment: pass nemo_env= too.")
    if nemo_env is None and jsonl_path is None:
        raise ConfigurationError(
            "NeMoGymTaskset needs nemo_env= (a packaged environment) or jsonl_path= (a JSONL file)."
        )
    if dataset is not None and (jsonl_path is not None or recorded):
        raise ConfigurationError("Pass one source: dataset=, jsonl_path= or recorded=True, not several.")
    if on_error not in ("raise", "skip"):
        raise ConfigurationError(f"on_error must be 'raise' or 'skip', not {on_error!r}.")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ConfigurationError(f"limit must be a positive integer or None, not {limit!r}.")
    check_count(rollouts_per_task, "rollouts_per_task")


def check_count(value: object, name: str) -> None:
    """ConfigurationError naming ``name`` (the caller's own argument) unless ``value`` is a positive integer."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"{name} must be a positive integer, not {value!r}.")


def resolve_gym_root(root: str | Path | None, gym_python: str | Path | None, gym_version: str | None) -> Path | None:
    """The Gym root whose packaged data and schema a taskset reads: ``root`` as given, else the runtime that
    ``gym_python`` / ``gym_version`` name, found as a harness finds its own (``find_gym_runtime``: the interpreter
    named, ``VERIFIERS_NEMO_GYM_PYTHON``, this one when it has nemo-gym, a managed one of that series); ``None``
    when nothing is named (the catalogue then asks that same order with no arguments)."""
    if root is not None and (gym_python is not None or gym_version is not None):
        raise ConfigurationError(
            "Pass root= (a Gym root) or gym_python= / gym_version= (the Gym runtime whose packaged data to read), "
            "not both."
        )
    if root is not None:
        return Path(root).expanduser()
    if gym_python is not None or gym_version is not None:
        return gym_root(gym_python, gym_version)
    return None


def resolve_source(
    env: GymEnvironment | None, dataset: str | None, jsonl_path: str | Path | None, recorded: bool
) -> tuple[Path, str | None, bool]:
    """``(file, the agent its rows default to, for packaged data the agents of the config that owns it)``."""
    if jsonl_path is not None:
        # With an environment, rows without agent_ref run on its default agent (its only one, usually).
        fallback = env.default_agent.name if env is not None and env.default_agent is not None else None
        return Path(jsonl_path).expanduser(), fallback, None
    assert env is not None
    default_agent = env.default_agent
    if default_agent is None:
        raise TasksetError(
            f"{env.directory}: environment {env.name!r} defines no agent in its configs, so it has no "
            "tasks to run on its own. Fix: pick an environment with an agent (`verifiers-nemo envs`), "
            "or pass jsonl_path= and nemo_env= of one."
        )
    if env.benchmark is not None and dataset is None and not recorded:  # the benchmark's prepared rows
        return benchmark_data(env), default_agent.name, _agents_of(env, default_agent.config)
    if recorded:
        path = env.example_rollouts_path
        if not path.is_file():
            raise TasksetError(
                f"{path}: environment {env.name!r} ships no recorded rollouts. Fix: pick an environment "
                "whose catalogue entry has has_example_rollouts, or pass jsonl_path= with your recordings."
            )
        if not env.has_example_rollouts:
            why = next((p for p in env.problems if p.startswith(EXAMPLE_ROLLOUTS)), ": no recordings")
            raise TasksetError(
                f"{path}: environment {env.name!r} ships no usable recordings ({why.split(': ', 1)[-1]}). "
                "Fix: pick an environment whose catalogue entry has has_example_rollouts, or pass "
                "jsonl_path= with your own recordings."
            )
        return path, default_agent.name, _agents_of(env, default_agent.config)
    if dataset is not None:
        chosen = env.dataset(dataset)
    else:
        found = env.default_dataset
        if found is None and env.local and env.datasets:  # yours: name the file its config names, and the fix
            found = env.datasets[0]
        if found is None:
            raise TasksetError(
                f"{env.directory}: environment {env.name!r} ships no dataset file, so it has no tasks "
                "to load. Fix: pass jsonl_path= with your own rows."
            )
        chosen = found
    if not chosen.exists and env.local:
        raise TasksetError(
            f"{chosen.path}: dataset {chosen.name!r} of environment {env.name!r} ({env.directory}) does not exist "
            f"(its config {chosen.config.name} names {chosen.jsonl_fpath}). Fix: write the file there, correct the "
            "config's jsonl_fpath, or pass jsonl_path= to your rows."
        )
    if not chosen.exists:
        where = f" (Gym fetches it from {chosen.source})" if chosen.source else ""
        raise TasksetError(
            f"{chosen.path}: dataset {chosen.name!r} of environment {env.name!r} is not shipped with "
            f"nemo-gym{where}. Fix: download it to that path (nemo-gym's ng_prepare_data with "
            f"{chosen.config.name}), or pass jsonl_path= to a copy."
        )
    return chosen.path, chosen.agent, _agents_of(env, chosen.config)


def _agents_of(env: GymEnvironment, config: Path) -> frozenset[str]:
    return frozenset(a.name for a in env.agents if a.config == config)
