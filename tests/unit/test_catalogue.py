"""The catalogue of packaged NeMo Gym environments (read from files; nemo_gym is never imported)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from verifiers_nemo import ConfigurationError, UnknownEnvironmentError, get_environment, list_environments
from verifiers_nemo._gym.catalogue import classify_config, find_agent

_SPEC = importlib.util.find_spec("nemo_gym")
if _SPEC is None or _SPEC.origin is None:
    pytest.skip("nemo-gym is not installed in this interpreter", allow_module_level=True)
GYM_ROOT = Path(_SPEC.origin).parent.parent

REFERENCE_ENVS = ("example_single_tool_call", "example_session_state_mgmt", "example_multi_step")


def env(name: str):
    return get_environment(name, root=GYM_ROOT)


# ---- every packaged environment


def test_every_packaged_environment_lists_without_crashing() -> None:
    environments = list_environments(GYM_ROOT)

    assert len(environments) >= 90
    assert [e.name for e in environments] == sorted(e.name for e in environments)
    for environment in environments:
        assert environment.configs, environment.name
        assert environment.default_config in environment.configs


def test_catalogue_is_cached_per_root() -> None:
    assert list_environments(GYM_ROOT)[0] is list_environments(str(GYM_ROOT))[0]


@pytest.mark.parametrize("name", REFERENCE_ENVS)
def test_reference_environments_run_with_nemo_gym_only(name: str) -> None:
    environment = env(name)

    assert environment.runs_offline_with_nemo_gym_only
    assert environment.requirements == ()
    assert not environment.needs_judge
    assert not environment.needs_external
    assert environment.has_example_rollouts
    assert environment.default_agent is not None
    assert environment.default_agent.type == "simple_agent"
    assert environment.default_agent.model_server == "policy_model"
    assert environment.default_dataset is not None and environment.default_dataset.exists


def test_counts_are_in_the_range_the_design_measured() -> None:
    environments = list_environments(GYM_ROOT)

    nothing_beyond_gym = [e for e in environments if not e.requirements]
    offline = [e for e in environments if e.runs_offline_with_nemo_gym_only]

    assert 35 <= len(nothing_beyond_gym) <= 60
    assert 15 <= len(offline) <= len(nothing_beyond_gym)
    assert all(e.name in {o.name for o in offline} for e in map(env, REFERENCE_ENVS))


# ---- configs, agents, datasets


def test_default_config_is_the_one_named_after_the_environment() -> None:
    environment = env("math_with_judge")

    assert len(environment.configs) > 1
    assert environment.default_config is not None
    assert environment.default_config.name == "math_with_judge.yaml"


def test_default_config_falls_back_to_the_first_config_with_an_agent() -> None:
    environment = env("equivalence_rule")

    assert environment.default_config is not None
    assert environment.default_config.name == "lc.yaml"
    assert environment.default_agent is not None


def test_agent_records_its_type_servers_datasets_and_max_steps() -> None:
    environment = env("blackjack")
    agent = environment.default_agent

    assert agent is not None
    assert agent.name == "blackjack_gymnasium_agent"
    assert agent.type == "gymnasium_agent"
    assert agent.resources_server == "blackjack"
    assert agent.max_steps == 5
    assert [d.name for d in agent.datasets] == ["example"]


def test_datasets_say_which_files_are_shipped_and_where_gym_fetches_the_rest() -> None:
    datasets = {d.name: d for d in env("example_multi_step").datasets}

    assert datasets["example"].exists
    assert datasets["example"].path.is_file()
    assert datasets["example"].jsonl_fpath == "resources_servers/example_multi_step/data/example.jsonl"
    assert not datasets["train"].exists
    assert datasets["train"].source is not None and "gitlab" in datasets["train"].source


def test_default_dataset_prefers_the_shipped_example() -> None:
    dataset = env("example_multi_step").default_dataset

    assert dataset is not None
    assert (dataset.name, dataset.type) == ("example", "example")


def test_environment_without_an_agent_has_no_default_dataset_and_says_why() -> None:
    environment = env("gdpval")

    assert environment.default_agent is None
    assert environment.default_dataset is None
    assert not environment.runs_offline_with_nemo_gym_only
    assert any("no config defines an agent" in p for p in environment.problems)


def test_unknown_agent_or_dataset_lists_what_exists() -> None:
    environment = env("example_multi_step")

    with pytest.raises(ConfigurationError, match="example_multi_step_simple_agent"):
        environment.agent("example_multi_step_agent")
    with pytest.raises(ConfigurationError, match="did you mean 'validation'"):
        environment.dataset("validaton")


def test_find_agent_maps_an_agent_name_to_its_environment() -> None:
    environment, agent = find_agent("workplace_assistant_simple_agent", root=GYM_ROOT)

    assert environment.name == "workplace_assistant"
    assert agent.type == "simple_agent"


# ---- requirements


def test_requirements_leave_out_the_line_that_installs_nemo_gym() -> None:
    assert env("example_multi_step").server_requirements == ()
    assert "math-verify==0.8.0" in env("math_with_judge").requirements


def test_requirements_are_read_from_pyproject_too() -> None:
    assert "human-eval-infilling" in env("code_fim").requirements


def test_requirements_include_the_agents_own() -> None:
    environment = env("aviary")

    assert "fhaviary" in environment.requirements  # from responses_api_agents/aviary_agent


# ---- the judge / external rule on packaged data


def test_a_model_server_reference_in_the_resources_server_is_a_judge() -> None:
    environment = env("physics_judge")

    assert environment.needs_judge
    assert environment.judge_models == ("judge_model",)


def test_a_judge_switched_off_in_the_config_is_not_a_judge() -> None:
    environment = env("math_with_judge")  # should_use_judge: false

    assert not environment.needs_judge
    local_judge = next(c for c in environment.configs if c.name == "math_with_local_judge.yaml")
    assert local_judge.needs_judge


def test_the_policy_grading_itself_still_counts_as_a_judge() -> None:
    assert env("equivalence_llm_judge").judge_models == ("policy_model",)


def test_judge_models_defined_in_the_config_are_listed_as_model_servers() -> None:
    config = env("xstest").default_config

    assert config is not None
    assert config.model_servers == ("allenai_wildguard_model_server",)
    assert config.judge_models == ("allenai_wildguard_model_server",)


@pytest.mark.parametrize(
    ("name", "reason_fragment"),
    [
        ("tavily_search", "tavily_api_key"),
        ("google_search", "google_api_key"),
        ("speed_bench", "calls the policy endpoint directly"),
        ("math_formal_lean", "NEMO_SKILLS_SANDBOX_HOST"),
        ("example_mcp_weather", "setup_claude_code"),
        ("bird_sql", "setup_bird_sql"),
        ("cvdp", "runs containers"),
        ("competitive_coding_challenges", "needs data that is not shipped"),
    ],
)
def test_environments_needing_services_credentials_or_downloads_are_external(name: str, reason_fragment: str) -> None:
    environment = env(name)

    assert environment.needs_external
    assert any(reason_fragment in reason for reason in environment.external_reasons), environment.external_reasons
    assert not environment.runs_offline_with_nemo_gym_only


def test_placeholder_recordings_do_not_count_as_shipped() -> None:
    environment = env("tavily_search")

    assert environment.example_rollouts_path.is_file()
    assert not environment.has_example_rollouts
    assert any("placeholder" in p for p in environment.problems)


# ---- unknown names


def test_unknown_environment_lists_the_closest_names() -> None:
    with pytest.raises(UnknownEnvironmentError) as caught:
        get_environment("example_multistep", root=GYM_ROOT)

    message = str(caught.value)
    assert "example_multi_step" in message
    assert "verifiers-nemo envs" in message
    assert isinstance(caught.value, ConfigurationError | LookupError)


def test_a_directory_that_is_not_a_gym_root_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="not a NeMo Gym root"):
        list_environments(tmp_path)


def test_catalogue_and_taskset_never_import_nemo_gym() -> None:
    code = textwrap.dedent(
        f"""
        import sys
        from verifiers_nemo._gym.catalogue import list_environments
        from verifiers_nemo._tasks import NeMoGymTaskset
        list_environments({str(GYM_ROOT)!r})
        NeMoGymTaskset("example_multi_step", root={str(GYM_ROOT)!r})
        assert "nemo_gym" not in sys.modules, "nemo_gym was imported"
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# ---- the rule itself, on a small fake Gym root


def make_root(tmp_path: Path, configs: dict[str, str], app: str = "") -> Path:
    """A fake Gym root with one environment ``toy`` whose configs are ``configs`` (name -> YAML)."""
    env_dir = tmp_path / "resources_servers" / "toy"
    (env_dir / "configs").mkdir(parents=True)
    (env_dir / "data").mkdir()
    (env_dir / "requirements.txt").write_text("-e nemo-gym[dev] @ ../../\n")
    (env_dir / "app.py").write_text(app)
    agent_dir = tmp_path / "responses_api_agents" / "simple_agent"
    agent_dir.mkdir(parents=True)
    (agent_dir / "requirements.txt").write_text("-e nemo-gym[dev] @ ../../\n")
    (agent_dir / "app.py").write_text("")
    for name, text in configs.items():
        (env_dir / "configs" / name).write_text(textwrap.dedent(text))
    return tmp_path


TOY_AGENT = """
toy_simple_agent:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
      resources_server: {type: resources_servers, name: toy}
      model_server: {type: responses_api_models, name: policy_model}
      datasets:
      - {name: example, type: example, jsonl_fpath: resources_servers/toy/data/example.jsonl}
"""


def toy_server(body: str = "") -> str:
    return "toy:\n  resources_servers:\n    toy:\n      entrypoint: app.py\n" + textwrap.indent(
        textwrap.dedent(body), "      "
    )


def classify(root: Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
    import yaml

    doc = yaml.safe_load((root / "resources_servers/toy/configs/toy.yaml").read_text())
    return classify_config(doc, root)


def test_rule_plain_server_needs_nothing(tmp_path: Path) -> None:
    root = make_root(tmp_path, {"toy.yaml": toy_server() + TOY_AGENT})

    assert classify(root) == ((), ())
    assert get_environment("toy", root=root).runs_offline_with_nemo_gym_only


def test_rule_judge_reference_unless_switched_off(tmp_path: Path) -> None:
    judged = toy_server("judge_model_server: {type: responses_api_models, name: my_judge}\n")
    root = make_root(tmp_path, {"toy.yaml": judged + TOY_AGENT})
    assert classify(root)[0] == ("my_judge",)

    switched_off = judged + "      should_use_judge: false\n"
    (root / "resources_servers/toy/configs/toy.yaml").write_text(switched_off + TOY_AGENT)
    assert classify(root)[0] == ()


def test_rule_judge_endpoint_interpolated_directly(tmp_path: Path) -> None:
    root = make_root(tmp_path, {"toy.yaml": toy_server("judge_base_url: ${judge_base_url}\n") + TOY_AGENT})

    judges, reasons = classify(root)
    assert judges == ("${judge_base_url}",)
    assert any("judge_base_url" in r for r in reasons)


def test_rule_credentials_and_missing_values_are_external_but_local_defaults_are_not(tmp_path: Path) -> None:
    body = "api_key: ${oc.env:SERVICE_API_KEY,null}\nlog_dir: ${oc.env:LOG_DIR,/tmp}\nfile: ${needed_file}\n"
    root = make_root(tmp_path, {"toy.yaml": toy_server(body) + TOY_AGENT})

    _, reasons = classify(root)
    assert any("SERVICE_API_KEY" in r for r in reasons)
    assert any("needed_file" in r for r in reasons)
    assert not any("LOG_DIR" in r for r in reasons)


def test_rule_required_secret_field_left_unset_is_external(tmp_path: Path) -> None:
    app = "class ToyConfig(BaseResourcesServerConfig):\n    service_api_key: str\n    retries: int\n"
    root = make_root(tmp_path, {"toy.yaml": toy_server() + TOY_AGENT}, app=app)

    _, reasons = classify(root)
    assert reasons == ("toy needs service_api_key (required by toy, not set by the config)",)


def test_rule_setup_import_and_containers_are_external_but_prose_is_not(tmp_path: Path) -> None:
    root = make_root(tmp_path, {"toy.yaml": toy_server() + TOY_AGENT}, app='"""Runs without a docker sandbox."""\n')
    assert classify(root)[1] == ()

    (root / "resources_servers/toy/app.py").write_text("from resources_servers.toy.setup_toy import ensure\n")
    _, reasons = classify(root)
    assert any("setup_toy" in r for r in reasons)


def test_rule_a_data_file_that_is_not_shipped_is_external(tmp_path: Path) -> None:
    body = "shipped: data/here.jsonl\ntests: ${oc.env:TESTS_FILE,data/missing.jsonl}\n"
    root = make_root(tmp_path, {"toy.yaml": toy_server(body) + TOY_AGENT})
    (root / "resources_servers/toy/data/here.jsonl").write_text("{}\n")

    _, reasons = classify(root)
    assert reasons == ("toy.tests needs data that is not shipped (data/missing.jsonl)",)


def test_odd_yaml_is_recorded_as_a_problem_not_raised(tmp_path: Path) -> None:
    root = make_root(
        tmp_path,
        {"toy.yaml": toy_server() + TOY_AGENT, "broken.yaml": "a: [unclosed\n", "list.yaml": "- 1\n- 2\n"},
    )

    environment = get_environment("toy", root=root)
    assert environment.default_config is not None and environment.default_config.name == "toy.yaml"
    assert any(p.startswith("broken.yaml: cannot be read as YAML") for p in environment.problems)
    assert any(p.startswith("list.yaml: is not a mapping") for p in environment.problems)


def test_extras_of_nemo_gym_beyond_dev_count_as_requirements(tmp_path: Path) -> None:
    root = make_root(tmp_path, {"toy.yaml": toy_server() + TOY_AGENT})
    (root / "resources_servers/toy/requirements.txt").write_text(
        "-e nemo-gym[dev,sandbox] @ ../../\n# a comment\n--extra-index-url https://example.invalid/simple\nrich\n"
    )

    assert get_environment("toy", root=root).requirements == ("nemo-gym[sandbox]", "rich")


def test_an_environment_that_accepts_only_gym_s_own_model_servers_as_its_policy_cannot_start_here(
    tmp_path: Path,
) -> None:
    """nemo-gym 0.7's `allowed_model_types` (asr_with_pc: audio in metadata, translated by Gym's vLLM adapters): Gym
    refuses any other policy at start, and ours is the routing proxy, so the catalogue says so before anything runs."""
    env_dir = tmp_path / "resources_servers" / "speech"
    (env_dir / "configs").mkdir(parents=True)
    (env_dir / "configs" / "speech.yaml").write_text(
        textwrap.dedent(
            """\
            speech:
              resources_servers:
                speech:
                  entrypoint: app.py
                  allowed_model_types: [vllm_model, local_vllm_model]
            speech_simple_agent:
              responses_api_agents:
                simple_agent:
                  entrypoint: app.py
                  resources_server: {type: resources_servers, name: speech}
                  model_server: {type: responses_api_models, name: policy_model}
            """
        )
    )
    (tmp_path / "responses_api_agents" / "simple_agent").mkdir(parents=True)

    speech = get_environment("speech", root=tmp_path)

    assert speech.default_config is not None and speech.default_config.model_adapters == (
        "vllm_model",
        "local_vllm_model",
    )
    assert speech.broken is not None and "accepts only Gym's own model servers" in speech.broken
    assert "(vllm_model, local_vllm_model)" in speech.broken and not speech.runs_offline_with_nemo_gym_only
    assert env("example_multi_step").broken is None


def test_a_config_that_pulls_in_another_by_its_own_config_paths_has_its_servers(tmp_path: Path) -> None:
    """nemo-gym (0.4 and 0.7) merges the configs a config names under `config_paths` (relative to the Gym root) before
    it: 0.7's toolsandbox keeps its agent in the agent's own config. Without them the env has no agent."""
    from verifiers_nemo._gym.config import merged_configs

    agent_configs = tmp_path / "responses_api_agents" / "sandbox_agent" / "configs"
    agent_configs.mkdir(parents=True)
    (agent_configs / "sandbox_agent.yaml").write_text(
        textwrap.dedent(
            """\
            sandbox_agent:
              responses_api_agents:
                sandbox_agent:
                  entrypoint: app.py
                  max_steps: 3
                  resources_server: {type: resources_servers, name: sandbox}
                  model_server: {type: responses_api_models, name: policy_model}
            """
        )
    )
    env_configs = tmp_path / "resources_servers" / "sandbox" / "configs"
    env_configs.mkdir(parents=True)
    (env_configs / "sandbox.yaml").write_text(
        textwrap.dedent(
            """\
            config_paths:
              - responses_api_agents/sandbox_agent/configs/sandbox_agent.yaml
            sandbox:
              resources_servers:
                sandbox: {entrypoint: app.py}
            sandbox_agent:
              responses_api_agents:
                sandbox_agent: {max_steps: 9}
            """
        )
    )

    merged = merged_configs([env_configs / "sandbox.yaml"])
    sandbox = get_environment("sandbox", root=tmp_path)

    assert "config_paths" not in merged and set(merged) == {"sandbox", "sandbox_agent"}
    agent = merged["sandbox_agent"]["responses_api_agents"]["sandbox_agent"]
    assert agent["max_steps"] == 9 and agent["entrypoint"] == "app.py"  # the including file's keys over the included
    assert sandbox.default_agent is not None and sandbox.default_agent.name == "sandbox_agent"
