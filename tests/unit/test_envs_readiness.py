"""``verifiers-nemo envs`` says what each environment needs and whether it is ready to run here."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from verifiers_nemo import get_environment
from verifiers_nemo._cli.envs import _env_row, _requirement_states
from verifiers_nemo._gym.derived_env import MARKER, derived_env
from verifiers_nemo._gym.runtime import find_gym_runtime

if importlib.util.find_spec("nemo_gym") is None:
    pytest.skip("nemo-gym is not installed in this interpreter", allow_module_level=True)


@pytest.fixture(autouse=True)
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERIFIERS_NEMO_CACHE_DIR", str(tmp_path))


def row(name: str) -> dict[str, Any]:
    env = get_environment(name)
    return _env_row(env, _requirement_states([env]))


def test_env_needing_nothing_is_ready() -> None:
    r = row("example_single_tool_call")

    assert (r["ready"], r["ready_cell"], r["extra_deps_state"], r["variables"]) == (True, "yes", None, [])


def test_env_with_packages_the_runtime_lacks_is_ready_and_says_its_first_start_installs_them() -> None:
    r = row("mcqa")

    assert (r["ready"], r["ready_cell"], r["extra_deps_state"]) == (True, "yes, installs", "to install")


def test_env_whose_packages_are_cached_says_so() -> None:
    env = get_environment("mcqa")
    cached = derived_env(find_gym_runtime(), env.requirements, base=env.directory)
    cached.path.mkdir(parents=True)
    (cached.path / MARKER).write_text("{}")

    r = row("mcqa")

    assert (r["ready"], r["ready_cell"], r["extra_deps_state"]) == (True, "yes", "cached")


def test_env_scored_by_a_judge_model_of_its_own_is_not_ready_without_a_judge_endpoint() -> None:
    r = row("simpleqa")

    assert not r["ready"] and r["not_ready_because"] == ["a judge endpoint"]
    assert r["ready_cell"] == "no: a judge endpoint"
    assert r["needs_cell"] == "judge: genrm_model"  # the table names the judge --judge NAME=URL,MODEL takes


def test_env_judged_by_the_policy_says_so_and_is_ready_without_a_judge_endpoint() -> None:
    r = row("proof_judge")

    assert r["judge_models"] == ["policy_model"] and r["needs"] == ["judge"]
    assert (r["ready"], r["needs_cell"]) == (True, "judge: policy_model")


def test_env_needing_a_service_lists_its_variables() -> None:
    r = row("ns_tools")

    assert {"NEMO_SKILLS_SANDBOX_HOST", "NEMO_SKILLS_SANDBOX_PORT"} <= {v["name"] for v in r["variables"]}
    assert not r["ready"] and "external" in r["not_ready_because"]
