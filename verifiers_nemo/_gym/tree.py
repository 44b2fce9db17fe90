"""Where a Gym server's folder is: the user's own environment trees first, then the Gym install.

Gym resolves a server folder (``resources_servers/<name>``, ``responses_api_agents/<type>``...) and a data path
under the working directory first and its install second: "if the same path exists in your current directory, the
local version takes priority" (Gym's guide). A ``GymTree`` is that search order made explicit, so the catalogue,
the requirement check and the stack agree on which folder a server runs from:

* ``links``: single environment folders named by path (``./my_env`` or ``.../resources_servers/my_env``), each
  standing for ``resources_servers/<its name>``;
* ``roots``: folders holding ``resources_servers/`` (a Gym clone, a project of environments): ``--gym-root``,
  ``VERIFIERS_NEMO_GYM_ROOT`` and the working directory when it holds ``resources_servers/``, as Gym's own;
* ``install``: the Gym runtime's site-packages (the packaged environments).

A stack runs with a working directory of its own; each server folder found outside the install is linked there
under its relative path (``<run>/resources_servers/<name>``), where Gym's own resolution finds it first.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .config import RESOURCES_SERVERS, RESPONSES_API_AGENTS, RESPONSES_API_MODELS

GYM_ROOT_VAR = "VERIFIERS_NEMO_GYM_ROOT"
"""Folders of your own environments (each holding ``resources_servers/``), ``os.pathsep``-separated, searched
before the packaged ones; ``--gym-root`` sets it."""

SERVER_KINDS = (RESOURCES_SERVERS, RESPONSES_API_AGENTS, RESPONSES_API_MODELS, "environment_servers")
PROJECT_FILES = ("requirements.txt", "pyproject.toml")
"""Gym starts a server from a folder under the working directory only when it holds one of these."""


TREE_FOLDERS = (RESOURCES_SERVERS, "environments", "benchmarks")
"""What makes a folder a tree of environments: resources servers (every release), nemo-gym 0.7's environments and
benchmarks."""


def is_tree_root(folder: Path) -> bool:
    """Whether ``folder`` holds ``resources_servers/``, ``environments/`` or ``benchmarks/``."""
    return any((folder / sub).is_dir() for sub in TREE_FOLDERS)


def gym_roots_from_env(environ: os._Environ[str] | dict[str, str] | None = None) -> tuple[Path, ...]:
    """The user's environment trees: ``VERIFIERS_NEMO_GYM_ROOT`` (each must hold ``resources_servers/``), then
    the working directory when it holds one (as Gym itself searches it first)."""
    from .._exceptions import ConfigurationError

    environ = os.environ if environ is None else environ
    roots: list[Path] = []
    for item in (environ.get(GYM_ROOT_VAR) or "").split(os.pathsep):
        if not item.strip():
            continue
        root = Path(item).expanduser().resolve()
        if not is_tree_root(root):
            raise ConfigurationError(
                f"{GYM_ROOT_VAR} (or --gym-root) names {root}, which holds none of {', '.join(TREE_FOLDERS)}. "
                f"Fix: name the folder that holds {RESOURCES_SERVERS}/<env>/ (or nemo-gym 0.7's environments/<env>/, "
                "benchmarks/<name>/): a Gym clone, or your project's root."
            )
        roots.append(root)
    cwd = Path.cwd().resolve()
    if is_tree_root(cwd) and cwd not in roots:
        roots.append(cwd)
    return tuple(dict.fromkeys(roots))


@dataclass(frozen=True)
class GymTree:
    """The search order of server folders and data paths: ``links``, then ``roots``, then ``install``."""

    install: Path
    roots: tuple[Path, ...] = ()
    links: tuple[tuple[str, Path], ...] = ()
    """``(relative folder, folder)``: an environment folder named by path stands for ``resources_servers/<name>``."""

    def find(self, relative: str | Path) -> Path:
        """Where a relative path (a server folder, a data file) is: the first place that has it, else the install's
        (so a message about a missing file names where Gym looks last)."""
        rel = Path(relative)
        if rel.is_absolute():
            return rel
        for prefix, folder in self.links:
            parts = Path(prefix).parts
            if rel.parts[: len(parts)] == parts:
                return folder.joinpath(*rel.parts[len(parts) :])
        for root in self.roots:
            if (root / rel).exists():
                return root / rel
        return self.install / rel

    def server_dir(self, kind: str, implementation: str) -> Path:
        return self.find(Path(kind, implementation))

    def is_local(self, path: Path) -> bool:
        """Whether ``path`` is outside the Gym install (a folder of the user's)."""
        return not path.is_relative_to(self.install)

    def local_server_dirs(self, rel_dirs: Iterable[Path]) -> dict[str, Path]:
        """``{relative folder: folder}`` of the servers among ``rel_dirs`` that run from the user's folders."""
        found = {}
        for rel in rel_dirs:
            where = self.find(rel)
            if self.is_local(where) and where.is_dir():
                found[rel.as_posix()] = where
        return found


def tree_of_configs(config_paths: Sequence[Path], install: Path, roots: Sequence[Path] = ()) -> GymTree:
    """The tree a set of config files implies: each config under ``<root>/<kind>/<name>/configs/`` adds its root,
    and one in a folder of its own (``<folder>/configs/x.yaml``, no kind folder above) links that folder as
    ``resources_servers/<folder name>``; then ``roots``; then the install."""
    tree_roots: list[Path] = []
    links: list[tuple[str, Path]] = []
    for path in config_paths:
        resolved = Path(path).expanduser().resolve()
        if resolved.is_relative_to(install.resolve()) or resolved.parent.name != "configs":
            continue
        server_folder = resolved.parent.parent
        if server_folder.parent.name in SERVER_KINDS:
            tree_roots.append(server_folder.parent.parent)
        else:
            links.append((f"{RESOURCES_SERVERS}/{server_folder.name}", server_folder))
    return GymTree(
        install=install,
        roots=tuple(dict.fromkeys([*tree_roots, *(Path(r) for r in roots)])),
        links=tuple(dict.fromkeys(links)),
    )


_NOT_HASHED = frozenset({"__pycache__", ".venv", ".git", ".pytest_cache", ".ruff_cache", "node_modules"})
_HASH_WHOLE_BELOW = 64 << 20
"""Files up to this size are hashed whole; a larger one (a dataset) by its size and modification time."""


def folder_fingerprint(folder: Path) -> str:
    """A fingerprint of an environment folder's files (code, configs, requirements, data; not caches or venvs):
    equal as long as none of them changed. 16 hex digits of a SHA-256."""
    import hashlib

    digest = hashlib.sha256()
    for path in sorted(_files(folder)):
        rel = path.relative_to(folder).as_posix()
        try:
            stat = path.stat()
            digest.update(f"{rel}\0{stat.st_size}\0".encode())
            if stat.st_size <= _HASH_WHOLE_BELOW:
                digest.update(path.read_bytes())
            else:
                digest.update(str(stat.st_mtime_ns).encode())
        except OSError:
            digest.update(f"{rel}\0unreadable".encode())
    return digest.hexdigest()[:16]


def _files(folder: Path) -> Iterable[Path]:
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if d not in _NOT_HASHED]
        for name in filenames:
            if not name.endswith(".pyc"):
                yield Path(dirpath, name)
