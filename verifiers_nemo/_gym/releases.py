"""The nemo-gym releases the managed Gym runtime can be built with, and the interpreters that can run them.

A managed runtime takes the newest release an interpreter on this machine can run (nemo-gym >= 0.5 declares
Python >= 3.13.14; 0.4 runs on 3.12), or the series asked for (``VERIFIERS_NEMO_GYM_VERSION``, the CLI's
``--gym-version``, ``gym_version=``). Each lives in its own folder of the cache, side by side.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .._exceptions import ConfigurationError, GymRuntimeError

GYM_VERSION_ENV_VAR = "VERIFIERS_NEMO_GYM_VERSION"
_VERSION = re.compile(r"Python (\d+)\.(\d+)\.(\d+)")


@dataclass(frozen=True)
class GymRelease:
    """A nemo-gym release series the managed runtime can build."""

    series: str
    """``"0.7"``, ``"0.4"``: what ``--gym-version`` takes."""
    requirement: str
    python_min: tuple[int, int, int]
    python_max: tuple[int, int] | None = None
    """The newest minor version known to work (0.4's dependencies have no wheels past 3.12)."""

    def runs_on(self, version: tuple[int, int, int]) -> bool:
        return version >= self.python_min and (self.python_max is None or version[:2] <= self.python_max)

    def folder(self, version: tuple[int, int, int]) -> str:
        return f"nemo-gym-{self.series}-py{version[0]}{version[1]}"


RELEASES = (
    GymRelease("0.7", "nemo-gym>=0.7,<0.8", (3, 13, 14)),
    GymRelease("0.4", "nemo-gym==0.4.0", (3, 12, 0), (3, 12)),
)
"""Newest first: the order a managed runtime is chosen in when no series is asked for."""


def release(series: str) -> GymRelease:
    """The release series ``series`` (``0.7``, ``0.4``; ``0.7.0`` reads as ``0.7``)."""
    wanted = ".".join(series.strip().split(".")[:2])
    for known in RELEASES:
        if known.series == wanted:
            return known
    raise ConfigurationError(
        f"nemo-gym {series!r} is not a release the managed Gym runtime builds; pick one of "
        f"{', '.join(r.series for r in RELEASES)}, or install another yourself and point "
        "VERIFIERS_NEMO_GYM_PYTHON at its interpreter."
    )


def interpreters() -> list[tuple[Path, tuple[int, int, int]]]:
    """Python interpreters on this machine and their versions: this one, pyenv's, ``python3.X`` on PATH."""
    candidates = [Path(sys.executable)]
    pyenv_root = os.environ.get("PYENV_ROOT") or str(Path.home() / ".pyenv")
    versions = Path(pyenv_root) / "versions"
    if versions.is_dir():
        candidates += [entry / "bin" / "python3" for entry in sorted(versions.iterdir(), reverse=True)]
    for minor in range(20, 11, -1):
        found = shutil.which(f"python3.{minor}")
        if found:
            candidates.append(Path(found))
    seen: dict[Path, tuple[int, int, int]] = {}
    for candidate in candidates:
        if candidate in seen or not candidate.exists():
            continue
        version = _version_of(candidate)
        if version is not None:
            seen[candidate] = version
    return list(seen.items())


def choose(asked: str | None = None) -> tuple[GymRelease, Path, tuple[int, int, int]]:
    """The release to build and the interpreter to build it on: the series asked (``asked``, else
    ``VERIFIERS_NEMO_GYM_VERSION``), else the newest one an interpreter here can run."""
    asked = asked or os.environ.get(GYM_VERSION_ENV_VAR) or None
    wanted = [release(asked)] if asked else list(RELEASES)
    found = interpreters()
    for candidate in wanted:
        usable = sorted((v, p) for p, v in found if candidate.runs_on(v))
        if usable:
            version, python = usable[-1]
            return candidate, python, version
    needs = "; ".join(_needs(r) for r in wanted)
    example = " or ".join(f"`pyenv install {_dotted(r.python_min if r.python_max is None else r.python_max)}`"
                          for r in wanted)  # fmt: skip
    raise GymRuntimeError(
        f"No Python here can run {'nemo-gym ' + asked if asked else 'any nemo-gym release'} ({needs}); "
        f"found {', '.join(f'{p} ({_dotted(v)})' for p, v in found) or 'none'}. Install one (e.g. "
        f"{example}), or point VERIFIERS_NEMO_GYM_PYTHON at an interpreter that has nemo-gym."
    )


def _needs(candidate: GymRelease) -> str:
    top = f" to {candidate.python_max[0]}.{candidate.python_max[1]}" if candidate.python_max else " or newer"
    return f"nemo-gym {candidate.series} needs Python {_dotted(candidate.python_min)}{top}"


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


def _version_of(python: Path) -> tuple[int, int, int] | None:
    if python == Path(sys.executable):
        return sys.version_info[:3]  # type: ignore[return-value]
    try:
        out = subprocess.run([str(python), "--version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    match = _VERSION.search(out.stdout + out.stderr)
    return (int(match[1]), int(match[2]), int(match[3])) if match else None


def series_of(version: str | None) -> str | None:
    """``"0.7"`` of ``"0.7.0"`` (None stays None)."""
    return ".".join(version.split(".")[:2]) if version else None


def installed_version(root: Path) -> str | None:
    """The nemo-gym version installed at a Gym root (its ``nemo_gym-X.dist-info``), read from the files."""
    for info in sorted(root.glob("nemo_gym-*.dist-info")):
        return info.name.removeprefix("nemo_gym-").removesuffix(".dist-info")
    return None


PACKAGING_PROBLEMS: dict[str, dict[str, str]] = {
    # Measured by starting every environment the catalogue called ready, on each release's runtime.
    "0.7": {
        "spartqa": (
            "its packaged config fails nemo-gym 0.7.0's own validation (its dataset's license value), so the "
            "stack exits at start"
        ),
        "wordle": (
            "its data/guesses.txt is not shipped (generate_data.py downloads the word lists), so every rollout "
            "fails in the Gym agent"
        ),
        "deepsearchqa": (
            "its agent's packaged config lacks fields Gym 0.7.0 requires (agent, image), so the stack exits at start"
        ),
        "widesearch": (
            "its agent's packaged config (harness_exa_search) lacks fields Gym 0.7.0 requires (agent, image), so the "
            "stack exits at start"
        ),
        "indian_banking": (
            "its data/db.json and kb.json are not shipped (they live in a Hugging Face dataset repo), so every "
            "rollout fails in the Gym agent"
        ),
    },
}
"""Environments a release ships that cannot run as packaged, and why (by release series)."""


def packaging_problem(version: str | None, env: str) -> str | None:
    """Why ``env`` as packaged with nemo-gym ``version`` cannot run, if it is known not to."""
    return PACKAGING_PROBLEMS.get(series_of(version) or "", {}).get(env)
