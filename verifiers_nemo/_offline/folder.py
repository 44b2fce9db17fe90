"""The offline folder: what ``prepare --gather`` wrote, read where there is no network.

Its layout: ``wheels/`` (every package a first start installs: the managed Gym runtime's, each derived server
environment's), ``data/`` (benchmark rows under their Gym path, ``benchmarks/NAME/data/...``), ``manifest.json``
(the platform and Python the wheels are for, and what was gathered for which environment).
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._exceptions import ConfigurationError

OFFLINE_DIR_VAR = "VERIFIERS_NEMO_OFFLINE_DIR"
MANIFEST = "manifest.json"
FORMAT = 1

_NETWORK_OFF = {
    "UV_OFFLINE": "1",
    "PIP_NO_INDEX": "1",
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}
"""The public switches of the tools a Gym server (and this package) may reach the network through."""


@dataclass(frozen=True)
class OfflineFolder:
    """A gathered folder (``prepare ENV --gather DIR``)."""

    path: Path

    @property
    def wheels(self) -> Path:
        return self.path / "wheels"

    @property
    def data(self) -> Path:
        return self.path / "data"

    def manifest(self) -> dict[str, Any]:
        """What was gathered (empty before the first gather)."""
        try:
            return json.loads((self.path / MANIFEST).read_text())
        except FileNotFoundError:
            return {}
        except ValueError as exc:
            raise ConfigurationError(f"{self.path / MANIFEST} is not JSON ({exc}): gather the folder again.") from None

    def uv_args(self) -> list[str]:
        """What makes ``uv pip install`` take packages from the folder's wheels only (none without ``wheels/``)."""
        found = ["--find-links", str(self.wheels)] if self.wheels.is_dir() else []
        return ["--offline", "--no-index", *found]

    def data_file(self, gym_path: str) -> Path | None:
        """The gathered copy of a Gym data file (``benchmarks/NAME/data/x.jsonl``), if there is one."""
        path = self.data / gym_path
        return path if path.is_file() else None

    def gather_hint(self, env_name: str | None = None) -> str:
        """The command that gathers what is missing, to end a refusal with."""
        return (
            f"gather it on a connected machine with `verifiers-nemo prepare {env_name or 'ENV'} --gather DIR` and "
            f"copy DIR here again ({OFFLINE_DIR_VAR}={self.path})"
        )

    def check_platform(self, platform: str, python: str) -> None:
        """Refuse wheels gathered for another platform or Python than the runtime's (``linux-x86_64``, ``3.12``)."""
        made = self.manifest().get("target")
        if not made:
            return
        if (made.get("platform"), made.get("python")) != (platform, python):
            raise ConfigurationError(
                f"The offline folder {self.path} was gathered for {made.get('platform')} Python {made.get('python')}; "
                f"this machine's Gym runtime is {platform} Python {python}. Gather it again on a connected machine "
                "with the same platform and Python as this one."
            )


def offline_folder() -> OfflineFolder | None:
    """The folder ``VERIFIERS_NEMO_OFFLINE_DIR`` names (read each call), or None when it is not set. A name that is
    not a folder is refused at once."""
    named = os.environ.get(OFFLINE_DIR_VAR)
    if not named:
        return None
    path = Path(os.path.abspath(Path(named).expanduser()))
    if not path.is_dir():
        raise ConfigurationError(
            f"{OFFLINE_DIR_VAR}={named}: no such folder. Gather one on a connected machine with "
            "`verifiers-nemo prepare ENV... --gather DIR` and copy it here, or unset the variable."
        )
    return OfflineFolder(path)


def network_off_env() -> dict[str, str]:
    """The variables that keep Gym's processes and our own installers off the network while an offline folder is
    named; empty otherwise."""
    return dict(_NETWORK_OFF) if os.environ.get(OFFLINE_DIR_VAR) else {}


def offline_uv_args(folder: OfflineFolder | None) -> list[str]:
    """``folder.uv_args()``, or nothing without a folder."""
    return folder.uv_args() if folder is not None else []


_TARGET = "import sys, sysconfig; print(sysconfig.get_platform(), '%d.%d' % sys.version_info[:2])"


def python_target(python: Path | str) -> tuple[str, str]:
    """The platform and Python series wheels must fit for ``python`` (``("linux-x86_64", "3.12")``)."""
    out = subprocess.run([str(python), "-I", "-c", _TARGET], capture_output=True, text=True, timeout=60, check=True)
    platform, series = out.stdout.split()
    return platform, series
