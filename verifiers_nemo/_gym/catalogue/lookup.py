"""Names to environments: the packaged catalogue and yours (cached), paths, labels and references."""

from __future__ import annotations

import difflib
import functools
import logging
import os
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..._exceptions import ConfigurationError, UnknownEnvironmentError
from ..config import RESOURCES_SERVERS
from ..runtime import gym_root
from ..tree import GymTree, gym_roots_from_env, tree_of_configs
from .entries import GymAgent, GymEnvironment, close_hint
from .kinds import catalogue_tree_root, explicit_kind, listed_catalogue
from .reading import environment_folders, folder_signature, read_environment

logger = logging.getLogger(__name__)


def list_environments(root: str | Path | None = None, *, local: bool = True) -> list[GymEnvironment]:
    """Every NeMo Gym environment: on nemo-gym >= 0.7, Gym's environments and benchmarks first (yours and
    packaged, as Gym's catalogue lists them); then the resources servers of your trees (``VERIFIERS_NEMO_GYM_ROOT``,
    ``--gym-root``, the working directory when it holds ``resources_servers/``), then the packaged ones that none of
    yours shadows by name; each group sorted by name. A resources server whose name an environment or benchmark
    claims keeps it, and is named ``resources_servers/NAME`` (its ``ref``)."""
    resolved = _resolve_root(root)
    packaged = _load_catalogue(resolved)
    roots = gym_roots_from_env() if local else ()
    listed = listed_catalogue(resolved, roots)
    gyms = listed.all() if listed is not None else []
    if not local:
        gyms = [e for e in gyms if not e.local]
    claimed = {e.name for e in gyms}
    yours = _local_catalogue(resolved) if local else []
    shadowed = {e.name for e in yours}
    servers = [*yours, *(e for e in packaged if e.name not in shadowed)]
    return [*gyms, *(_qualified(e) if e.name in claimed else e for e in servers)]


def _qualified(env: GymEnvironment) -> GymEnvironment:
    """A resources server whose short name an environment or benchmark claims: named by its explicit form."""
    return replace(env, reference=f"{RESOURCES_SERVERS}/{env.name}") if env.origin is None else env


def get_environment(name: str, root: str | Path | None = None) -> GymEnvironment:
    """The environment ``name`` names: a path (a folder in Gym's ``resources_servers/<name>``,
    ``environments/<name>`` or ``benchmarks/<name>`` layout, or one of its config YAMLs); else, on nemo-gym >= 0.7,
    an environment or benchmark of Gym's catalogue (``environments/NAME``, ``benchmarks/NAME`` to say which); else a
    resources server, yours first (``VERIFIERS_NEMO_GYM_ROOT``, the working directory's ``resources_servers/``), then
    packaged (``resources_servers/NAME`` explicitly); an UnknownEnvironmentError lists the closest."""
    resolved = _resolve_root(root)
    roots = gym_roots_from_env()
    if is_path_reference(name):
        found = _listed_at_path(resolved, roots, Path(name).expanduser())
        if found is not None:
            return found
        directory, config = locate_environment(name)
        return _local_environment(resolved, directory, config, roots)
    kind, bare = explicit_kind(name)
    listed = listed_catalogue(resolved, roots)
    if listed is not None:
        found = listed.resolve(name)
        if found is not None:
            return found
    if kind in (None, "resources server"):
        server, _, config = bare.partition("/")
        for environment in (*_local_catalogue(resolved), *_load_catalogue(resolved)):
            if environment.name == server:
                chosen = _with_config(environment, config) if config else environment
                return _qualified(chosen) if kind else chosen
    names = [e.ref for e in list_environments(resolved)]
    close = difflib.get_close_matches(name, names, n=5, cutoff=0.5)
    close += [n for n in names if bare and bare.lower() in n.lower() and n not in close][: 5 - len(close)]
    hint = f"Closest: {', '.join(close)}." if close else "No packaged name is close."
    what = "environments, benchmarks and resources servers" if listed is not None else "environments"
    raise UnknownEnvironmentError(
        f"Unknown NeMo Gym environment {name!r}. {hint} `verifiers-nemo envs` lists all {len(names)} {what} of "
        f"the nemo-gym at {resolved}; an environment of your own is named by its folder's path "
        "(./resources_servers/NAME) or found by name under --gym-root DIR."
    )


def _with_config(env: GymEnvironment, config: str) -> GymEnvironment:
    """A resources server with one of its other configs (``resources_servers/NAME/CONFIG``) as the default."""
    for candidate in env.configs:
        if candidate.path.stem == config:
            return replace(env, default_config=candidate)
    names = [c.path.stem for c in env.configs]
    raise UnknownEnvironmentError(
        f"NeMo Gym resources server {env.name!r} has no config {config!r}{close_hint(config, names)}. Its configs: "
        f"{', '.join(names)}."
    )


def _listed_at_path(install: Path, roots: tuple[Path, ...], path: Path) -> GymEnvironment | None:
    """A folder (or config) of an ``environments/`` or ``benchmarks/`` tree, named by path: Gym's entry for it, its
    tree searched first."""
    tree_root = catalogue_tree_root(path)
    if tree_root is None or not path.exists():
        return None
    listed = listed_catalogue(install, tuple(dict.fromkeys([tree_root.resolve(), *roots])))
    if listed is None:
        return None
    found = listed.at_path(path)
    if found is None:
        raise ConfigurationError(
            f"{path.resolve()} is in nemo-gym's {tree_root / path.resolve().relative_to(tree_root).parts[0]}/ tree "
            "but nemo-gym lists no environment or benchmark for it. Fix: an environment folder needs config.yaml "
            "(or a manifest.yaml naming its config); a benchmark config needs exactly one dataset of type benchmark."
        )
    return found


def is_path_reference(name: str) -> bool:
    """Whether an environment name is a path (to a folder or a config YAML), not a catalogue name: absolute, ``~``
    or ``.`` first, a YAML file, or a relative path that exists here (``aviary_bbh/config_remote``,
    ``benchmarks/aime25`` and ``resources_servers/NAME`` are names unless such a folder is in the working directory,
    which Gym searches first too)."""
    if name.startswith(("~", ".", "/", os.sep)) or name.endswith((".yaml", ".yml")):
        return True
    return ("/" in name or os.sep in name) and Path(name).exists()


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


def canonical_reference(name: str, gym_python: str | None = None, gym_version: str | None = None) -> str:
    """How a run names an environment wherever it goes (a resume elsewhere, Ray workers, env servers): a path by
    its absolute form, a name found in your trees by its folder's absolute path, a packaged name as it is.
    ``gym_python``/``gym_version`` pick the runtime whose catalogue is asked (else the default one)."""
    if is_path_reference(name):
        if catalogue_tree_root(Path(name).expanduser()) is not None:
            return str(Path(name).expanduser().resolve())
        directory, config = locate_environment(name)
        return str(config or directory)
    kind, _ = explicit_kind(name)
    if kind is not None:
        return name
    roots = gym_roots_from_env()
    if not roots:  # only a tree of yours can turn a name into a folder; no runtime is needed to say so
        return name
    install = _resolve_root(gym_root(gym_python, gym_version))
    listed = listed_catalogue(install, roots)
    if listed is not None and listed.resolve(name) is not None:
        return name
    for root in roots:
        folder = root / RESOURCES_SERVERS / name
        if (folder / "configs").is_dir():
            packaged = install / RESOURCES_SERVERS / name
            if (packaged / "configs").is_dir() and packaged.resolve() != folder.resolve():
                _say_hidden(name, folder, packaged)
            return str(folder)
    return name


@functools.cache
def _say_hidden(name: str, folder: Path, packaged: Path) -> None:
    logger.warning(
        "%s is your folder %s, which hides the packaged environment of that name. To run the packaged one, name "
        "its folder: %s (or run from a folder whose resources_servers/ has no %s, without --gym-root).",
        name,
        folder,
        packaged,
        name,
    )


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
