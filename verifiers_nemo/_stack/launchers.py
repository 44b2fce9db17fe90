"""The launcher venv of a Gym runtime: what a warm stack links as each server's venv (``+uv_venv_dir``).

nemo-gym skips building a server's venv when ``VENV/bin/python`` and ``VENV/bin/activate`` exist
(``+skip_venv_if_present``), then runs ``source VENV/bin/activate && python app.py`` (0.7:
``VENV/bin/python app.py``). A launcher venv has exactly those two files and nothing else Gym looks at:

- ``bin/activate`` sources the runtime's own ``activate`` (so the server's environment is what linking the
  runtime itself gives: ``VIRTUAL_ENV``, ``PATH``, prompt) and then puts ``bin/`` first on ``PATH``, for
  0.4's bare ``python``; the launcher removes that entry again before the server starts;
- ``bin/python`` is ``_gym_side/launcher.py`` with the runtime's interpreter as its ``#!`` line, and ``lib/``
  holds the two Gym-side modules it loads (``wire``, ``warm_child``).

A server whose extra requirements live in an environment derived from the runtime (``_gym/derived_env.py``: a
venv on the same Python whose ``.pth`` adds the runtime's site-packages) gets a launcher venv of that environment:
its ``activate`` sources the derived venv's, and its ``bin/python`` runs with the derived venv's interpreter, so the
request carries that venv's prefix and ``sys.path``; the warm parent serves it when only the venv differs
(``warm_child.refusal``) and the plain fallback is the derived venv's own interpreter.

One per runtime (or derived venv) and launcher version, in ``cache_dir()/warm-launchers/<digest>``, written once
(to a temporary folder renamed into place, so concurrent processes never see half of one). Nothing here is a seam
of nemo-gym's code: only its ``+uv_venv_dir`` / ``+skip_venv_if_present`` options and the venv layout it checks for.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import shlex
import shutil
from pathlib import Path

from .._gym import GymRuntime, cache_dir
from .supervisor import GYM_SIDE

_LIB = ("wire", "warm_child")
_SHEBANG_MAX = 255


def launcher_sources() -> dict[str, bytes]:
    """The files of a launcher venv other than ``bin/activate`` (their bytes), by relative path."""
    files = {f"lib/{name}.py": (GYM_SIDE / f"{name}.py").read_bytes() for name in _LIB}
    files["bin/python"] = (GYM_SIDE / "launcher.py").read_bytes()
    return files


def launcher_unusable(runtime: GymRuntime, venv: Path | None = None) -> str | None:
    """Why a launcher venv cannot stand for ``runtime``'s venv (or for ``venv``, derived from it), or None."""
    prefix, python = _target(runtime, venv)
    if not (prefix / "bin" / "activate").is_file():
        return f"{prefix} has no bin/activate (not a venv)"
    shebang = f"#!{python}"
    if len(shebang.encode()) > _SHEBANG_MAX or any(c.isspace() for c in str(python)):
        return f"the Gym interpreter's path {python} cannot be a #! line"
    return None


def launcher_venv(runtime: GymRuntime, venv: Path | None = None) -> Path:
    """The launcher venv for ``runtime`` (or for ``venv``, an environment derived from it; see the module
    docstring), written if it does not exist yet."""
    prefix, python = _target(runtime, venv)
    sources = launcher_sources()
    activate = _activate(prefix)
    digest = hashlib.sha256(str(python).encode() + activate)
    for name in sorted(sources):
        digest.update(name.encode() + sources[name])
    venv = cache_dir() / "warm-launchers" / digest.hexdigest()[:16]
    if (venv / "bin" / "python").is_file():
        return venv
    venv.parent.mkdir(parents=True, exist_ok=True)
    tmp = venv.with_name(f".{venv.name}.tmp-{secrets.token_hex(4)}")
    try:
        (tmp / "bin").mkdir(parents=True)
        (tmp / "lib").mkdir()
        (tmp / "bin" / "activate").write_bytes(activate)
        for name, data in sources.items():
            if name == "bin/python":
                data = f"#!{python}\n".encode() + data
            (tmp / name).write_bytes(data)
        (tmp / "bin" / "python").chmod(0o755)
        with contextlib.suppress(OSError):  # another process put the same one there first
            os.rename(tmp, venv)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return venv


def _target(runtime: GymRuntime, venv: Path | None) -> tuple[Path, Path]:
    """The venv a launcher venv stands for, and the interpreter it runs the launcher with."""
    if venv is None or venv == runtime.prefix:
        return runtime.prefix, runtime.python
    return venv, venv / "bin" / "python"


def _activate(prefix: Path) -> bytes:
    own = prefix / "bin" / "activate"
    return (
        "# verifiers_nemo's launcher venv (see verifiers_nemo/_stack/launchers.py): the Gym server venv's own\n"
        "# activate, then the launcher first on PATH for a bare `python` (it takes itself off PATH again).\n"
        f"source {shlex.quote(str(own))}\n"
        'PATH="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)":"$PATH"\n'
        "export PATH\n"
        "hash -r 2>/dev/null || true\n"
    ).encode()
