"""Environments of your own, read without starting anything: named by path or found under a Gym root, read by the
catalogue as a packaged one is read, checked before a stack would start, and named unambiguously in a run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.own_envs import CITIES, WEATHER_APP, write_weather_env
from verifiers_nemo import NeMoGymHarness, NeMoGymTaskset, get_environment, list_environments
from verifiers_nemo._cli import main
from verifiers_nemo._eval.results import run_folder_name
from verifiers_nemo._exceptions import ConfigurationError, TasksetError, UnknownEnvironmentError
from verifiers_nemo._gym import GYM_ROOT_VAR, canonical_reference, env_label
from verifiers_nemo._gym.tree import folder_fingerprint


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return write_weather_env(tmp_path / "project")


@pytest.fixture
def no_gym_root(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv(GYM_ROOT_VAR, raising=False)
    return monkeypatch


def test_a_folder_is_read_as_a_packaged_environment_is(folder: Path) -> None:
    env = get_environment(str(folder))

    assert (env.name, env.local, env.ref, env.source) == ("city_weather", True, str(folder), str(folder))
    assert env.default_agent is not None and env.default_agent.name == "city_weather_simple_agent"
    assert env.default_dataset is not None and env.default_dataset.path == folder / "data" / "example.jsonl"
    assert env.has_example_rollouts and env.example_rollouts_path == folder / "data" / "example_rollouts.jsonl"
    assert env.runs_offline_with_nemo_gym_only and not env.problems and env.broken is None


def test_its_extra_requirements_are_its_own(tmp_path: Path) -> None:
    env = get_environment(str(write_weather_env(tmp_path, "with_deps", requirements="-e nemo-gym[dev]\nrapidfuzz\n")))

    assert env.requirements == ("rapidfuzz",)


def test_a_config_yaml_names_the_folder_with_that_config(folder: Path) -> None:
    other = folder / "configs" / "other.yaml"
    other.write_text((folder / "configs" / "city_weather.yaml").read_text().replace("_simple_agent", "_other_agent"))

    env = get_environment(str(other))

    assert env.default_config is not None and env.default_config.path == other
    assert env.ref == str(other) and env_label(env.ref) == "city_weather.other"
    assert env.default_agent is not None and env.default_agent.name == "city_weather_other_agent"


def test_a_folder_outside_resources_servers_stands_for_its_name(tmp_path: Path) -> None:
    written = write_weather_env(tmp_path, "loose")
    alone = tmp_path / "loose"
    written.rename(alone)

    env = get_environment(str(alone))

    assert env.default_dataset is not None and env.default_dataset.exists
    assert env.default_dataset.path == alone / "data" / "example.jsonl"


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _folder(path: Path) -> Path:
    path.mkdir()
    return path


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda t: t / "nowhere", "does not exist on this machine"),
        (lambda t: _folder(t / "resources_servers").parent, "holds a tree of environments"),
        (lambda t: _folder(t / "empty"), "has no configs/ folder"),
        (lambda t: _write(t / "notes.yaml", "{}"), "is not an environment config"),
    ],
)
def test_a_path_that_is_no_environment_is_refused_with_the_fix(tmp_path: Path, make, says: str) -> None:
    path = make(tmp_path)

    with pytest.raises((ConfigurationError, UnknownEnvironmentError), match=says) as caught:
        get_environment(str(path))
    assert "Fix" in str(caught.value)


def test_a_gym_root_lists_its_environments_first_and_shadows_packaged_names(
    tmp_path: Path, no_gym_root: pytest.MonkeyPatch
) -> None:
    write_weather_env(tmp_path, "example_single_tool_call")
    write_weather_env(tmp_path, "mine")
    no_gym_root.setenv(GYM_ROOT_VAR, str(tmp_path))

    environments = list_environments()
    names = [e.name for e in environments]

    assert names[:2] == ["example_single_tool_call", "mine"] and names.count("example_single_tool_call") == 1
    assert environments[0].local and get_environment("example_single_tool_call").local
    assert canonical_reference("mine") == str(tmp_path / "resources_servers" / "mine")
    assert canonical_reference("example_multi_step") == "example_multi_step"


def test_a_gym_root_with_no_tree_of_any_kind_is_refused(tmp_path: Path, no_gym_root: pytest.MonkeyPatch) -> None:
    no_gym_root.setenv(GYM_ROOT_VAR, str(tmp_path))

    with pytest.raises(ConfigurationError, match="holds none of resources_servers, environments, benchmarks"):
        list_environments()


def test_the_taskset_reads_the_folder_s_rows_and_names_it_by_its_path(folder: Path) -> None:
    tasks = NeMoGymTaskset(str(folder))
    recorded = NeMoGymTaskset(str(folder), recorded=True)

    assert [t.row["expected_city"] for t in tasks] == list(CITIES)
    assert tasks.env_name == str(folder) and tasks.env is not None and tasks.env.local
    assert [t.recorded_reward for t in recorded] == [1.0, 1.0, 1.0, 0.0, 1.0]


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        (lambda f: (f / "requirements.txt").unlink(), "has no requirements.txt"),
        (lambda f: (f / "app.py").unlink(), "its entrypoint .*app.py does not exist"),
        (
            lambda f: (f / "app.py").write_text(WEATHER_APP.replace("async def verify(", "async def verify((")),
            r"app.py:\d+: .*Fix the file",
        ),
        (
            lambda f: _write(
                f / "configs" / "city_weather.yaml",
                (f / "configs" / "city_weather.yaml").read_text().replace("simple_agent:\n", "no_such_agent:\n"),
            ),
            "responses_api_agents/no_such_agent, which is neither in your folders",
        ),
    ],
)
def test_a_broken_folder_is_refused_before_anything_starts(folder: Path, damage, says: str) -> None:
    damage(folder)
    harness = NeMoGymHarness(str(folder))

    with pytest.raises(ConfigurationError, match=says):
        harness.check()
    assert not harness.started


def test_run_folders_and_labels_use_the_folder_s_name(folder: Path) -> None:
    assert run_folder_name(str(folder), "m/x") == "city_weather--m--x"
    assert run_folder_name(f"{folder},example_multi_step", "m") == "city_weather_example_multi_step--m"
    assert env_label("example_multi_step") == "example_multi_step"


def test_the_fingerprint_follows_the_files_not_the_caches(folder: Path) -> None:
    before = folder_fingerprint(folder)
    (folder / "__pycache__").mkdir()
    (folder / "__pycache__" / "app.cpython-312.pyc").write_bytes(b"cache")
    assert folder_fingerprint(folder) == before

    (folder / "app.py").write_text((folder / "app.py").read_text() + "\n# edited\n")
    assert folder_fingerprint(folder) != before


def test_envs_and_prepare_take_a_gym_root(
    tmp_path: Path, no_gym_root: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write_weather_env(tmp_path, "mine")
    no_gym_root.setenv(GYM_ROOT_VAR, "")  # main() sets it for what it starts: put back after the test

    assert main(["envs", "--json", "--gym-root", str(tmp_path), "mine"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["source"] == str(tmp_path / "resources_servers" / "mine") and row["ready"]

    assert main(["prepare", "mine", "--gym-root", str(tmp_path)]) == 0
    assert "mine: ready (nothing to install" in capsys.readouterr().err


def test_envs_promises_a_replay_only_for_folders_that_ship_recordings(
    tmp_path: Path, no_gym_root: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.own_envs import write_guess_env

    write_guess_env(tmp_path, "fresh")  # a new environment: no data/example_rollouts.jsonl
    write_weather_env(tmp_path, "recorded")
    no_gym_root.setenv(GYM_ROOT_VAR, "")

    assert main(["envs", "--gym-root", str(tmp_path), "fresh"]) == 0
    fresh = capsys.readouterr().out.splitlines()[-1]
    assert main(["envs", "--gym-root", str(tmp_path), "recorded"]) == 0
    recorded = capsys.readouterr().out.splitlines()[-1]

    assert "replays" not in fresh and "--policy-script FILE.py" in fresh and "-b URL -m MODEL" in fresh
    assert recorded.startswith("Run one: verifiers-nemo eval NAME (replays its recorded rollouts;")


def test_a_folder_of_yours_named_like_a_packaged_one_says_it_hides_it(
    tmp_path: Path, no_gym_root: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    write_weather_env(tmp_path, "example_single_tool_call")
    no_gym_root.setenv(GYM_ROOT_VAR, str(tmp_path))

    reference = canonical_reference("example_single_tool_call")

    assert reference == str(tmp_path / "resources_servers" / "example_single_tool_call")
    said = [r.getMessage() for r in caplog.records if "hides the packaged environment" in r.getMessage()]
    assert said and "To run the packaged one, name its folder: " in said[0]
    packaged = said[0].split("name its folder: ")[1].split(" (or run")[0]
    assert canonical_reference(packaged) == packaged and packaged.endswith("resources_servers/example_single_tool_call")


def test_a_gym_clone_of_another_release_than_the_runtime_s_is_said_to_be_one_before_it_starts(
    tmp_path: Path, no_gym_root: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A Gym clone's main as --gym-root beside a runtime of another release: its servers run on the runtime's
    library, which may not import them; said before the start, with both versions and the fix."""
    from verifiers_nemo._gym import find_gym_runtime
    from verifiers_nemo._stack.own_servers import gym_tree_version, own_server_dirs

    clone = tmp_path / "Gym"
    write_weather_env(clone, "mine")
    (clone / "nemo_gym").mkdir()
    (clone / "nemo_gym" / "package_info.py").write_text('MAJOR = 9\nMINOR = 1\nPATCH = 0\nPRE_RELEASE = "rc1"\n')
    no_gym_root.setenv(GYM_ROOT_VAR, str(clone))
    install = find_gym_runtime().root
    config = clone / "resources_servers" / "mine" / "configs" / "mine.yaml"

    own_server_dirs([config], install)

    assert gym_tree_version(clone) == "9.1.0rc1" and gym_tree_version(tmp_path) is None
    said = [r.getMessage() for r in caplog.records if "is a Gym tree of nemo-gym 9.1.0rc1" in r.getMessage()]
    assert said and f"has nemo-gym {gym_tree_version(install)}" in said[0] and "Fix: check out" in said[0]


def test_the_replay_server_serves_a_folder_found_under_a_gym_root(tmp_path: Path) -> None:
    write_weather_env(tmp_path, "mine")
    env = {k: v for k, v in os.environ.items() if k != GYM_ROOT_VAR} | {"PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-m", "verifiers_nemo._cli.main", "replay-server", "mine", "--gym-root", str(tmp_path)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        assert proc.stdout is not None
        said = [proc.stdout.readline() for _ in range(3)]  # a warning of runpy's may come first
        assert any("Replaying 5 recorded rollouts at http://127.0.0.1:" in line for line in said), said
    finally:
        proc.terminate()
        proc.wait(30)


def test_a_dataset_the_config_names_but_the_folder_lacks_is_named_with_the_fix(folder: Path) -> None:
    (folder / "data" / "example.jsonl").unlink()

    with pytest.raises(TasksetError, match=r"example.jsonl: dataset 'example' .* does not exist .*Fix: write the file"):
        NeMoGymTaskset(str(folder))
