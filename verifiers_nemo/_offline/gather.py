"""Gathering an offline folder on a connected machine: the wheels of every package a first start installs, the
benchmark rows Gym's prepare scripts downloaded, and a manifest saying which platform and Python they are for.

Wheels, not copied venvs: a venv holds its own absolute paths (its ``bin/python`` link, the ``.pth`` that adds the
runtime's site-packages, console scripts' shebangs), so it runs only where it was built; wheels install anywhere the
platform and Python match, with ``uv pip install --offline --no-index --find-links``, at the speed of a cached install.
The wheels are built by ``pip wheel --no-deps`` run on the runtime's own interpreter (``uv tool run``), so they fit
that interpreter; every line is an exact pin read back from the installed environments (``uv pip freeze``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .._exceptions import ConfigurationError, GymRuntimeError
from .._gym import GymRuntime
from .._gym.runtime import MANAGED_MARKER, find_uv
from .folder import FORMAT, MANIFEST, OfflineFolder, python_target


@dataclass
class Gathered:
    """What one gather added to a folder."""

    folder: OfflineFolder
    pins: int = 0
    """Exact package pins gathered (the runtime's when it is managed, each derived environment's)."""
    data: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def wheels(self) -> int:
        return sum(1 for _ in self.folder.wheels.glob("*.whl"))

    @property
    def size_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.folder.path.rglob("*") if p.is_file())


def managed_requirement(runtime: GymRuntime) -> str | None:
    """What the managed runtime ``runtime`` was built from (``nemo-gym==0.4.0``), or None when it is an interpreter
    of the user's own (theirs to bring to the offline machine)."""
    marker = runtime.prefix / MANAGED_MARKER
    return marker.read_text().strip() or None if marker.is_file() else None


def frozen(python: Path) -> list[str]:
    """The exact pins of what is installed in ``python``'s own site-packages (not what a ``.pth`` adds)."""
    uv = find_uv("Gathering an offline folder")
    done = subprocess.run(
        [*uv, "pip", "freeze", "--python", str(python), "--exclude-editable"], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise GymRuntimeError(f"Could not list the packages of {python}: {done.stderr.strip()}")
    return [line.strip() for line in done.stdout.splitlines() if line.strip() and not line.startswith("#")]


def gather(
    path: Path,
    runtime: GymRuntime,
    *,
    runtime_requirement: str | None,
    environments: Mapping[str, Iterable[Path]],
    data: Mapping[str, Iterable[tuple[str, Path]]],
) -> Gathered:
    """Add to the folder at ``path`` the wheels of ``runtime`` (when ``runtime_requirement``: it is the managed one,
    which the offline machine builds from them) and of each environment's derived venvs (``environments``: name to
    venv folders), and each environment's data files (``data``: name to ``(gym path, file)``); update the manifest."""
    started = time.monotonic()
    folder = OfflineFolder(Path(os.path.abspath(path)))
    folder.wheels.mkdir(parents=True, exist_ok=True)
    manifest = folder.manifest()
    platform, series = python_target(runtime.python)
    target = {"platform": platform, "python": series}
    if manifest.get("target") not in (None, target):
        raise ConfigurationError(
            f"{folder.path} holds wheels for {manifest['target']}; this Gym runtime is {target}. Gather into another "
            "folder: one folder is for one platform and Python."
        )
    pins: list[str] = []
    if runtime_requirement is not None:
        pins += frozen(runtime.python)
    entries = manifest.setdefault("environments", {})
    for name, venvs in environments.items():
        own = [pin for venv in venvs for pin in frozen(Path(venv) / "bin" / "python")]
        pins += own
        entries.setdefault(name, {})["packages"] = sorted(set(own))
    pins = sorted(set(pins))
    if pins:
        _build_wheels(runtime.python, pins, folder)
    gathered = Gathered(folder, pins=len(pins))
    for name, files in data.items():
        copied = entries.setdefault(name, {}).setdefault("data", [])
        for gym_path, source in files:
            dest = folder.data / gym_path
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, dest)
            gathered.data.append(gym_path)
            if gym_path not in copied:
                copied.append(gym_path)
    manifest["format"] = FORMAT
    manifest["target"] = target
    manifest["gym"] = runtime.nemo_gym_version
    if runtime_requirement is not None:
        manifest["runtime"] = {"requirement": runtime_requirement, "packages": len(frozen(runtime.python))}
    tmp = folder.path / f"{MANIFEST}.tmp"
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, folder.path / MANIFEST)
    gathered.seconds = time.monotonic() - started
    return gathered


def _build_wheels(python: Path, pins: list[str], folder: OfflineFolder) -> None:
    """A wheel of every pin in the folder's ``wheels/``, made for ``python`` (downloaded, or built from an sdist)."""
    listing = folder.path / "gathered-pins.txt"
    listing.write_text("".join(f"{pin}\n" for pin in pins))
    uv = find_uv("Gathering an offline folder")
    argv = [*uv, "tool", "run", "--python", str(python), "--from", "pip", "pip", "wheel", "--no-deps", "-q"]
    argv += ["--disable-pip-version-check", "--wheel-dir", str(folder.wheels), "-r", str(listing)]
    done = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ, UV_PYTHON_DOWNLOADS="never"))
    if done.returncode != 0:
        last = "\n".join(done.stderr.strip().splitlines()[-15:])
        raise GymRuntimeError(f"Could not gather the wheels into {folder.wheels} (pip wheel said):\n{last}")
