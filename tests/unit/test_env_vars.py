"""The environment variables a Gym config reads, and who gets them: that env's Gym processes only."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from verifiers_nemo._gym.env_vars import config_variable_names, config_variables
from verifiers_nemo._stack.config import StackConfig
from verifiers_nemo._stack.plan import child_env

CONFIG = """
search:
  resources_servers:
    web_search:
      entrypoint: app.py
      api_key: ${oc.env:SEARCH_API_KEY}
      host: ${oc.env:SEARCH_HOST,127.0.0.1}
      region: "${oc.env:SEARCH_REGION, MISSING}"
      nested: {retries: "${oc.env:SEARCH_RETRIES,3}", again: "${oc.env:SEARCH_API_KEY}"}
judge_model:
  responses_api_models:
    openai_model:
      entrypoint: app.py
      openai_api_key: ${oc.env:JUDGE_API_KEY}
"""


def test_variables_of_servers_are_found_with_defaults_and_where_they_are_read() -> None:
    variables = {v.name: v for v in config_variables(yaml.safe_load(CONFIG))}

    assert list(variables) == ["SEARCH_API_KEY", "SEARCH_HOST", "SEARCH_REGION", "SEARCH_RETRIES"]
    assert variables["SEARCH_API_KEY"].required and variables["SEARCH_API_KEY"].default is None
    assert variables["SEARCH_API_KEY"].where == "search.api_key"
    assert not variables["SEARCH_HOST"].required and variables["SEARCH_HOST"].default == "127.0.0.1"
    assert variables["SEARCH_REGION"].required  # MISSING leaves it unset
    assert variables["SEARCH_RETRIES"].where == "search.nested.retries"


def test_a_judge_model_servers_variables_are_not_the_envs() -> None:
    assert "JUDGE_API_KEY" not in {v.name for v in config_variables(yaml.safe_load(CONFIG))}


def test_is_set_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEARCH_API_KEY", "k")
    monkeypatch.delenv("SEARCH_HOST", raising=False)
    variables = {v.name: v for v in config_variables(yaml.safe_load(CONFIG))}

    assert variables["SEARCH_API_KEY"].is_set and not variables["SEARCH_HOST"].is_set


def test_a_secret_looking_variable_reaches_the_stack_that_reads_it_and_no_other(tmp_path: Path) -> None:
    reads = tmp_path / "search.yaml"
    reads.write_text(CONFIG)
    other = tmp_path / "other.yaml"
    other.write_text("x:\n  resources_servers:\n    y:\n      entrypoint: app.py\n")
    environ = {"SEARCH_API_KEY": "search-key", "JUDGE_API_KEY": "judge-key", "PATH": "/bin"}

    def env_of(path: Path) -> dict[str, str]:
        config = StackConfig("e", (path,), "http://127.0.0.1:9", pass_env=config_variable_names((path,)))
        return child_env(environ, tmp_path, config)

    assert env_of(reads)["SEARCH_API_KEY"] == "search-key"
    assert "SEARCH_API_KEY" not in env_of(other)
    assert "JUDGE_API_KEY" not in env_of(reads)
