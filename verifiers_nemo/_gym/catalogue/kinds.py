"""Names of the three kinds, resolved as Gym's combined catalogue resolves them (nemo-gym >= 0.7).

* ``NAME`` (or ``NAME/FLAVOR``): an environment or a benchmark of that name claims it (as in ``gym list``); both
  at once is ambiguous and refused with the explicit forms; else a resources server (as on every release).
* ``environments/NAME[/FLAVOR]``, ``benchmarks/NAME[/VARIANT]``, ``resources_servers/NAME[/CONFIG]``: one kind,
  explicitly: the way to reach a resources server whose name an environment or benchmark claims.
* Gym's deprecated environment names (``reasoning_gym_hermes``...) resolve to the new one, with a warning.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

from ..._exceptions import ConfigurationError
from ..config import RESOURCES_SERVERS
from ..runtime import cache_dir
from ..tree import GymTree
from .entries import GymEnvironment
from .gym_listing import BENCHMARK, BENCHMARKS, ENVIRONMENT, ENVIRONMENTS, GymListing, ListedEntry, gym_listing
from .reading import read_listed

logger = logging.getLogger(__name__)

KIND_PREFIXES = {ENVIRONMENTS: ENVIRONMENT, BENCHMARKS: BENCHMARK}
"""The explicit forms' first part, and the kind each names (``resources_servers/`` is the third)."""


def explicit_kind(name: str) -> tuple[str | None, str]:
    """``(kind or None, name within it)``: ``benchmarks/aime25`` → ``("benchmark", "aime25")``,
    ``resources_servers/x`` → ``("resources server", "x")``, ``aime25`` → ``(None, "aime25")``."""
    head, sep, rest = name.partition("/")
    if sep and rest and head in KIND_PREFIXES:
        return KIND_PREFIXES[head], rest
    if sep and rest and head == RESOURCES_SERVERS:
        return "resources server", rest
    return None, name


class ListedCatalogue:
    """Gym's environments and benchmarks of one runtime and set of roots, read into catalogue entries."""

    def __init__(self, listing: GymListing, tree: GymTree) -> None:
        self.listing = listing
        self.tree = tree
        self._flat = cache_dir() / "gym-catalogue" / "configs"
        self._read: dict[tuple[str, str], GymEnvironment] = {}

    def environment(self, entry: ListedEntry, alias_of: str | None = None) -> GymEnvironment:
        key = (entry.kind, entry.name)
        if key not in self._read:
            self._read[key] = read_listed(self.tree, entry, self._flat)
        found = self._read[key]
        return replace(found, alias_of=alias_of) if alias_of else found

    def all(self) -> list[GymEnvironment]:
        return [self.environment(e) for e in self.listing.entries]

    def names(self) -> list[str]:
        return [e.name for e in self.listing.entries]

    def resolve(self, name: str) -> GymEnvironment | None:
        """The entry ``name`` selects (None when it is none of Gym's: a resources server, maybe); a
        ConfigurationError when an environment and a benchmark share it."""
        kind, bare = explicit_kind(name)
        if kind is not None and kind not in (ENVIRONMENT, BENCHMARK):
            return None
        matches = [e for e in self.listing.named(bare) if kind is None or e.kind == kind]
        if len(matches) > 1:
            raise ConfigurationError(
                f"{name!r} is both a nemo-gym environment and a benchmark. Fix: say which, "
                f"environments/{bare} or benchmarks/{bare}."
            )
        if matches:
            return self.environment(matches[0])
        canonical = self.listing.aliases.get(bare)
        if canonical is not None and kind in (None, ENVIRONMENT):
            renamed = [e for e in self.listing.named(canonical) if e.kind == ENVIRONMENT]
            if renamed:
                logger.warning("%r is a deprecated nemo-gym name: running %r, its name now.", bare, canonical)
                return self.environment(renamed[0], alias_of=canonical)
        return None

    def at_path(self, path: Path) -> GymEnvironment | None:
        """The entry whose config file is ``path``, else the default one of the folder ``path``."""
        resolved = path.resolve()
        for entry in self.listing.entries:
            if entry.config_path.resolve() == resolved:
                return self.environment(entry)
        in_folder = [e for e in self.listing.entries if e.folder.resolve() == resolved]
        in_folder.sort(key=lambda e: e.config_path.name != "config.yaml")
        return self.environment(in_folder[0]) if in_folder else None


def listed_catalogue(install: Path, roots: tuple[Path, ...]) -> ListedCatalogue | None:
    """Gym's catalogue of the runtime at ``install`` with ``roots`` searched first; None on nemo-gym 0.4."""
    listing = gym_listing(install, roots, cache_dir())
    if listing is None:
        return None
    key = (id(listing), install, roots)
    if key not in _CATALOGUES:
        _CATALOGUES[key] = ListedCatalogue(listing, GymTree(install, tuple(roots)))
    return _CATALOGUES[key]


_CATALOGUES: dict[tuple[int, Path, tuple[Path, ...]], ListedCatalogue] = {}
"""Per listing (``gym_listing`` keeps one object per cache key): the entries read so far."""


def catalogue_tree_root(path: Path) -> Path | None:
    """The root above a folder or config inside an ``environments/`` or ``benchmarks/`` tree (its Gym root)."""
    resolved = path.resolve()
    for parent in (resolved, *resolved.parents):
        if parent.name in KIND_PREFIXES and parent != resolved:
            return parent.parent
    return None
