"""Which nemo-gym release a managed Gym runtime is built with, and on which interpreter."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from verifiers_nemo import ConfigurationError, GymRuntimeError
from verifiers_nemo._gym import find_gym_runtime, releases


def fake_pythons(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *versions: str) -> dict[str, Path]:
    """pyenv-style interpreters that only answer ``--version`` (nothing else on PATH)."""
    made = {}
    for version in versions:
        python = tmp_path / "pyenv" / "versions" / version / "bin" / "python3"
        python.parent.mkdir(parents=True)
        python.write_text(f'#!/bin/sh\necho "Python {version}"\n')
        python.chmod(0o755)
        made[version] = python
    (tmp_path / "empty-bin").mkdir()
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "pyenv"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    monkeypatch.delenv(releases.GYM_VERSION_ENV_VAR, raising=False)
    return made


def test_the_newest_release_an_interpreter_here_can_run_is_chosen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pythons = fake_pythons(tmp_path, monkeypatch, "3.13.20", "3.12.5")
    chosen, python, version = releases.choose()
    assert (chosen.series, python, version) == ("0.7", pythons["3.13.20"], (3, 13, 20))
    assert chosen.folder(version) == "nemo-gym-0.7-py313"


def test_without_python_3_13_14_the_runtime_is_nemo_gym_0_4_on_3_12(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pythons = fake_pythons(tmp_path, monkeypatch, "3.13.0", "3.12.5")
    chosen, python, _ = releases.choose()
    assert chosen.series == "0.4" and python in (pythons["3.12.5"], *_this_if_312())
    with pytest.raises(GymRuntimeError, match=r"nemo-gym 0\.7 needs Python 3\.13\.14 or newer"):
        releases.choose("0.7")


def test_the_series_asked_for_wins_over_the_newest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_pythons(tmp_path, monkeypatch, "3.13.20", "3.12.5")
    monkeypatch.setenv(releases.GYM_VERSION_ENV_VAR, "0.4.0")
    assert releases.choose()[0].series == "0.4"
    assert releases.choose("0.7")[0].series == "0.7"  # an explicit argument beats the variable


def test_an_unknown_series_names_the_ones_there_are() -> None:
    with pytest.raises(ConfigurationError, match=r"pick one of 0\.7, 0\.4"):
        releases.release("0.5")


def _this_if_312() -> tuple[Path, ...]:
    import sys

    return (Path(sys.executable),) if sys.version_info[:2] == (3, 12) else ()


def test_a_relative_gym_python_is_made_absolute_and_keeps_its_venv(monkeypatch: pytest.MonkeyPatch) -> None:
    """Servers start in other directories: ``gym_python=".venv/bin/python"`` must still name this venv."""
    venv_python = Path(sys.prefix) / "bin" / "python"
    monkeypatch.chdir(venv_python.parents[2])
    runtime = find_gym_runtime(os.path.relpath(venv_python))
    assert runtime.python == venv_python
    assert runtime.prefix == Path(sys.prefix)


GYM_SCRIPT = "#!/rt/bin/python\nimport sys\nfrom nemo_gym.cli.main import main\nsys.exit(main())\n"


@pytest.mark.parametrize(
    ("gym", "command"),
    [
        (GYM_SCRIPT, ["bin/gym", "env", "start"]),  # nemo-gym's own (0.4.0, 0.7.0): its `ng_run` is a deprecated alias
        (None, ["bin/ng_run"]),  # a runtime without it
        ("#!/bin/sh\nexec other-gym\n", ["bin/ng_run"]),  # a `gym` of some other package
    ],
    ids=["gym-env-start", "no-gym", "another-gym"],
)
def test_a_stack_starts_with_gym_env_start_where_the_runtime_has_it_else_ng_run(
    tmp_path: Path, gym: str | None, command: list[str]
) -> None:
    from verifiers_nemo._gym.runtime import GymRuntime

    (tmp_path / "bin").mkdir()
    scripts = {"python": "", "ng_run": GYM_SCRIPT.replace("main import", "legacy import"), "gym": gym}
    for name, text in scripts.items():
        if text is not None:
            (tmp_path / "bin" / name).write_text(text)
    runtime = GymRuntime(python=tmp_path / "bin" / "python", prefix=tmp_path, root=tmp_path, nemo_gym_version="0.4.0")

    assert runtime.start_command == [str(tmp_path / command[0]), *command[1:]]


def test_a_project_folder_with_files_named_like_standard_modules_does_not_break_the_runtime_probes(
    tmp_path: Path,
) -> None:
    """A user's project holds a json.py, a sysconfig.py: the probes of the Gym runtime, run from that folder, still
    read the runtime (its interpreter does not put the working directory first on its path)."""
    import json as json_module
    import os
    import subprocess
    import sys

    for name in ("json", "sysconfig", "importlib"):
        (tmp_path / f"{name}.py").write_text(f"raise SystemExit('the project folder shadowed {name}')\n")
    cli = str(Path(sys.executable).with_name("verifiers-nemo"))
    gym07 = Path(__file__).resolve().parents[2] / ".venv-gym07" / "bin" / "python"  # a runtime apart: probed
    env = {**os.environ, "VERIFIERS_NEMO_CACHE_DIR": str(tmp_path / "cache"), "VERIFIERS_NEMO_GYM_PYTHON": str(gym07)}
    done = subprocess.run([cli, "envs", "mcqa", "--json"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    (row,) = [r for r in json_module.loads(done.stdout) if r["name"] == "mcqa"]
    assert row["extra_deps_state"] == "to install"  # the runtime's packages were read: tiktoken is not among them


def test_a_gym_version_asked_for_is_never_silently_another_release(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """This interpreter has nemo-gym 0.4 (the suite's .venv). gym_version="0.4" runs it; gym_version="0.7" does not
    fall back to it: it asks for a managed 0.7 runtime (which needs Python 3.13.14: refused here, saying so); and
    a named interpreter of another release than the one asked for is refused, naming both."""
    monkeypatch.delenv("VERIFIERS_NEMO_GYM_PYTHON", raising=False)
    here = find_gym_runtime()
    assert releases.series_of(here.nemo_gym_version) == "0.4"
    assert find_gym_runtime(gym_version="0.4").python == here.python

    fake_pythons(tmp_path, monkeypatch, "3.13.0", "3.12.5")
    with pytest.raises(GymRuntimeError, match=r"nemo-gym 0\.7 needs Python 3\.13\.14 or newer"):
        find_gym_runtime(gym_version="0.7")
    with pytest.raises(GymRuntimeError, match=r"gym_version '0\.7' was asked for.*has nemo-gym 0\.4\.0: name one"):
        find_gym_runtime(sys.executable, gym_version="0.7")
