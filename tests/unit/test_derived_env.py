"""Environments derived from the Gym runtime: cache key, one build shared through a lock, clear failures."""

from __future__ import annotations

import dataclasses
import fcntl
import logging
import pickle
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from verifiers_nemo import GymRuntimeError, MissingRequirementsError
from verifiers_nemo._gym import ServerInstance, derived_env
from verifiers_nemo._gym.runtime import GymRuntime, find_gym_runtime
from verifiers_nemo._stack import requirements

NO_SUCH_PACKAGE = "vn-no-such-package-zz9"


@pytest.fixture
def fake_runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> GymRuntime:
    """A runtime whose site-packages is a folder of the test's (for keys; nothing is run with it)."""
    site = tmp_path / "site-packages"
    (site / "nemo_gym-0.4.0.dist-info").mkdir(parents=True)
    monkeypatch.setenv("VERIFIERS_NEMO_CACHE_DIR", str(tmp_path / "cache"))
    return GymRuntime(
        python=tmp_path / "bin" / "python", prefix=tmp_path, root=tmp_path, nemo_gym_version="0.4.0", site_dirs=(site,)
    )


@pytest.fixture
def real_runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> GymRuntime:
    if shutil.which("uv") is None:
        pytest.skip("uv is not installed")
    try:
        runtime = find_gym_runtime(build=False)
    except GymRuntimeError:
        pytest.skip("no Gym runtime here")
    monkeypatch.setenv("VERIFIERS_NEMO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("UV_OFFLINE", "1")  # resolution fails fast, from the cache, never the network
    return runtime


# ---- the cache key


def test_key_ignores_order_whitespace_and_repeats(fake_runtime: GymRuntime) -> None:
    key = derived_env.derived_env_key(["tiktoken", "numpy >=1.26"], fake_runtime)

    assert derived_env.derived_env_key(["numpy  >=1.26", "", "tiktoken", "tiktoken"], fake_runtime) == key
    assert derived_env.derived_env_key(["tiktoken"], fake_runtime) != key
    assert derived_env.derived_env_key(["tiktoken", "numpy>=1.27"], fake_runtime) != key


def test_key_changes_when_the_runtime_installs_or_upgrades_a_package(fake_runtime: GymRuntime) -> None:
    site = derived_env.site_packages(fake_runtime)[0]
    before = derived_env.derived_env_key(["tiktoken"], fake_runtime)

    (site / "numpy-2.5.5.dist-info").mkdir()
    installed = derived_env.derived_env_key(["tiktoken"], fake_runtime)
    (site / "numpy-2.5.5.dist-info").rename(site / "numpy-2.6.0.dist-info")
    upgraded = derived_env.derived_env_key(["tiktoken"], fake_runtime)

    assert len({before, installed, upgraded}) == 3


def test_key_of_a_relative_path_requirement_depends_on_its_folder(fake_runtime: GymRuntime, tmp_path: Path) -> None:
    a = derived_env.derived_env_key(["./vendor/pkg"], fake_runtime, tmp_path / "a")
    b = derived_env.derived_env_key(["./vendor/pkg"], fake_runtime, tmp_path / "b")

    assert a != b
    assert derived_env.derived_env_key(["tiktoken"], fake_runtime, tmp_path / "a") == derived_env.derived_env_key(
        ["tiktoken"], fake_runtime, tmp_path / "b"
    )


def test_env_lives_in_the_cache_under_its_key_and_is_not_ready_until_built(fake_runtime: GymRuntime) -> None:
    env = derived_env.derived_env(fake_runtime, ["tiktoken"])

    assert env.path.parent == derived_env.derived_envs_dir()
    assert env.path.name == derived_env.derived_env_key(["tiktoken"], fake_runtime)
    assert env.lock_path.parent == env.path.parent
    assert not env.ready


# ---- one build, shared


def test_a_ready_env_is_reused_without_building(fake_runtime: GymRuntime) -> None:
    builder = CountingBuilder()
    env = derived_env.derived_env(fake_runtime, ["tiktoken"])
    env.path.mkdir(parents=True)
    (env.path / derived_env.MARKER).write_text("{}")

    assert derived_env.ensure_derived_env(fake_runtime, ["tiktoken"], label="mcqa", build=builder) == env
    assert builder.builds == []


def test_a_half_built_env_is_built_again(fake_runtime: GymRuntime) -> None:
    builder = CountingBuilder()
    env = derived_env.derived_env(fake_runtime, ["tiktoken"])
    env.path.mkdir(parents=True)  # an interrupted build: no marker

    derived_env.ensure_derived_env(fake_runtime, ["tiktoken"], label="mcqa", build=builder)

    assert builder.builds == [env.path]


def test_a_process_waits_for_the_build_in_progress_and_reuses_it(
    fake_runtime: GymRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    builder = CountingBuilder()
    env = derived_env.derived_env(fake_runtime, ["tiktoken"])
    env.path.mkdir(parents=True)
    caplog.set_level(logging.INFO, logger=derived_env.__name__)
    with open(env.lock_path, "a") as other_builder:  # a separate open file: flock excludes it like a process
        fcntl.flock(other_builder, fcntl.LOCK_EX)
        waiter = threading.Thread(target=derived_env.ensure_derived_env, args=(fake_runtime, ["tiktoken"]),
                                  kwargs={"label": "mcqa", "build": builder})  # fmt: skip
        waiter.start()
        _wait_until(lambda: "Waiting for another process" in caplog.text, timeout=10)
        (env.path / derived_env.MARKER).write_text("{}")  # the other builder finishes
    waiter.join(timeout=10)

    assert not waiter.is_alive()
    assert builder.builds == []


# ---- failures


def test_a_requirement_that_cannot_resolve_says_which_and_why_and_leaves_nothing(real_runtime: GymRuntime) -> None:
    with pytest.raises(GymRuntimeError, match=rf"(?s){NO_SUCH_PACKAGE}.*(not found|unsatisfiable)") as caught:
        derived_env.ensure_derived_env(real_runtime, [NO_SUCH_PACKAGE], label="broken")

    assert "Using Python" not in str(caught.value)  # uv's explanation, without its chatter
    env = derived_env.derived_env(real_runtime, [NO_SUCH_PACKAGE])
    assert not env.path.exists() and not env.ready


def test_a_server_whose_requirements_cannot_install_is_named_with_the_fix(
    real_runtime: GymRuntime, tmp_path: Path
) -> None:
    root = tmp_path / "gym"
    (root / "resources_servers" / "broken").mkdir(parents=True)
    (root / "resources_servers" / "broken" / "requirements.txt").write_text(
        f"-e nemo-gym[dev] @ ../../\n{NO_SUCH_PACKAGE}\n"
    )
    runtime = GymRuntime(real_runtime.python, real_runtime.prefix, root, real_runtime.nemo_gym_version)
    server = ServerInstance("broken_server", "resources_servers", "broken", {})

    assert requirements.check_requirements("broken_env", [server], runtime) == {"broken_server"}  # not refused
    with pytest.raises(MissingRequirementsError) as caught:
        requirements.server_venvs("broken_env", [server], runtime)

    message = str(caught.value)
    assert f"broken_server: {NO_SUCH_PACKAGE}" in message
    assert "could not be installed" in message and "isolated_venvs=True" in message
    assert caught.value.reason and NO_SUCH_PACKAGE in caught.value.reason
    assert pickle.loads(pickle.dumps(caught.value)).reason == caught.value.reason


def test_without_uv_missing_requirements_are_refused_before_anything_starts(
    real_runtime: GymRuntime, tmp_path: Path
) -> None:
    def no_uv(purpose: str | None = None) -> list[str]:
        raise GymRuntimeError(f"{purpose} needs `uv`, which is not installed: `pip install uv`.")

    server_dir = tmp_path / "gym" / "resources_servers" / "needs_more"
    server_dir.mkdir(parents=True)
    (server_dir / "requirements.txt").write_text(f"{NO_SUCH_PACKAGE}\n")
    runtime = dataclasses.replace(real_runtime, root=tmp_path / "gym")  # the real interpreter, a server of ours
    server = ServerInstance("s", "resources_servers", "needs_more", {})

    with pytest.raises(MissingRequirementsError, match=rf"(?s)s: {NO_SUCH_PACKAGE}.*pip install uv"):
        requirements.check_requirements("mcqa", [server], runtime, uv=no_uv)
    assert requirements.check_requirements("mcqa", [server], runtime, isolated_venvs=True, uv=no_uv) == {"s"}


class CountingBuilder:
    """An installer that only writes the completion marker, and counts its builds."""

    def __init__(self) -> None:
        self.builds: list[Path] = []

    def __call__(self, env: derived_env.DerivedEnv, *args: object) -> None:
        self.builds.append(env.path)
        (env.path / derived_env.MARKER).write_text("{}")


def _wait_until(predicate: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)
