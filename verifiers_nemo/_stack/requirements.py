"""Whether the Gym runtime has what each server of a stack needs, checked before anything starts."""

from __future__ import annotations

import json
import subprocess

from .._exceptions import MissingRequirementsError, StackStartError
from .._gym import GymRuntime, ServerInstance, requirements_beyond_nemo_gym

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


def check_requirements(
    name: str, instances: list[ServerInstance], runtime: GymRuntime, *, isolated_venvs: bool = False
) -> set[str]:
    """The servers among ``instances`` whose Python requirements ``runtime`` lacks. Raises
    MissingRequirementsError naming them unless ``isolated_venvs`` (nemo-gym then builds their venvs).
    Starts nothing: it asks the runtime's interpreter which packages it has."""
    wanted = {}
    for instance in instances:
        reqs, _ = requirements_beyond_nemo_gym(runtime.root / instance.rel_dir)
        if reqs:
            wanted[instance.name] = reqs
    key = (str(runtime.python), json.dumps(wanted, sort_keys=True))
    if not wanted or key in _satisfied:
        return set()
    out = subprocess.run(
        [str(runtime.python), "-c", _CHECK_REQUIREMENTS, json.dumps(wanted)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if out.returncode != 0:
        raise StackStartError(f"Could not check server requirements with {runtime.python}: {out.stderr}")
    missing: dict[str, list[str]] = json.loads(out.stdout)
    if not missing:
        _satisfied.add(key)
    elif not isolated_venvs:
        raise MissingRequirementsError(name, str(runtime.python), missing)
    return set(missing)
