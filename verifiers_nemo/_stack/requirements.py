"""What each server of a stack needs beyond the Gym runtime, and the venv it runs in.

A server whose requirements the runtime has runs on the runtime; one whose requirements it lacks runs in
an environment derived from it (``_gym.derived_env``: installed once with uv, cached, shared across
runs and processes), or, with ``isolated_venvs``, in a venv nemo-gym builds itself.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .._exceptions import GymRuntimeError, MissingRequirementsError, StackStartError
from .._gym import GymRuntime, ServerInstance, requirements_beyond_nemo_gym
from .._gym.derived_env import derived_env, ensure_derived_env
from .._gym.runtime import find_uv

_CHECK_REQUIREMENTS = r"""
import json, sys, importlib.metadata as md
from packaging.requirements import Requirement, InvalidRequirement
missing = {}
for server, lines in json.loads(sys.argv[1]).items():
    for line in lines:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            missing.setdefault(server, []).append(line)
            continue
        if req.marker is not None and not req.marker.evaluate():
            continue
        try:
            version = md.version(req.name)
        except md.PackageNotFoundError:
            missing.setdefault(server, []).append(line)
            continue
        if req.specifier and not req.specifier.contains(version, prereleases=True):
            missing.setdefault(server, []).append(f"{line} (installed: {version})")
print(json.dumps(missing))
"""

_satisfied: set[tuple[str, str]] = set()  # (interpreter, requirements) checked and found installed


def server_folder(instance: ServerInstance, runtime: GymRuntime, server_dirs: Mapping[str, str] | None = None) -> Path:
    """Where ``instance`` runs from: a folder of yours named in ``server_dirs`` (``StackConfig.server_dirs``), else
    the Gym install's."""
    own = (server_dirs or {}).get(instance.rel_dir.as_posix())
    return Path(own) if own is not None else runtime.root / instance.rel_dir


def server_requirements(
    instances: Iterable[ServerInstance], runtime: GymRuntime, server_dirs: Mapping[str, str] | None = None
) -> dict[str, tuple[str, ...]]:
    """Each server's Python requirements beyond nemo-gym (servers without any left out)."""
    wanted = {}
    for instance in instances:
        reqs, _ = requirements_beyond_nemo_gym(server_folder(instance, runtime, server_dirs))
        if reqs:
            wanted[instance.name] = reqs
    return wanted


def missing_requirements(wanted: Mapping[str, Iterable[str]], runtime: GymRuntime) -> dict[str, list[str]]:
    """The requirements of ``wanted`` (by any key) that ``runtime`` does not have installed. Starts no
    server: it asks the runtime's interpreter which packages it has (answers found complete are cached)."""
    wanted = {key: list(lines) for key, lines in wanted.items() if lines}
    cache_key = (str(runtime.python), json.dumps(wanted, sort_keys=True))
    if not wanted or cache_key in _satisfied:
        return {}
    out = subprocess.run(
        [str(runtime.python), "-P", "-c", _CHECK_REQUIREMENTS, json.dumps(wanted)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if out.returncode != 0:
        raise StackStartError(f"Could not check server requirements with {runtime.python}: {out.stderr}")
    missing: dict[str, list[str]] = json.loads(out.stdout)
    if not missing:
        _satisfied.add(cache_key)
    return missing


def check_requirements(
    name: str,
    instances: list[ServerInstance],
    runtime: GymRuntime,
    *,
    isolated_venvs: bool = False,
    uv: Callable[[str], list[str]] = find_uv,
    server_dirs: Mapping[str, str] | None = None,
) -> set[str]:
    """The servers among ``instances`` whose Python requirements ``runtime`` lacks: they run in an
    environment derived from the runtime (``server_venvs`` installs it), or with ``isolated_venvs`` in a
    venv nemo-gym builds. Installs nothing; raises MissingRequirementsError only when they could not be
    installed at all (no ``uv``: how uv is found)."""
    missing = missing_requirements(server_requirements(instances, runtime, server_dirs), runtime)
    if missing and not isolated_venvs:
        try:
            uv(f"Installing the requirements of {name}")
        except GymRuntimeError as exc:
            raise MissingRequirementsError(name, str(runtime.python), missing, reason=str(exc)) from None
    return set(missing)


def server_venvs(
    name: str,
    instances: list[ServerInstance],
    runtime: GymRuntime,
    *,
    isolated_venvs: bool = False,
    server_dirs: Mapping[str, str] | None = None,
) -> dict[str, Path | None]:
    """The venv of each server that does not run on the runtime itself: its derived environment (its
    requirements installed now unless cached: blocking, the first time only), or None when
    ``isolated_venvs`` lets nemo-gym build one. Raises MissingRequirementsError with uv's explanation
    when requirements cannot be installed."""
    wanted = server_requirements(instances, runtime, server_dirs)
    missing = missing_requirements(wanted, runtime)
    if isolated_venvs:
        return dict.fromkeys(missing)
    by_name = {i.name: i for i in instances}

    def install(server: str) -> Path:
        instance = by_name[server]
        try:
            env = ensure_derived_env(
                runtime,
                wanted[server],
                label=f"{name} ({instance.rel_dir})",
                base=server_folder(instance, runtime, server_dirs),
            )
        except GymRuntimeError as exc:
            python = str(runtime.python)
            raise MissingRequirementsError(name, python, {server: missing[server]}, reason=str(exc)) from None
        return env.path

    # Several servers' environments are built at once (uv is mostly waiting on downloads and the disk).
    with ThreadPoolExecutor(max_workers=max(1, min(INSTALLS_AT_ONCE, len(missing)))) as pool:
        paths = dict(zip(missing, pool.map(install, list(missing)), strict=True))
    return dict(paths)


INSTALLS_AT_ONCE = 4
"""Derived environments one stack start builds at the same time."""

INSTALLED, CACHED, TO_INSTALL = "installed", "cached", "to install"
"""What ``requirement_states`` says of a requirement set: the runtime has it, its derived environment is
built, or the first start installs it."""


def requirement_states(wanted: Mapping[Path, Iterable[str]], runtime: GymRuntime) -> dict[Path, str]:
    """For each server folder of ``wanted`` (with its requirements beyond nemo-gym): INSTALLED, CACHED or
    TO_INSTALL. Installs nothing: one question to the runtime's interpreter, and a look in the cache."""
    lines = {str(directory): tuple(reqs) for directory, reqs in wanted.items() if reqs}
    missing = missing_requirements(lines, runtime)
    states = {}
    for key, reqs in lines.items():
        if key not in missing:
            states[Path(key)] = INSTALLED
        else:
            states[Path(key)] = CACHED if derived_env(runtime, reqs, base=Path(key)).ready else TO_INSTALL
    return states
