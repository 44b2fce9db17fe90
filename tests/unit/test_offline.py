"""The offline folder read without a network namespace: its manifest and refusals, what a gather copies, the
switches that keep Gym's processes off the network, what ``envs`` says a run reaches the network for, and the
variable handed to Ray actors. (tests/e2e/test_offline.py runs it all where there is no network.)"""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from verifiers_nemo._exceptions import ConfigurationError
from verifiers_nemo._gym import GymRuntime
from verifiers_nemo._offline import OFFLINE_DIR_VAR, OfflineFolder, network_off_env, offline_folder
from verifiers_nemo._offline.gather import gather
from verifiers_nemo._offline.network_use import download_calls, network_cell, network_uses
from verifiers_nemo._scale.ray_cluster import DRIVER_SETTINGS, with_driver_settings
from verifiers_nemo._stack.config import StackConfig
from verifiers_nemo._stack.plan import child_env

ROOT = Path(__file__).resolve().parents[2]
GYM07 = ROOT / ".venv-gym07" / "bin" / "python"
AIME_ROWS = "benchmarks/aime24/data/aime24_benchmark.jsonl"  # where nemo-gym 0.7's aime24 reads its rows
CLI = str(Path(sys.executable).with_name("verifiers-nemo"))


def _runtime(tmp_path: Path) -> GymRuntime:
    return GymRuntime(python=Path(sys.executable), prefix=tmp_path, root=tmp_path, nemo_gym_version="0.4.0")


def test_no_variable_means_no_folder_and_no_switches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(OFFLINE_DIR_VAR, raising=False)
    assert offline_folder() is None
    assert network_off_env() == {}


def test_a_variable_naming_no_folder_is_refused_naming_the_gather_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(OFFLINE_DIR_VAR, str(tmp_path / "absent"))
    with pytest.raises(ConfigurationError) as info:
        offline_folder()
    assert f"{OFFLINE_DIR_VAR}={tmp_path / 'absent'}: no such folder" in str(info.value)
    assert "prepare ENV... --gather DIR" in str(info.value)


def test_gym_processes_get_every_switch_that_keeps_them_off_the_network(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(OFFLINE_DIR_VAR, str(tmp_path))
    env = child_env({"PATH": "/usr/bin"}, tmp_path, StackConfig("x", (), ""))
    for name in ("UV_OFFLINE", "PIP_NO_INDEX", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        assert env[name] == "1", name


def test_a_gather_copies_benchmark_rows_under_their_gym_path_and_names_platform_and_python(tmp_path: Path) -> None:
    rows = tmp_path / "prepared.jsonl"
    rows.write_text('{"question": "1+1?", "expected_answer": "2"}\n')
    folder = tmp_path / "folder"

    data = {"aime24": [(AIME_ROWS, rows)]}
    done = gather(folder, _runtime(tmp_path), runtime_requirement=None, environments={}, data=data)

    assert done.data == [AIME_ROWS] and done.pins == 0
    assert OfflineFolder(folder).data_file(AIME_ROWS).read_text() == rows.read_text()
    manifest = json.loads((folder / "manifest.json").read_text())
    python = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert manifest["target"] == {"platform": sysconfig.get_platform(), "python": python}
    assert manifest["environments"]["aime24"]["data"] == [AIME_ROWS] and manifest["gym"] == "0.4.0"


def test_one_folder_is_for_one_platform_and_python(tmp_path: Path) -> None:
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps({"target": {"platform": "linux-aarch64", "python": "3.12"}}))

    with pytest.raises(ConfigurationError, match="one folder is for one platform and Python"):
        gather(folder, _runtime(tmp_path), runtime_requirement=None, environments={}, data={})
    with pytest.raises(ConfigurationError, match=r"was gathered for linux-aarch64 Python 3\.12"):
        OfflineFolder(folder).check_platform("linux-x86_64", "3.12")
    OfflineFolder(folder).check_platform("linux-aarch64", "3.12")  # its own: accepted


def test_a_manifest_cut_off_in_the_copy_is_refused(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text('{"target": ')
    with pytest.raises(ConfigurationError, match=r"is not JSON .*gather the folder again"):
        OfflineFolder(tmp_path).manifest()


def test_download_calls_are_read_from_the_modules_a_server_runs_not_its_data_scripts(tmp_path: Path) -> None:
    server = tmp_path / "my_server"
    (server / "tests").mkdir(parents=True)
    (server / "app.py").write_text("import nltk\n\ndef setup():\n    nltk.download('punkt')\n    # load_dataset(x)\n")
    (server / "prepare_data.py").write_text("from datasets import load_dataset\nload_dataset('x')\n")
    (server / "tests" / "test_app.py").write_text("snapshot_download('y')\n")

    assert download_calls(server) == ("my_server/app.py:4 nltk.download(",)


def test_network_uses_name_each_reason_and_the_column_their_kinds(tmp_path: Path) -> None:
    uses = network_uses(
        to_install=["tiktoken", "verifiable @ git+https://github.com/x/y.git"],
        server_dirs=[],
        judges=["judge_model"],
        external_reasons=["needs an API key"],
        unprepared_data="benchmarks/aime24/prepare.py",
    )
    assert [u.what for u in uses] == ["packages", "git", "judge", "external", "data"]
    assert "--judge judge_model=URL,MODEL" in uses[2].detail and "prepare.py" in uses[4].detail
    assert network_cell(uses) == "packages, git, judge, external, data"
    assert network_cell([]) == "-"


def test_envs_json_says_what_a_run_reaches_the_network_for() -> None:
    done = subprocess.run([CLI, "envs", "--json"], capture_output=True, text=True, timeout=300)
    rows = {row["name"]: row for row in json.loads(done.stdout)}
    following = {u["what"] for u in rows["instruction_following"]["network"]}
    assert {"git", "download"} <= following  # its git requirement, and nltk.download( in its app.py
    assert rows["example_single_tool_call"]["network"] == [] and rows["example_single_tool_call"]["network_cell"] == "-"
    assert {"judge"} <= {u["what"] for u in rows["simpleqa"]["network"]}


def test_ray_actors_get_the_folder_unless_the_user_s_runtime_env_sets_it(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in DRIVER_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    assert with_driver_settings(None) is None
    monkeypatch.setenv(OFFLINE_DIR_VAR, "/shared/offline-folder")
    assert with_driver_settings(None) == {"env_vars": {OFFLINE_DIR_VAR: "/shared/offline-folder"}}
    mine = {"env_vars": {OFFLINE_DIR_VAR: "/elsewhere", "A": "1"}, "pip": ["x"]}
    assert with_driver_settings(mine) == {"env_vars": {OFFLINE_DIR_VAR: "/elsewhere", "A": "1"}, "pip": ["x"]}


def test_ray_actors_start_their_stacks_under_the_driver_s_limit_and_warm_start_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in DRIVER_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("VERIFIERS_NEMO_START_TIMEOUT", "1200")
    monkeypatch.setenv("VERIFIERS_NEMO_WARM_START", "0")
    monkeypatch.setenv("VERIFIERS_NEMO_GYM_PYTHON", "/this/node/only/python")  # a path of this machine's: not sent
    assert with_driver_settings({"pip": ["x"]}) == {
        "pip": ["x"],
        "env_vars": {"VERIFIERS_NEMO_START_TIMEOUT": "1200", "VERIFIERS_NEMO_WARM_START": "0"},
    }


@pytest.mark.skipif(not GYM07.exists(), reason="the nemo-gym 0.7 test runtime (.ci/setup-gym07)")
def test_benchmark_rows_come_from_the_folder_offline_and_are_never_downloaded(tmp_path: Path) -> None:
    """nemo-gym 0.7's aime24: with its rows in the folder, the check reads them there and envs counts them as
    prepared; without, the check names the gather command instead of Gym's prepare script (which downloads)."""
    with_rows, without = tmp_path / "with-rows", tmp_path / "without"
    (with_rows / "data" / AIME_ROWS).parent.mkdir(parents=True)
    (with_rows / "data" / AIME_ROWS).write_text('{"question": "1+1?", "expected_answer": "2"}\n')
    without.mkdir()
    env = {"VERIFIERS_NEMO_GYM_PYTHON": str(GYM07), "VERIFIERS_NEMO_CACHE_DIR": str(tmp_path / "cache")}

    def cli(*argv: str, **more: str) -> subprocess.CompletedProcess[str]:
        import os

        return subprocess.run([CLI, *argv], env={**os.environ, **env, **more}, capture_output=True, text=True,
                              timeout=300)  # fmt: skip

    found = cli("prepare", "aime24", "--check", "--offline-dir", str(with_rows))
    assert f"ok: its rows: {with_rows / 'data' / AIME_ROWS}" in found.stdout, found.stdout + found.stderr
    missing = cli("prepare", "aime24", "--check", "--offline-dir", str(without))
    said = f"missing: its rows: benchmark 'aime24': its rows ({AIME_ROWS}) are not in the offline folder"
    assert said in missing.stdout and "prepare aime24 --gather DIR" in missing.stdout
    assert missing.returncode == 1
    (unprepared,) = [r for r in json.loads(cli("envs", "aime24", "--json").stdout) if r["name"] == "aime24"]
    listed = json.loads(cli("envs", "aime24", "--json", VERIFIERS_NEMO_OFFLINE_DIR=str(with_rows)).stdout)
    (gathered,) = [r for r in listed if r["name"] == "aime24"]
    assert any("its data" in b for b in unprepared["not_ready_because"]) and "data" in unprepared["network_cell"]
    assert not any("its data" in b for b in gathered["not_ready_because"]) and "data" not in gathered["network_cell"]


def test_the_command_itself_goes_offline_with_the_folder_keeping_what_the_user_set(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import os

    from verifiers_nemo._cli.main import main

    for name in (OFFLINE_DIR_VAR, "HF_HUB_OFFLINE", "UV_OFFLINE", "PIP_NO_INDEX", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(name, "")  # recorded, so that what main sets is undone after the test
        monkeypatch.delenv(name)
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "0")  # the user's own value
    assert main(["prepare", "example_single_tool_call", "--check", "--offline-dir", str(tmp_path)]) == 0
    assert os.environ[OFFLINE_DIR_VAR] == str(tmp_path)
    assert os.environ["HF_HUB_OFFLINE"] == "1" and os.environ["UV_OFFLINE"] == "1"
    assert os.environ["TRANSFORMERS_OFFLINE"] == "0"
    assert "example_single_tool_call: would start" in capsys.readouterr().out


def test_the_check_names_the_download_calls_a_run_may_make(capsys: pytest.CaptureFixture[str]) -> None:
    from verifiers_nemo._cli.main import main

    main(["prepare", "swerl_llm_judge", "--check"])
    out = capsys.readouterr().out
    assert "the run needs: the network, maybe: swerl_llm_judge/utils.py:" in out and "load_dataset(" in out
