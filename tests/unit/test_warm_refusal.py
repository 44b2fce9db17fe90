"""Which launcher requests a fork of the warm parent may serve: an interpreter of another venv on the same Python
(an environment derived from the runtime, for a server's extra packages) is served when nothing on its path
would be imported otherwise, or run otherwise, than in the warm parent; anything else starts the plain way."""

from __future__ import annotations

import json
import subprocess
import sys
import venv
from pathlib import Path
from typing import Any

import pytest

from verifiers_nemo._gym_side import warm_child

WARM_CHILD = Path(warm_child.__file__)


def interpreter_of(python: Path, *flags: str) -> list[Any]:
    """``warm_child.interpreter()`` as ``python`` (with ``flags``) computes it."""
    code = (
        "import importlib.util, json, sys\n"
        f"spec = importlib.util.spec_from_file_location('warm_child', {str(WARM_CHILD)!r})\n"
        "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)\n"
        "print(json.dumps(module.interpreter()))"
    )
    out = subprocess.run([str(python), *flags, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def derived(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv on this interpreter's Python, as a derived environment is (no pip: nothing installed)."""
    folder = tmp_path_factory.mktemp("derived") / "venv"
    venv.create(folder, with_pip=False, symlinks=True)  # as uv makes them: bin/python links the base binary
    return folder


def site_folder(prefix: Path) -> Path:
    [folder] = prefix.glob("lib/python3*/site-packages")
    return folder


def preload(**extra: Any) -> dict[str, Any]:
    """What a warm parent of this venv's interpreter records, with nothing of the environment read."""
    return {
        "interpreter": interpreter_of(Path(sys.executable)),
        "env_before": {},
        "env_after": {},
        "native_env": {},
        "env_read": [],
        "path": list(sys.path),
        "top_levels": [],
        "origins": {},
        **extra,
    }


def request(interpreter: list[Any], path: list[str], cwd: Path) -> dict[str, Any]:
    (cwd / "app.py").write_text("")
    return {"interpreter": interpreter, "env": {}, "fds": [0, 1, 2], "cwd": str(cwd), "argv": ["app.py"], "path": path}


def install(folder: Path, name: str, source: str, version: str = "1.0") -> None:
    """A one-module wheel's files, as an installer leaves them: the module and its record (with hashes)."""
    import base64
    import hashlib

    (folder / f"{name}.py").write_text(source)
    digest = base64.urlsafe_b64encode(hashlib.sha256(source.encode()).digest()).rstrip(b"=").decode()
    info = folder / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "RECORD").write_text(f"{name}.py,sha256={digest},{len(source)}\n{info.name}/RECORD,,\n")


def test_an_interpreter_of_another_venv_on_the_same_python_is_served(derived: Path, tmp_path: Path) -> None:
    theirs = interpreter_of(derived / "bin" / "python")
    assert theirs[1] == str(derived) != sys.prefix
    assert warm_child.refusal(request(theirs, [str(site_folder(derived)), *sys.path], tmp_path), preload()) is None


def test_other_interpreter_flags_are_refused(derived: Path, tmp_path: Path) -> None:
    theirs = interpreter_of(derived / "bin" / "python", "-O")
    reason = warm_child.refusal(request(theirs, list(sys.path), tmp_path), preload())
    assert reason == "it runs another interpreter or other interpreter flags than the warm parent"


def test_a_folder_not_a_venv_claiming_another_prefix_is_refused(tmp_path: Path) -> None:
    theirs = interpreter_of(Path(sys.executable))
    theirs[1] = theirs[2] = str(tmp_path)  # no pyvenv.cfg there
    assert warm_child.refusal(request(theirs, list(sys.path), tmp_path), preload()) is not None


def test_a_pth_file_that_runs_code_at_start_is_refused(derived: Path, tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    site.mkdir()
    (site / "hook.pth").write_text("import os; os.environ.setdefault('HOOKED', '1')\n")
    (site / warm_child.RUNTIME_PTH).write_text("import site; site.addsitedir('/elsewhere')\n")  # ours: allowed
    theirs = interpreter_of(derived / "bin" / "python")
    reason = warm_child.refusal(request(theirs, [str(site), *sys.path], tmp_path), preload())
    assert reason == f"{site / 'hook.pth'} runs code when the interpreter starts"


def test_a_byte_identical_copy_of_a_preloaded_module_is_served_and_another_version_is_not(
    derived: Path, tmp_path: Path
) -> None:
    runtime_site, copy_site, other_site = (tmp_path / name for name in ("runtime", "copy", "other"))
    for folder in (runtime_site, copy_site, other_site):
        folder.mkdir()
    install(runtime_site, "shared_dep", "VALUE = 1\n")
    install(copy_site, "shared_dep", "VALUE = 1\n")  # the same wheel, installed again into the derived venv
    install(other_site, "shared_dep", "VALUE = 2\n", version="2.0")
    recorded = preload(top_levels=["shared_dep"], origins={"shared_dep": str(runtime_site)})
    recorded["path"] = [*recorded["path"], str(runtime_site)]
    theirs = interpreter_of(derived / "bin" / "python")
    assert warm_child.refusal(request(theirs, [str(copy_site), *recorded["path"]], tmp_path), recorded) is None
    reason = warm_child.refusal(request(theirs, [str(other_site), *recorded["path"]], tmp_path), recorded)
    assert reason == f"{other_site / 'shared_dep.py'} would be imported instead of the preloaded shared_dep.py"


def test_a_server_started_the_plain_way_is_said_once_in_the_run_s_output_naming_it_and_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from verifiers_nemo._gym_side.warm_supervisor import SERVER_STARTS_PLAIN
    from verifiers_nemo._stack.warm_parent import say_plain_servers

    why = f"{tmp_path}/site-packages/regex would be imported instead of the preloaded regex"
    line = SERVER_STARTS_PLAIN.format(server="mcqa/app.py", reason=why)
    log = tmp_path / "stack.log"
    log.write_text(f"(mcqa) starting\n[verifiers_nemo] {line}\n(mcqa) {line}\n[verifiers_nemo] {line}\n")
    with caplog.at_level("WARNING", logger="verifiers_nemo"):
        say_plain_servers("mcqa", log)
        say_plain_servers("mcqa", log)  # a restart of the same stack: said already
        say_plain_servers("mcqa", tmp_path / "gone.log")  # a log already removed: nothing to say
    said = [r.getMessage() for r in caplog.records if "plain way" in r.getMessage()]
    assert said == [
        f"Gym stack mcqa: mcqa/app.py starts the plain way (no warm start; it runs the same, its start is slower): "
        f"{why}"
    ]
