"""Servers that run from your own folders (an environment named by path, or found under ``--gym-root``): which
they are, and what can be known wrong with them before a stack starts.

A stack's servers are found as Gym finds them (``_gym.tree``): the folders of the configs' own tree, your roots,
then the Gym install. Those outside the install are linked into the launch's working folder (``StackConfig.
server_dirs``). Checked here, before anything starts: the folder has the ``requirements.txt`` (or
``pyproject.toml``) without which Gym would start the installed server of that name instead, the entrypoint
exists, and it compiles (a syntax error is named with its file and line, at once, not after a start timeout).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from .._exceptions import ConfigurationError
from .._gym import POLICY_MODEL, ServerInstance, merged_configs, server_instances, tree_of_configs
from .._gym.tree import PROJECT_FILES, gym_roots_from_env


def own_server_dirs(config_paths: Sequence[Path], install: Path) -> tuple[tuple[str, str], ...]:
    """``(relative folder, folder)`` of each server of ``config_paths`` that runs from a folder of yours; each
    checked (``check_own_server``)."""
    instances = [i for i in server_instances(merged_configs(list(config_paths))) if i.name != POLICY_MODEL]
    tree = tree_of_configs(config_paths, install, gym_roots_from_env())
    found = tree.local_server_dirs(dict.fromkeys(i.rel_dir for i in instances))
    for instance in instances:
        folder = found.get(instance.rel_dir.as_posix())
        if folder is not None:
            check_own_server(instance, folder)
        elif not tree.find(instance.rel_dir).is_dir() and instance.server_type != "responses_api_models":
            where = ", ".join(str(r) for r in (*tree.roots, *(f for _, f in tree.links))) or "none"
            raise ConfigurationError(
                f"Gym server {instance.name} is {instance.rel_dir.as_posix()}, which is neither in your folders "
                f"({where}) nor packaged with nemo-gym ({tree.install}). Fix: create that folder, correct the "
                f"config's server name, or name its tree with --gym-root."
            )
    return tuple((rel, str(folder)) for rel, folder in found.items())


def check_own_server(instance: ServerInstance, folder: Path) -> None:
    """ConfigurationError naming the file and the fix when Gym could not start ``instance`` from ``folder``."""
    if not any((folder / name).is_file() for name in PROJECT_FILES):
        raise ConfigurationError(
            f"{folder} has no requirements.txt (nor pyproject.toml): Gym starts {instance.name} from your folder "
            "only when it has one, and would run the installed server of that name (or none) instead. Fix: add a "
            "requirements.txt (empty when nemo-gym is all the server needs)."
        )
    entrypoint = folder / str(instance.config.get("entrypoint") or "app.py")
    if not entrypoint.is_file():
        raise ConfigurationError(
            f"{instance.name}: its entrypoint {entrypoint} does not exist. Fix: create it, or correct "
            f"`entrypoint:` in the config of {instance.name}."
        )
    for source in _python_files(folder, entrypoint):
        try:
            compile(source.read_bytes(), str(source), "exec")
        except SyntaxError as exc:
            where = f"{exc.filename}:{exc.lineno}" if exc.lineno else str(exc.filename)
            line = (exc.text or "").strip()
            raise ConfigurationError(
                f"{where}: {exc.msg}{f' ({line})' if line else ''}. Fix the file: Gym server {instance.name} "
                "cannot start with it."
            ) from None
        except (OSError, ValueError) as exc:
            raise ConfigurationError(f"{source}: cannot be read ({exc}).") from None


def _python_files(folder: Path, entrypoint: Path) -> Iterable[Path]:
    """The entrypoint, then the folder's other Python modules (not its tests, data or venvs)."""
    yield entrypoint
    for path in sorted(folder.glob("*.py")):
        if path != entrypoint:
            yield path
