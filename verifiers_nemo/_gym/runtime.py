"""The Gym runtime: an interpreter that has nemo-gym, found or built once.

The harness process never imports ``nemo_gym``; it launches the runtime's own ``ng_run`` and
speaks HTTP. The runtime is, in order of preference:

1. the interpreter named by ``gym_python=`` or ``VERIFIERS_NEMO_GYM_PYTHON``;
2. the current interpreter, when ``nemo_gym`` is importable here;
3. a managed venv built once with ``uv`` into the cache directory and reused: the newest nemo-gym release an
   interpreter here can run, or the series asked for (``releases``).
"""

from __future__ import annotations

import fcntl
import functools
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .._exceptions import GymRuntimeError
from .._offline.folder import network_off_env, offline_folder, offline_uv_args, python_target
from . import releases

logger = logging.getLogger(__name__)

NEMO_GYM_REQUIREMENT = "nemo-gym>=0.4.0,<0.8"
GYM_PYTHON_ENV_VAR = "VERIFIERS_NEMO_GYM_PYTHON"
CACHE_DIR_ENV_VAR = "VERIFIERS_NEMO_CACHE_DIR"
MANAGED_MARKER = ".verifiers-nemo-complete"
"""Written in a managed runtime's venv once it is built: the requirement it was built from."""

_PROBE = (
    "import importlib.util, json, sys, importlib.metadata as m\n"
    "spec = importlib.util.find_spec('nemo_gym')\n"
    "print(json.dumps({'origin': spec and spec.origin, 'prefix': sys.prefix,"
    " 'version': spec and m.version('nemo-gym'), 'python': list(sys.version_info[:3])}))\n"
)


def cache_dir() -> Path:
    """Where verifiers_nemo keeps the managed runtime, run directories and logs."""
    explicit = os.environ.get(CACHE_DIR_ENV_VAR)
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "verifiers-nemo"


@dataclass(frozen=True)
class GymRuntime:
    """An interpreter with nemo-gym installed, and where its packaged servers live."""

    python: Path
    """The interpreter (not resolved: a venv's ``bin/python`` keeps its venv)."""
    prefix: Path
    """``sys.prefix`` of that interpreter."""
    root: Path
    """The directory holding ``nemo_gym/``, ``resources_servers/``, ``responses_api_agents/``..."""
    nemo_gym_version: str
    site_dirs: tuple[Path, ...] | None = None
    """Its site-packages directories when known (else asked of the interpreter by ``site_packages``)."""

    @property
    def bin_dir(self) -> Path:
        return self.python.parent

    @property
    def ng_run(self) -> Path:
        return self.bin_dir / "ng_run"

    @property
    def start_command(self) -> list[str]:
        """The command that starts a stack, before its overrides: ``gym env start`` where the runtime has nemo-gym's
        ``gym`` entry point (the 0.4.0 and 0.7.0 wheels on PyPI both do: their ``ng_run`` is a deprecated alias of
        it, with the same overrides, that says so in every stack's log), else ``ng_run``."""
        gym = self.bin_dir / "gym"
        try:
            ours = GYM_ENTRY_MODULE in gym.read_text(errors="replace")[:4096]
        except OSError:
            ours = False
        return [str(gym), "env", "start"] if ours else [str(self.ng_run)]


GYM_ENTRY_MODULE = "nemo_gym.cli.main"
"""What nemo-gym's ``gym`` console script imports (a ``gym`` of any other package is not its)."""


def _probe(python: Path) -> dict:
    try:
        argv = [str(python), "-P", "-c", _PROBE]  # -P: a json.py in the working directory shadows no module
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout
    except FileNotFoundError as exc:
        raise GymRuntimeError(f"Gym interpreter {python} does not exist.") from exc
    except subprocess.CalledProcessError as exc:
        raise GymRuntimeError(f"Gym interpreter {python} failed to start: {exc.stderr.strip()}") from exc
    return json.loads(out.strip().splitlines()[-1])


def _runtime_from_probe(python: Path, info: dict) -> GymRuntime:
    origin = Path(info["origin"])
    return GymRuntime(
        python=python,
        prefix=Path(info["prefix"]),
        root=_root_of(origin),
        nemo_gym_version=info["version"],
    )


def _root_of(origin: Path) -> Path:
    """The Gym root (which holds ``nemo_gym/`` and ``resources_servers/``) of ``.../nemo_gym/__init__.py``."""
    return origin.parent.parent


def _current_runtime() -> GymRuntime | None:
    spec = importlib.util.find_spec("nemo_gym")
    if spec is None or spec.origin is None:
        return None
    from importlib import metadata

    python = Path(sys.executable)
    if not python.exists():  # pragma: no cover - embedded interpreters
        return None
    return GymRuntime(
        python=python,
        prefix=Path(sys.prefix),
        root=_root_of(Path(spec.origin)),
        nemo_gym_version=metadata.version("nemo-gym"),
    )


def find_uv(purpose: str | None = None) -> list[str]:
    """The command that runs ``uv`` (on PATH, else this interpreter's ``uv`` module); a GymRuntimeError
    saying how to get it, and what it is needed for, when there is none."""
    found = shutil.which("uv")
    if found:
        return [found]
    if importlib.util.find_spec("uv") is not None:
        return [sys.executable, "-m", "uv"]
    if purpose is not None:
        raise GymRuntimeError(f"{purpose} needs `uv`, which is not installed: `pip install uv`.")
    raise GymRuntimeError(
        "Building the managed Gym runtime needs `uv`: `pip install uv`, or install nemo-gym here with "
        "`pip install 'verifiers-nemo[nemogym]'`, or set "
        f"{GYM_PYTHON_ENV_VAR} to an interpreter that has nemo-gym."
    )


_SITE_PROBE = "import json, site; print(json.dumps(site.getsitepackages()))"


@functools.cache
def site_packages(runtime: GymRuntime) -> tuple[Path, ...]:
    """The runtime's site-packages directories: where nemo-gym and its dependencies are installed."""
    if runtime.site_dirs is not None:
        return runtime.site_dirs
    if Path(sys.prefix) == runtime.prefix:
        import site

        dirs = site.getsitepackages()
    else:
        try:
            out = subprocess.run(
                [str(runtime.python), "-P", "-c", _SITE_PROBE], capture_output=True, text=True, timeout=60, check=True
            ).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            raise GymRuntimeError(f"Gym interpreter {runtime.python} failed to start: {exc}") from exc
        dirs = json.loads(out.strip().splitlines()[-1])
    return tuple(Path(d) for d in dirs if Path(d).is_dir())


def _managed_runtime(build: bool, asked: str | None) -> GymRuntime:
    """The managed runtime of the release ``choose`` picks (the newest this machine runs, or the one asked)."""
    chosen, base, version = releases.choose(asked)
    venv = cache_dir() / "gym-runtime" / chosen.folder(version)
    python = venv / "bin" / "python"
    marker = venv / MANAGED_MARKER
    if marker.exists():
        return _runtime_from_probe(python, _probe(python))
    if not build:
        raise GymRuntimeError(f"No Gym runtime: nemo-gym is not importable here and {venv} is not built.")
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it right now
        if not marker.exists():
            uv = find_uv()
            env = dict(os.environ, UV_PYTHON_DOWNLOADS="never") | network_off_env()
            offline = offline_folder()
            if offline is not None:
                offline.check_platform(*python_target(base))
            logger.info("Building the Gym runtime (%s on Python %s) in %s, once", chosen.requirement, base, venv)
            try:
                subprocess.run([*uv, "venv", "-q", "--clear", "-p", str(base), str(venv)], env=env, check=True)
                subprocess.run(
                    [
                        *uv,
                        "pip",
                        "install",
                        "-q",
                        "-p",
                        str(python),
                        "--compile-bytecode",
                        *offline_uv_args(offline),
                        chosen.requirement,
                    ],
                    env=env,
                    check=True,
                )
            except subprocess.CalledProcessError as exc:
                shutil.rmtree(venv, ignore_errors=True)
                where = f"; a package is not in the offline folder: {offline.gather_hint()}" if offline else ""
                raise GymRuntimeError(
                    f"Building the Gym runtime in {venv} failed ({exc}); see the output above{where}. "
                    f"You can instead install nemo-gym yourself and set {GYM_PYTHON_ENV_VAR}."
                ) from exc
            marker.write_text(chosen.requirement + "\n")
    return _runtime_from_probe(python, _probe(python))


@functools.cache
def _resolve(explicit: str | None, build: bool, asked: str | None, series: str | None = None) -> GymRuntime:
    """The runtime of the documented order; ``series``: a ``gym_version`` argument, which a named interpreter must
    match and for which this interpreter's nemo-gym of another series does not count."""
    if explicit:
        # Absolute (servers run in other directories) but not resolved: a venv's link keeps its venv.
        python = Path(os.path.abspath(Path(explicit).expanduser()))
        info = _probe(python)
        if not info["origin"]:
            raise GymRuntimeError(
                f"{python} has no nemo-gym. Install it there (`{python} -m pip install "
                f"'{NEMO_GYM_REQUIREMENT}'`) or unset {GYM_PYTHON_ENV_VAR}."
            )
        runtime = _runtime_from_probe(python, info)
        if series and releases.series_of(runtime.nemo_gym_version) != releases.release(series).series:
            raise GymRuntimeError(
                f"gym_version {series!r} was asked for, and the Gym interpreter named ({python}: gym_python or "
                f"{GYM_PYTHON_ENV_VAR}) has nemo-gym {runtime.nemo_gym_version}: name one of the two."
            )
        return runtime
    current = _current_runtime()
    if current is not None and (
        not series or releases.series_of(current.nemo_gym_version) == releases.release(series).series
    ):
        return current  # this interpreter's nemo-gym, unless another series was asked for: then a managed one
    return _managed_runtime(build, asked)


def find_gym_runtime(
    gym_python: str | os.PathLike[str] | None = None, *, build: bool = True, gym_version: str | None = None
) -> GymRuntime:
    """The Gym runtime to launch servers with (see the module docstring for the order). ``gym_version``
    (else ``VERIFIERS_NEMO_GYM_VERSION``) picks the nemo-gym series of a managed runtime."""
    asked = gym_version or os.environ.get(releases.GYM_VERSION_ENV_VAR) or None
    explicit = str(gym_python) if gym_python else os.environ.get(GYM_PYTHON_ENV_VAR) or None  # read now, each call
    return _resolve(explicit, build, asked, gym_version)


def gym_root(gym_python: str | os.PathLike[str] | None = None, gym_version: str | None = None) -> Path:
    """The directory where the runtime's packaged environments live."""
    return find_gym_runtime(gym_python, gym_version=gym_version).root
