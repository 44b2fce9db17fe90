"""Environments derived from the Gym runtime: a server's extra requirements, installed once with uv.

A derived environment is a venv on the runtime's own Python whose site-packages holds a ``.pth`` that
adds the runtime's site-packages after its own: nemo-gym and its dependencies come from the runtime, the
server's extra packages from the derived venv (they take precedence). The runtime is never written to.

Installs are constrained so that a requirement cannot silently change what nemo-gym runs on: first to the
runtime's exact versions (the derived venv then adds packages, and copies, at those versions, of the
runtime's packages they depend on: uv does not see the runtime's); when that cannot resolve (a
requirement pins another version of a package the runtime has), to the version ranges nemo-gym and its
dependencies declare. When that cannot resolve either, the error is uv's own explanation.

One venv per requirement set and runtime state (``derived_env_key``), in ``cache_dir()/derived-envs/<key>``,
built under an ``flock`` of ``<key>.lock`` next to it and used only once its completion marker exists: a
concurrent process waits for the one build and reuses it; an interrupted build is redone.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from .._exceptions import GymRuntimeError
from .._offline import network_off_env, offline_folder
from .._offline.folder import offline_uv_args, python_target
from .runtime import GymRuntime, cache_dir, find_uv, site_packages

logger = logging.getLogger(__name__)

MARKER = ".verifiers-nemo-complete"
"""Written last: a derived env without it is half-built and never used."""
_RUNTIME_PTH = "_verifiers_nemo_gym_runtime.pth"
_UNSOLVABLE = "No solution found"

# Run by the runtime's interpreter: its exact versions (pins), and the ranges nemo-gym's dependency
# closure declares (extras and markers evaluated), as constraint lines.
_CONSTRAINTS_PROBE = r"""
import json, importlib.metadata as md
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
pins = {}
for dist in md.distributions():
    if dist.metadata["Name"]:
        pins.setdefault(canonicalize_name(dist.metadata["Name"]), dist.version)
declared, seen, todo = set(), set(), [("nemo-gym", ())]
while todo:
    name, extras = todo.pop()
    if (canonicalize_name(name), extras) in seen:
        continue
    seen.add((canonicalize_name(name), extras))
    try:
        requires = md.distribution(name).requires or []
    except md.PackageNotFoundError:
        continue
    for line in requires:
        req = Requirement(line)
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in extras or ("",)):
            continue
        if req.specifier:
            declared.add(f"{canonicalize_name(req.name)}{req.specifier}")
        todo.append((req.name, tuple(sorted(req.extras))))
print(json.dumps({"pins": sorted(f"{n}=={v}" for n, v in pins.items()), "declared": sorted(declared)}))
"""


@dataclass(frozen=True)
class DerivedEnv:
    """A venv holding one requirement set on top of the Gym runtime (see the module docstring)."""

    path: Path
    requirements: tuple[str, ...]

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    @property
    def ready(self) -> bool:
        """Built completely (its marker exists); only then is it used."""
        return (self.path / MARKER).is_file()

    @property
    def lock_path(self) -> Path:
        return self.path.with_name(self.path.name + ".lock")


Builder = Callable[["DerivedEnv", GymRuntime, str, "Path | None"], None]
"""``build(env, runtime, label, base)``: installs ``env`` and writes its completion marker."""


def derived_envs_dir() -> Path:
    """Where derived environments are cached."""
    return cache_dir() / "derived-envs"


def normalize_requirements(lines: Iterable[str]) -> tuple[str, ...]:
    """Requirement lines as the cache key sees them: whitespace collapsed, blank lines and repeats
    dropped, sorted (the order of a requirements file does not change what is installed)."""
    return tuple(sorted({" ".join(line.split()) for line in lines if line.strip()}))


def runtime_state(runtime: GymRuntime) -> str:
    """A digest of what is installed in the runtime (its distributions' metadata folders carry their
    versions): installing into or upgrading the runtime gives its derived environments new keys."""
    names = sorted(
        f"{directory}/{entry}"
        for directory in site_packages(runtime)
        for entry in os.listdir(directory)
        if entry.endswith((".dist-info", ".egg-info", ".pth"))
    )
    return hashlib.sha256("\n".join(names).encode()).hexdigest()[:16]


def derived_env_key(requirements: Iterable[str], runtime: GymRuntime, base: Path | None = None) -> str:
    """The cache key of a requirement set on a runtime: its normalized lines, the runtime's interpreter
    and installed state, and ``base`` (the folder relative requirement paths are read from) when a line
    is a relative path."""
    lines = normalize_requirements(requirements)
    material = {"requirements": lines, "python": str(runtime.python), "runtime": runtime_state(runtime)}
    if base is not None and any(line.startswith(".") for line in lines):
        material["base"] = str(base)
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:16]


def derived_env(runtime: GymRuntime, requirements: Iterable[str], *, base: Path | None = None) -> DerivedEnv:
    """Where the derived environment of ``requirements`` is (built or not); builds nothing."""
    lines = normalize_requirements(requirements)
    return DerivedEnv(derived_envs_dir() / derived_env_key(lines, runtime, base), lines)


def ensure_derived_env(
    runtime: GymRuntime,
    requirements: Iterable[str],
    *,
    label: str,
    base: Path | None = None,
    build: Builder | None = None,
) -> DerivedEnv:
    """The derived environment of ``requirements``, installed now unless cached (blocking; a process
    building it already is waited for). Raises GymRuntimeError with uv's explanation when the
    requirements cannot be installed. ``label`` names what needs them in messages. ``build`` replaces the
    installer (``install_derived_env``: uv), e.g. with one that only writes the completion marker."""
    env = derived_env(runtime, requirements, base=base)
    if env.ready:
        return env
    env.path.parent.mkdir(parents=True, exist_ok=True)
    with open(env.lock_path, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info("Waiting for another process installing the requirements of %s ...", label)
            fcntl.flock(lock, fcntl.LOCK_EX)
        if not env.ready:  # nobody built it while we waited
            (build or install_derived_env)(env, runtime, label, base)
    return env


def install_derived_env(env: DerivedEnv, runtime: GymRuntime, label: str, base: Path | None) -> None:
    """Build ``env`` with uv: a venv whose ``.pth`` adds the runtime's site-packages, the requirements
    installed into it pinned to the runtime's versions, then the completion marker."""
    uv = find_uv(f"Installing the requirements of {label}")
    offline = offline_folder()
    if offline is not None:
        offline.check_platform(*python_target(runtime.python))
    count = len(env.requirements)
    logger.info("Installing %d requirement%s for %s (first run only)…", count, "" if count == 1 else "s", label)
    started = time.monotonic()
    shutil.rmtree(env.path, ignore_errors=True)  # what an interrupted build left
    try:
        _run([*uv, "venv", "-q", "--clear", "--python", str(runtime.python), str(env.path)], "create a venv")
        meta = env.path / ".verifiers-nemo"
        meta.mkdir()
        (meta / "requirements.txt").write_text("".join(f"{line}\n" for line in env.requirements))
        constraints = _constraints(runtime)
        for kind, lines in constraints.items():
            (meta / f"{kind}.txt").write_text("".join(f"{line}\n" for line in lines))
        _purelib(env).joinpath(_RUNTIME_PTH).write_text(
            "".join(f"import site; site.addsitedir({str(d)!r})\n" for d in site_packages(runtime))
        )
        used = _install(uv, env, meta, label, base)
        seconds = time.monotonic() - started
        marker = {"requirements": list(env.requirements), "runtime": str(runtime.python)}
        marker |= {"constraints": used, "seconds": round(seconds, 2)}
        tmp = env.path / f"{MARKER}.tmp"
        tmp.write_text(json.dumps(marker) + "\n")
        os.replace(tmp, env.path / MARKER)
    except BaseException:
        shutil.rmtree(env.path, ignore_errors=True)
        raise
    logger.info("Installed the requirements of %s in %.1fs (in %s)", label, seconds, env.path)


def install_problem(runtime: GymRuntime, requirements: Iterable[str], base: Path | None = None) -> str | None:
    """Why the derived environment of ``requirements`` could not be installed here now (uv's reason, e.g. a
    package missing from the offline folder), or None when it could: the same install, dry-run, into a
    throwaway venv. Installs nothing."""
    uv = find_uv("Checking the requirements of an environment")
    lines = normalize_requirements(requirements)
    with tempfile.TemporaryDirectory(prefix="verifiers-nemo-check-") as tmp:
        env = DerivedEnv(Path(tmp) / "env", lines)
        try:
            _run([*uv, "venv", "-q", "--python", str(runtime.python), str(env.path)], "create a venv")
            meta = env.path / ".verifiers-nemo"
            meta.mkdir()
            (meta / "requirements.txt").write_text("".join(f"{line}\n" for line in lines))
            for kind, pinned in _constraints(runtime).items():
                (meta / f"{kind}.txt").write_text("".join(f"{line}\n" for line in pinned))
            _purelib(env).joinpath(_RUNTIME_PTH).write_text(
                "".join(f"import site; site.addsitedir({str(d)!r})\n" for d in site_packages(runtime))
            )
            _install(uv, env, meta, "a check", base, dry_run=True)
        except GymRuntimeError as exc:
            return str(exc)
    return None


def _install(
    uv: list[str], env: DerivedEnv, meta: Path, label: str, base: Path | None, *, dry_run: bool = False
) -> str:
    """Install the requirements pinned to the runtime's versions, else within nemo-gym's declared ranges;
    returns which constraints it took."""
    offline = offline_folder()
    install = [*uv, "pip", "install", "--python", str(env.python), "--compile-bytecode", *offline_uv_args(offline)]
    install += ["--dry-run"] if dry_run else []
    install += ["-r", str(meta / "requirements.txt")]
    result = _uv([*install, "-c", str(meta / "pins.txt")], base)
    if result.returncode == 0:
        return "pins"
    if _UNSOLVABLE in result.stderr:  # e.g. a requirement pins another version of a package the runtime has
        logger.debug("%s: not installable at the Gym runtime's versions: %s", label, _uv_message(result.stderr))
        result = _uv([*install, "-c", str(meta / "declared.txt")], base)
        if result.returncode == 0:
            logger.info(
                "The requirements of %s needed versions other than the Gym runtime's; installed them within "
                "the ranges nemo-gym declares",
                label,
            )
            return "declared"
    said = _uv_message(result.stderr) or f"uv exited with status {result.returncode}"
    if offline is not None and not dry_run:
        said = f"{said}\nA package is not in the offline folder {offline.wheels}."
    raise GymRuntimeError(said)


def _uv_env() -> dict[str, str]:
    env = dict(os.environ, UV_PYTHON_DOWNLOADS="never") | network_off_env()
    env.pop("VIRTUAL_ENV", None)
    return env


def _uv(argv: list[str], cwd: Path | None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, env=_uv_env(), cwd=cwd)


def _run(argv: list[str], what: str) -> str:
    result = _uv(argv, None)
    if result.returncode != 0:
        raise GymRuntimeError(f"Could not {what} ({' '.join(argv)}): {_uv_message(result.stderr)}")
    return result.stdout


def _uv_message(stderr: str) -> str:
    """uv's explanation, without its progress chatter."""
    lines = [
        line.removeprefix("error: ") for line in stderr.strip().splitlines() if not line.startswith("Using Python ")
    ]
    return "\n".join(lines[-40:]).strip()


def _constraints(runtime: GymRuntime) -> dict[str, list[str]]:
    result = subprocess.run(
        [str(runtime.python), "-P", "-c", _CONSTRAINTS_PROBE], capture_output=True, text=True, timeout=120
    )
    if result.returncode != 0:
        raise GymRuntimeError(f"Could not read the versions installed in {runtime.python}: {result.stderr.strip()}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def _purelib(env: DerivedEnv) -> Path:
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    out = _run([str(env.python), "-P", "-c", code], "read a venv")
    return Path(out.strip())
