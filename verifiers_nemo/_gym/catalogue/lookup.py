"""Names to environments: the packaged catalogue and yours (cached), paths, labels and references."""

from __future__ import annotations

import difflib
import functools
import logging
import os
import threading
from pathlib import Path
from typing import Any

from ..._exceptions import ConfigurationError, UnknownEnvironmentError
from ..config import RESOURCES_SERVERS
from ..runtime import gym_root
from ..tree import GymTree, gym_roots_from_env, tree_of_configs
from .entries import GymAgent, GymEnvironment
from .reading import environment_folders, folder_signature, read_environment

logger = logging.getLogger(__name__)


def list_environments(root: str | Path | None = None, *, local: bool = True) -> list[GymEnvironment]:
    """Every NeMo Gym environment: those of your trees (``VERIFIERS_NEMO_GYM_ROOT``, ``--gym-root``, the working
    directory when it holds ``resources_servers/``) first, then the packaged ones under ``root`` (default: the Gym
    runtime's) that none of yours shadows by name; each group sorted by name."""
    resolved = _resolve_root(root)
    packaged = _load_catalogue(resolved)
    if not local:
        return list(packaged)
    yours = _local_catalogue(resolved)
    shadowed = {e.name for e in yours}
    return [*yours, *(e for e in packaged if e.name not in shadowed)]


def get_environment(name: str, root: str | Path | None = None) -> GymEnvironment:
    """The environment ``name`` names: a path (an environment folder in Gym's ``resources_servers/<name>``
    layout, or one of its config YAMLs), else a name in your trees (``VERIFIERS_NEMO_GYM_ROOT``, the working
    directory's ``resources_servers/``), else a packaged name; an UnknownEnvironmentError lists the closest."""
    resolved = _resolve_root(root)
    if is_path_reference(name):
        directory, config = locate_environment(name)
        return _local_environment(resolved, directory, config, gym_roots_from_env())
    for environment in _local_catalogue(resolved):
        if environment.name == name:
            return environment
    environments = _load_catalogue(resolved)
    for environment in environments:
        if environment.name == name:
            return environment
    names = [e.name for e in environments]
    close = difflib.get_close_matches(name, names, n=5, cutoff=0.5)
    close += [n for n in names if name and name.lower() in n.lower() and n not in close][: 5 - len(close)]
    hint = f"Closest: {', '.join(close)}." if close else "No packaged name is close."
    raise UnknownEnvironmentError(
        f"Unknown NeMo Gym environment {name!r}. {hint} "
        f"`verifiers-nemo envs` lists all {len(names)} packaged in {resolved / RESOURCES_SERVERS}; an environment "
        "of your own is named by its folder's path (./resources_servers/NAME) or found by name under --gym-root DIR."
    )


def is_path_reference(name: str) -> bool:
    """Whether an environment name is a path (to a folder or a config YAML), not a packaged name."""
    return "/" in name or os.sep in name or name.startswith(("~", ".")) or name.endswith((".yaml", ".yml"))


def env_label(reference: str) -> str:
    """A short name for an environment reference: a packaged name as it is, a path by its folder's name (and the
    config's stem when it is not the folder's default), for folder names and progress lines."""
    if not is_path_reference(reference):
        return reference
    path = Path(reference.rstrip("/" + os.sep))
    if path.suffix in (".yaml", ".yml"):
        folder = path.parent.parent.name
        return folder if path.stem == folder else f"{folder}.{path.stem}"
    return path.name or reference


def canonical_reference(name: str) -> str:
    """How a run names an environment wherever it goes (a resume elsewhere, Ray workers, env servers): a path by
    its absolute form, a name found in your trees by its folder's absolute path, a packaged name as it is."""
    if is_path_reference(name):
        directory, config = locate_environment(name)
        return str(config or directory)
    for root in gym_roots_from_env():
        folder = root / RESOURCES_SERVERS / name
        if (folder / "configs").is_dir():
            return str(folder)
    return name


def locate_environment(reference: str | Path) -> tuple[Path, Path | None]:
    """``(environment folder, config YAML or None)`` of a path naming an environment of your own; a
    ConfigurationError naming the path and the fix when it is not one."""
    path = Path(reference).expanduser().resolve()
    if not path.exists():
        raise UnknownEnvironmentError(
            f"Environment path {reference!r} does not exist on this machine ({path}). Fix: name the folder of an "
            f"environment (Gym's layout: {RESOURCES_SERVERS}/NAME with configs/NAME.yaml and app.py) or one of its "
            "config YAMLs; on a cluster, the folder must be at this path on every node."
        )
    if path.is_file():
        if path.suffix not in (".yaml", ".yml") or path.parent.name != "configs":
            raise ConfigurationError(
                f"{path} is not an environment config. Fix: name the environment's folder, or a YAML under its "
                "configs/."
            )
        return path.parent.parent, path
    if (path / "configs").is_dir():
        return path, None
    if (path / RESOURCES_SERVERS).is_dir():
        raise ConfigurationError(
            f"{path} holds a tree of environments ({RESOURCES_SERVERS}/), not one. Fix: name one of them "
            f"({path / RESOURCES_SERVERS}/NAME), or pass --gym-root {path} (VERIFIERS_NEMO_GYM_ROOT) and its name."
        )
    raise ConfigurationError(
        f"{path} is not an environment folder: it has no configs/ folder. Fix: lay it out as Gym's guide does "
        f"({RESOURCES_SERVERS}/NAME/ with app.py, configs/NAME.yaml, data/example.jsonl, requirements.txt)."
    )


def find_agent(agent_name: str, root: str | Path | None = None) -> tuple[GymEnvironment, GymAgent]:
    """The environment and agent instance for an agent name (as rows' ``agent_ref.name`` give it)."""
    matches = [(e, a) for e in list_environments(root) for a in e.agents if a.name == agent_name]
    if not matches:
        raise ConfigurationError(
            f"No packaged NeMo Gym environment defines an agent called {agent_name!r}. "
            "Pass nemo_env= to say which environment the rows belong to."
        )
    return matches[0]


# --------------------------------------------------------------------------------------------
# Loading


_cache_lock = threading.Lock()


def _resolve_root(root: str | Path | None) -> Path:
    resolved = (gym_root() if root is None else Path(root).expanduser()).resolve()
    if not (resolved / RESOURCES_SERVERS).is_dir():
        raise ConfigurationError(
            f"{resolved} is not a NeMo Gym root: it has no {RESOURCES_SERVERS}/ directory. "
            "Pass the directory that holds nemo_gym/ and resources_servers/ (the site-packages of the "
            "interpreter with nemo-gym installed)."
        )
    return resolved


def _load_catalogue(root: Path) -> tuple[GymEnvironment, ...]:
    with _cache_lock:
        return _load_catalogue_cached(root)


@functools.lru_cache(maxsize=8)
def _load_catalogue_cached(root: Path) -> tuple[GymEnvironment, ...]:
    environments = []
    tree = GymTree(root)
    for directory in environment_folders(root):
        environments.append(read_environment(tree, directory))
    logger.debug("catalogued %d NeMo Gym environments under %s", len(environments), root)
    return tuple(environments)


def _local_catalogue(install: Path) -> list[GymEnvironment]:
    """The environments of your trees, the first tree's first where names repeat."""
    roots = gym_roots_from_env()
    found: dict[str, GymEnvironment] = {}
    for root in roots:
        for directory in environment_folders(root):
            if directory.name not in found:
                found[directory.name] = _local_environment(install, directory, None, roots)
    return [found[name] for name in sorted(found)]


def _local_environment(install: Path, directory: Path, config: Path | None, roots: tuple[Path, ...]) -> GymEnvironment:
    """An environment of yours, read again whenever its configs, requirements or recordings change."""
    return _local_environment_cached(install, directory, config, roots, folder_signature(directory))


@functools.lru_cache(maxsize=64)
def _local_environment_cached(
    install: Path, directory: Path, config: Path | None, roots: tuple[Path, ...], _signature: tuple[Any, ...]
) -> GymEnvironment:
    tree = tree_of_configs([config or directory / "configs" / "_.yaml"], install, roots)
    if directory.parent.name != RESOURCES_SERVERS:  # a folder of its own: it stands for resources_servers/<name>
        tree = GymTree(install, tree.roots, ((f"{RESOURCES_SERVERS}/{directory.name}", directory),))
    return read_environment(tree, directory, origin=config or directory, config=config)
