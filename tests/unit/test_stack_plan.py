"""A stack's launch plan, from its config alone: servers, the policy entry, ng_run's argv, Gym's environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from verifiers_nemo import ConfigurationError
from verifiers_nemo._stack import StackConfig
from verifiers_nemo._stack.plan import (
    address_config,
    child_env,
    joins_shared_ray,
    ng_run_argv,
    policy_model_config,
    stack_servers,
)

CONFIG = """\
tiny_resources:
  resources_servers:
    tiny:
      entrypoint: app.py
tiny_agent:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
      resources_server: {type: resources_servers, name: tiny_resources}
      model_server: {type: responses_api_models, name: policy_model}
"""


def _config(tmp_path: Path, text: str = CONFIG, **kwargs: object) -> StackConfig:
    path = tmp_path / "tiny.yaml"
    path.write_text(text)
    return StackConfig("tiny", (path,), "http://127.0.0.1:4321", **kwargs)  # type: ignore[arg-type]


def test_servers_are_the_configs_less_the_policy_model(tmp_path: Path) -> None:
    servers = stack_servers(
        _config(tmp_path, CONFIG + "policy_model:\n  responses_api_models:\n    x:\n      entrypoint: a.py\n")
    )
    assert [s.name for s in servers] == ["tiny_resources", "tiny_agent"]


def test_a_server_referring_to_an_undefined_one_is_refused(tmp_path: Path) -> None:
    judged = CONFIG.replace("name: policy_model", "name: judge_model")
    with pytest.raises(ConfigurationError, match="judge_model"):
        stack_servers(_config(tmp_path, judged))


def test_a_typo_of_a_resources_server_s_name_is_refused_with_the_closest_name_and_the_config_file(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path, CONFIG.replace("name: tiny_resources}", "name: tiny_resource}"))

    with pytest.raises(ConfigurationError) as caught:
        stack_servers(config)

    message = str(caught.value)
    assert "Gym server 'tiny_agent' (in " + str(tmp_path / "tiny.yaml") + ")" in message
    assert "refers to resources_servers/'tiny_resource'" in message and "Did you mean 'tiny_resources'?" in message
    assert "Fix: correct that name in" in message and "judge" not in message


def test_an_environment_whose_agent_names_no_server_of_its_configs_is_refused_before_its_stack_starts(
    tmp_path: Path,
) -> None:
    """The harness's check (what the eval command runs before it writes anything) says the same as the start."""
    from verifiers_nemo import NeMoGymHarness

    folder = tmp_path / "resources_servers" / "tiny"
    (folder / "configs").mkdir(parents=True)
    (folder / "app.py").write_text("")
    (folder / "configs" / "tiny.yaml").write_text(CONFIG.replace("name: tiny_resources}", "name: tiny_resource}"))

    with pytest.raises(ConfigurationError, match=r"Did you mean 'tiny_resources'\?"):
        NeMoGymHarness(config_paths=[folder / "configs" / "tiny.yaml"]).check()


INHERITED = """\
relay_template:
  environment_servers:
    single_agent_turn_legacy:
      entrypoint: app.py
      resources_server:
        type: resources_servers
        name: ???
      agent_server:
        type: responses_api_agents
        name: ???
      timeout: 60
tiny_relay:
  _inherit_from: relay_template
  environment_servers:
    single_agent_turn_legacy:
      resources_server: {type: resources_servers, name: tiny_resources}
      agent_server: {type: responses_api_agents, name: tiny_agent}
"""


def test_an_entry_that_inherits_a_template_is_the_template_with_its_own_keys_over_it_and_the_template_is_gone(
    tmp_path: Path,
) -> None:
    """nemo-gym 0.7's `_inherit_from` (e.g. its single_agent_turn_legacy environment server, whose template names
    `???` servers): the inheriting entry runs with the names it fills in, the template is no server of its own (Gym
    moves it), so no `???` reference is refused as a typo."""
    servers = {s.name: s for s in stack_servers(_config(tmp_path, CONFIG + INHERITED))}

    assert set(servers) == {"tiny_resources", "tiny_agent", "tiny_relay"}
    relay = servers["tiny_relay"].config
    assert relay["entrypoint"] == "app.py" and relay["timeout"] == 60
    assert relay["resources_server"]["name"] == "tiny_resources" and relay["agent_server"]["name"] == "tiny_agent"


def test_an_entry_that_copies_another_leaves_the_original_in_place(tmp_path: Path) -> None:
    copied = CONFIG + "tiny_agent_2:\n  _copy: tiny_agent\n"
    assert [s.name for s in stack_servers(_config(tmp_path, copied))] == [
        "tiny_resources",
        "tiny_agent",
        "tiny_agent_2",
    ]


def test_policy_model_points_at_the_proxy() -> None:
    entry = policy_model_config("http://127.0.0.1:4321")
    ((_, settings),) = entry["policy_model"]["responses_api_models"].items()
    assert settings == {"entrypoint": "app.py", "host": "127.0.0.1", "port": 4321}


def test_argv_pins_every_server_to_loopback_and_its_port(tmp_path: Path) -> None:
    config = _config(tmp_path, overrides=("++tiny_agent.x=1",))
    servers = {s.name: (s, 20000 + n) for n, s in enumerate(stack_servers(config))}
    argv = ng_run_argv(
        Path("/rt/bin/ng_run"),
        config,
        policy_yaml=tmp_path / "policy.yaml",
        head_port=19999,
        servers=servers,
        venv_links=tmp_path / "links",
        uv_cache=tmp_path / "uv",
        server_logs=tmp_path / "logs",
        ray_head_address="127.0.0.1:30000",
    )
    assert argv[0] == "/rt/bin/ng_run"
    assert f"+config_paths=[{(tmp_path / 'tiny.yaml').resolve()},{(tmp_path / 'policy.yaml').resolve()}]" in argv
    assert "++head_server={host:127.0.0.1,port:19999}" in argv
    assert "++tiny_agent.responses_api_agents.simple_agent.port=20001" in argv
    assert "++tiny_resources.resources_servers.tiny.host=127.0.0.1" in argv
    assert "+ray_head_node_address=127.0.0.1:30000" in argv
    assert argv[-1] == "++tiny_agent.x=1"  # the caller's overrides win


def test_a_server_whose_name_no_override_can_address_gets_its_address_from_our_config_file(tmp_path: Path) -> None:
    """An agent implementation in a subfolder (nemo-gym 0.7's `conversational_tool_use/simulation`): Gym's override
    parser refuses a dotted key with a `/`, so its host and port go in the config file merged after the env's."""
    nested = CONFIG.replace("    simple_agent:", "    tool_use/simulation:")
    config = _config(tmp_path, nested)
    servers = {s.name: (s, 20000 + n) for n, s in enumerate(stack_servers(config))}

    argv = ng_run_argv(
        Path("/rt/bin/ng_run"), config, policy_yaml=tmp_path / "policy.yaml", head_port=19999, servers=servers,
        venv_links=tmp_path / "links", uv_cache=tmp_path / "uv", server_logs=tmp_path / "logs", ray_head_address=None,
    )  # fmt: skip

    assert not any("tool_use/simulation" in arg for arg in argv)
    assert "++tiny_resources.resources_servers.tiny.port=20000" in argv
    assert address_config(servers) == {
        "tiny_agent": {"responses_api_agents": {"tool_use/simulation": {"host": "127.0.0.1", "port": 20001}}}
    }


def test_own_ray_cluster_in_overrides_means_no_shared_head(tmp_path: Path) -> None:
    assert joins_shared_ray(_config(tmp_path))
    assert not joins_shared_ray(_config(tmp_path, overrides=("+ray_head_node_address=10.0.0.1:6379",)))
    assert not joins_shared_ray(_config(tmp_path, shared_ray=False))


def test_gym_processes_never_see_secrets(tmp_path: Path) -> None:
    environ = {
        "OPENAI_API_KEY": "sk-a",
        "HF_TOKEN": "hf-b",
        "ALLOWED_TOKEN": "c",
        "INNOCENT": "sk-endpoint-key",
        "HOME": "/root",
        "PATH": "/usr/bin",
        "VIRTUAL_ENV": "/venv",
    }
    config = _config(tmp_path, pass_env=("ALLOWED_TOKEN",), secrets=frozenset({"sk-endpoint-key"}))
    env = child_env(environ, Path("/rt/bin"), config)
    assert "OPENAI_API_KEY" not in env and "HF_TOKEN" not in env  # secret-looking names
    assert "INNOCENT" not in env  # holds one of the config's secrets
    assert env["ALLOWED_TOKEN"] == "c" and env["HOME"] == "/root"
    assert env["PATH"] == "/rt/bin:/usr/bin" and "VIRTUAL_ENV" not in env
    assert env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"


@pytest.mark.parametrize(
    ("implementation", "takes_rows"),
    [("legacy_agent", True), ("single_agent_turn_legacy", True), ("single_agent_turn", False)],
)
def test_rollouts_go_to_an_environment_server_that_takes_rows_at_its_run(implementation: str, takes_rows: bool) -> None:
    """Gym's collector posts a row to the environment server in front of its agent when that server takes rows
    (0.7's legacy_agent relay and single_agent_turn_legacy); the typed single_agent_turn takes episodes instead."""
    from verifiers_nemo._gym.config import ServerInstance

    server = ServerInstance(
        "env_server",
        "environment_servers",
        implementation,
        {"agent_server": {"type": "responses_api_agents", "name": "a"}},
    )
    assert server.relays_run_of("a") is takes_rows
    assert not server.relays_run_of("another_agent")


def test_an_environment_server_that_takes_typed_episodes_is_refused_before_its_stack_starts(tmp_path: Path) -> None:
    """nemo-gym 0.7's nemo_user_sim (and single_agent_turn) take episodes, not rows: running its agents without it
    would be another environment, so it is refused in one line naming the server, its config and what runs it."""
    typed = CONFIG + (
        "tiny_env:\n  environment_servers:\n    nemo_user_sim:\n      entrypoint: app.py\n"
        "      assistant_agent:\n        type: responses_api_agents\n        name: tiny_agent\n"
    )
    with pytest.raises(ConfigurationError) as caught:
        stack_servers(_config(tmp_path, typed))
    message = str(caught.value)
    assert "'tiny_env' (environment_servers/nemo_user_sim, in " + str(tmp_path / "tiny.yaml") in message
    assert "takes typed episodes" in message and "gym eval run" in message
