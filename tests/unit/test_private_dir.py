"""The user's folder for the machine's shared Gym helpers (``_stack/private_dir.py``): used only when it is a real
folder of this user's alone, under folders no one else may change; refused in one line when named, else avoided.

Another user's folder is made here with ``chown`` (the suite runs as root, as CI does); the tests that run a second
user's processes are in ``tests/faults/test_shared_machine.py``."""

from __future__ import annotations

import logging
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from verifiers_nemo._exceptions import StackStartError
from verifiers_nemo._stack.private_dir import RAY_DIR_ENV_VAR, XDG_SUBFOLDER, private_root
from verifiers_nemo._stack.ray_head import ray_dir

NOBODY = 65534
needs_root = pytest.mark.skipif(os.getuid() != 0, reason="making another user's folder needs root (CI runs as root)")


@pytest.fixture
def tmp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A temporary folder as ``/tmp`` is (root's, 1777): the place the default folder is made in."""
    folder = Path(tempfile.mkdtemp(prefix="vnr-pd-"))
    folder.chmod(0o1777)
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    monkeypatch.delenv(RAY_DIR_ENV_VAR, raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    yield folder
    import shutil

    shutil.rmtree(folder, ignore_errors=True)


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_the_default_folder_is_made_private_to_the_user(tmp: Path) -> None:
    folder = ray_dir()
    assert folder == tmp / f"vnr-ray-{os.getuid()}"
    assert (_mode(folder), folder.stat().st_uid) == (0o700, os.getuid())
    assert ray_dir() == folder  # found again as it is


def test_a_folder_of_ours_that_others_may_only_read_is_tightened(tmp: Path) -> None:
    folder = tmp / f"vnr-ray-{os.getuid()}"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)  # what mkdir(parents=True) of a subfolder made before
    assert ray_dir() == folder
    assert _mode(folder) == 0o700


@needs_root
def test_a_default_folder_made_by_another_user_is_never_used(tmp: Path, caplog: pytest.LogCaptureFixture) -> None:
    squatted = tmp / f"vnr-ray-{os.getuid()}"
    squatted.mkdir(mode=0o777)
    squatted.chmod(0o777)
    os.chown(squatted, NOBODY, NOBODY)
    caplog.set_level(logging.WARNING, logger="verifiers_nemo")
    folder = ray_dir()
    assert folder != squatted and folder.parent == tmp
    assert (_mode(folder), folder.stat().st_uid) == (0o700, os.getuid())
    assert ray_dir() == folder  # one private folder per process
    assert list(squatted.iterdir()) == []
    said = [r.getMessage() for r in caplog.records]
    assert any(f"{squatted} is not safe to use: it belongs to uid {NOBODY}" in line for line in said), said
    assert any(f"keeps its Ray head and warm parent in {folder}" in line for line in said), said


@pytest.mark.parametrize("kind", ["another user's", "a link", "open to all", "under an open folder"])
def test_a_named_folder_that_fails_a_check_is_refused_in_one_line(
    tmp: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    if kind == "another user's" and os.getuid() != 0:
        pytest.skip("making another user's folder needs root (CI runs as root)")
    mine = tmp / "mine"
    mine.mkdir(mode=0o700)
    named = tmp / "named"
    why = {
        "another user's": f"it belongs to uid {NOBODY}, not to you",
        "a link": "it is a symbolic link",
        "open to all": "others may write in it (mode 777)",
        "under an open folder": f"others may write in the folder above it, {tmp / 'open'}",
    }[kind]
    if kind == "another user's":
        named.mkdir(mode=0o700)
        os.chown(named, NOBODY, NOBODY)
    elif kind == "a link":
        named.symlink_to(mine)
    elif kind == "open to all":
        named.mkdir()
        named.chmod(0o777)
    else:
        (tmp / "open").mkdir()
        (tmp / "open").chmod(0o777)
        named = tmp / "open" / "named"
        named.mkdir(mode=0o700)
    monkeypatch.setenv(RAY_DIR_ENV_VAR, str(named))
    with pytest.raises(StackStartError) as caught:
        ray_dir()
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"The folder for the shared Gym helpers {named} is not safe to use: {why}")
    assert message.endswith(f"remove it, or set {RAY_DIR_ENV_VAR} to a folder of your own.")
    assert list(mine.iterdir()) == []


def test_a_named_folder_is_made_with_its_missing_parents_private(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    named = tmp / "a" / "b"
    monkeypatch.setenv(RAY_DIR_ENV_VAR, str(named))
    assert ray_dir() == named
    assert _mode(tmp / "a") == _mode(named) == 0o700


def test_xdg_runtime_dir_is_used_when_it_is_private(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = tmp / "run-user"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert private_root() == runtime / XDG_SUBFOLDER
    assert _mode(runtime / XDG_SUBFOLDER) == 0o700


def test_an_xdg_runtime_dir_open_to_others_is_not_used(
    tmp: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    runtime = tmp / "run-user"
    runtime.mkdir()
    runtime.chmod(0o755)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    caplog.set_level(logging.WARNING, logger="verifiers_nemo")
    assert private_root() == tmp / f"vnr-ray-{os.getuid()}"
    assert not (runtime / XDG_SUBFOLDER).exists() and _mode(runtime) == 0o755
    assert any("XDG_RUNTIME_DIR is not used" in r.getMessage() for r in caplog.records)
