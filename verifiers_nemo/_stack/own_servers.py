"""Servers that run from your own folders (an environment named by path, or found under ``--gym-root``): which
they are, and what can be known wrong with them before a stack starts.

A stack's servers are found as Gym finds them (``_gym.tree``): the folders of the configs' own tree, your roots,
then the Gym install. Those outside the install are linked into the launch's working folder (``StackConfig.
server_dirs``). Checked here, before anything starts: the folder has the ``requirements.txt`` (or
``pyproject.toml``) without which Gym would start the installed server of that name instead, the entrypoint
exists, and it compiles (a syntax error is named with its file and line, at once, not after a start timeout).
"""

from __future__ import annotations

import ast
import functools
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path

from .._exceptions import ConfigurationError
from .._gym import POLICY_MODEL, ServerInstance, merged_configs, server_instances, tree_of_configs
from .._gym.tree import PROJECT_FILES, gym_roots_from_env

logger = logging.getLogger(__name__)


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
            for root in tree.roots:
                if folder.resolve().is_relative_to(root.resolve()):
                    _say_other_release(root, install)
        elif not tree.find(instance.rel_dir).is_dir() and instance.server_type != "responses_api_models":
            where = ", ".join(str(r) for r in (*tree.roots, *(f for _, f in tree.links))) or "none"
            raise ConfigurationError(
                f"Gym server {instance.name} is {instance.rel_dir.as_posix()}, which is neither in your folders "
                f"({where}) nor packaged with nemo-gym ({tree.install}). Fix: create that folder, correct the "
                f"config's server name, or name its tree with --gym-root."
            )
    return tuple((rel, str(folder)) for rel, folder in found.items())


def gym_tree_version(root: Path) -> str | None:
    """The nemo-gym version of a Gym tree that holds the library itself (a clone: ``nemo_gym/package_info.py``, read
    without importing it), else None (a project of your own)."""
    try:
        tree = ast.parse((root / "nemo_gym" / "package_info.py").read_text())
    except (OSError, SyntaxError, ValueError):
        return None
    parts: dict[str, object] = {}
    for node in tree.body:
        named = isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
        if named and isinstance(node.value, ast.Constant):  # type: ignore[union-attr]
            parts[node.targets[0].id] = node.value.value  # type: ignore[union-attr]
    if not all(k in parts for k in ("MAJOR", "MINOR", "PATCH")):
        return None
    return f"{parts['MAJOR']}.{parts['MINOR']}.{parts['PATCH']}{parts.get('PRE_RELEASE') or ''}"


@functools.cache
def _say_other_release(root: Path, install: Path) -> None:
    theirs, ours = gym_tree_version(root), gym_tree_version(install)
    if theirs is None or ours is None or theirs == ours:
        return
    logger.warning(
        "%s is a Gym tree of nemo-gym %s, and the Gym runtime (%s) has nemo-gym %s: the tree's servers and agents run "
        "on the runtime's library, and may not import or run on another release (an ImportError at start, say). "
        "Fix: check out the tree's release that matches the runtime (its v%s tag), or run on a runtime of the "
        "tree's own release (VERIFIERS_NEMO_GYM_PYTHON: an interpreter where that tree is installed, pip install -e).",
        root,
        theirs,
        install,
        ours,
        ours,
    )


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
