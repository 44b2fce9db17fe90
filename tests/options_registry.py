# ruff: noqa: E501 (the registry is data: one option and its test per line)
"""Every option a user can set, generated from the parsers and signatures themselves, and the test that
shows each one's effect (``tests/unit/test_options.py`` fails when an option has no entry here).

An option is named as a user meets it:

* ``eval --exact-tokens``: a flag of a ``verifiers-nemo`` subcommand (its longest spelling; a positional
  by its metavar),
* ``--env.taskset.limit`` / ``--env.agent.harness.timeout``: a field of the verifiers environment's
  config classes (``verifiers_nemo/_verifiers_v1.py``), as ``vf-eval nemo-gym-env`` sets it,
* ``NeMoGymHarness(max_steps=)``: a parameter of a public constructor the docs name
  (``**kwargs`` as ``NeMoGymPool(**harness_args)``).

``EFFECT_TESTS`` maps each to ``path::test_name`` of a test that asserts what the option does (the
request an upstream received, the saved settings, the rows, the processes), not merely that it parses.
"""

from __future__ import annotations

import argparse
import ast
import inspect
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VERIFIERS_MODULE = ROOT / "verifiers_nemo" / "_verifiers_v1.py"

# The verifiers config classes whose own fields are ``--env.*`` options, by the prefix vf-eval gives them.
VERIFIERS_CONFIGS = {"GymTasksetConfig": "--env.taskset.", "GymHarnessConfig": "--env.agent.harness."}
# verifiers' own fields that our environment reads and the docs document (docs/reference/config.md).
VERIFIERS_FIELDS_WE_READ = ("--env.agent.max-turns",)

PUBLIC_CONSTRUCTORS = (
    "NeMoGymTaskset",
    "NeMoGymHarness",
    "NeMoGymPool",
    "Endpoint",
    "load_environment",
    "ProxyConfig",
    "RoutingProxy",
    "FunctionUpstream",
    "ReplayServer",
    "TrainingDataWriter",
)


def cli_options() -> list[str]:
    """``COMMAND FLAG`` for every argument of every ``verifiers-nemo`` subcommand (help excluded)."""
    from verifiers_nemo._cli import build_parser

    parser = build_parser()
    (subparsers,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    options = []
    for command, sub in subparsers.choices.items():
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            name = max(action.option_strings, key=len) if action.option_strings else action.metavar or action.dest
            options.append(f"{command} {name}")
    return options


def verifiers_options() -> list[str]:
    """``--env.*`` for every field our verifiers config classes declare (read from their source, so this
    needs no verifiers install)."""
    tree = ast.parse(VERIFIERS_MODULE.read_text())
    options = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in VERIFIERS_CONFIGS:
            prefix = VERIFIERS_CONFIGS[node.name]
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    options.append(prefix + item.target.id.replace("_", "-"))
    return [*options, *VERIFIERS_FIELDS_WE_READ]


def constructor_options() -> list[str]:
    """``Name(param=)`` for every parameter of the public constructors (``Name(**kwargs)`` for ``**``)."""
    import verifiers_nemo

    options = []
    for name in PUBLIC_CONSTRUCTORS:
        obj = getattr(verifiers_nemo, name)
        for param in inspect.signature(obj).parameters.values():
            if param.kind is inspect.Parameter.VAR_KEYWORD:
                options.append(f"{name}(**{param.name})")
            else:
                options.append(f"{name}({param.name}=)")
    return options


def all_options() -> list[str]:
    return [*cli_options(), *verifiers_options(), *constructor_options()]


U = "tests/unit/test_options.py::"
E = "tests/e2e/test_options.py::"
CLI = "tests/e2e/test_cli.py::"
TASKSET = "tests/unit/test_taskset.py::"
PROXY = "tests/unit/test_proxy.py::"
POOL = "tests/unit/test_pool.py::"
RAY = "tests/e2e/test_ray.py::"
MULTI_NODE = "tests/e2e/test_multi_node.py::"
VF = "tests/e2e/test_verifiers_env.py::"
TRAIN = "tests/e2e/test_training_check.py::"
VERBOSE = U + "test_verbose_makes_info_logs_reach_stderr"
EFFECT_TESTS: dict[str, str] = {
    # -- verifiers-nemo eval
    "eval --verbose": E + "test_verbose_logs_what_the_quiet_run_does_not",
    "eval ENV": E + "test_env_model_and_output_dir_name_the_run_folder",
    "eval --model": E + "test_env_model_and_output_dir_name_the_run_folder",
    "eval --api-base-url": CLI + "test_scripted_upstream_gives_the_right_pass_at_k_when_a_replica_dies_mid_run",
    "eval --api-key-var": E + "test_api_key_var_is_the_key_the_upstream_received",
    "eval --api": E + "test_api_chat_speaks_chat_completions_to_the_base_url",
    "eval --policy": "tests/unit/test_cli_args.py::test_bad_input_exits_2_before_anything_starts",
    "eval --policy-script": "tests/e2e/test_own_envs.py::test_a_new_stateful_environment_runs_on_a_policy_script_and_its_saved_run_replays_row_for_row",
    "eval --judge-base-url": U + "test_judge_flags_are_the_judges_the_run_s_harness_sends_calls_to",
    "eval --judge-model": U + "test_judge_flags_are_the_judges_the_run_s_harness_sends_calls_to",
    "eval --judge-api-key-var": U + "test_judge_flags_are_the_judges_the_run_s_harness_sends_calls_to",
    "eval --judge-api": U + "test_judge_flags_are_the_judges_the_run_s_harness_sends_calls_to",
    "eval --judge": U + "test_judge_flags_are_the_judges_the_run_s_harness_sends_calls_to",
    "eval --num-examples": E + "test_num_examples_and_rollouts_per_example_are_the_rows_run",
    "eval --rollouts-per-example": E + "test_num_examples_and_rollouts_per_example_are_the_rows_run",
    "eval --max-concurrent": E + "test_max_concurrent_bounds_the_calls_in_flight",
    "eval --timeout": E + "test_timeout_ends_the_rollout_that_outlives_it",
    "eval --env-args": E + "test_env_args_max_steps_bounds_the_gym_agent_s_calls",
    "eval --ray": MULTI_NODE + "test_the_readme_multi_node_block_loses_nothing_when_a_node_dies_mid_run",
    "eval --workers": MULTI_NODE + "test_the_readme_multi_node_block_loses_nothing_when_a_node_dies_mid_run",
    "eval --cpus-per-stack": POOL + "test_ray_flags_become_settings_and_workers_without_ray_are_refused",
    "eval --max-tokens": E + "test_max_tokens_temperature_and_sampling_args_reach_the_upstream",
    "eval --temperature": E + "test_max_tokens_temperature_and_sampling_args_reach_the_upstream",
    "eval --sampling-args": E + "test_max_tokens_temperature_and_sampling_args_reach_the_upstream",
    "eval --exact-tokens": E + "test_exact_tokens_is_saved_and_asks_vllm_s_render_route",
    "eval --return-tokens": E + "test_return_tokens_asks_for_token_ids_and_records_them",
    "eval --save-results": E + "test_save_results_without_output_dir_saves_under_outputs",
    "eval --output-dir": E + "test_env_model_and_output_dir_name_the_run_folder",
    "eval --resume": CLI + "test_interrupted_run_resumes_exactly_the_missing_rollouts",
    "eval --save-trace": E + "test_save_trace_saves_every_policy_call",
    "eval --pass-threshold": E + "test_pass_threshold_decides_which_rollouts_count_as_correct",
    "eval --report": "tests/e2e/test_report.py::test_eval_report_of_a_replay_run_shows_every_rollout_and_its_tool_calls",
    "eval --client-type": TRAIN
    + "test_the_guide_s_check_of_a_mix_of_every_offline_gym_agent_says_what_it_trains_on_0_4",
    "eval --renderer": TRAIN + "test_a_custom_renderer_checks_against_a_real_engine_route_and_against_the_replay",
    "eval --renderer-model": TRAIN + "test_a_custom_renderer_checks_against_a_real_engine_route_and_against_the_replay",
    "eval --renderer-config": TRAIN + "test_with_the_guide_s_thinking_retention_fix_every_rollout_is_one_sample_on_0_7",
    "eval --generate-shape": TRAIN
    + "test_in_vllm_0_33_s_reply_shape_every_rollout_records_the_policy_versions_it_was_sampled_under",
    # -- report, export, envs, prepare, replay-server
    "report --verbose": VERBOSE,
    "report RUN_DIR": U + "test_report_writes_its_title_where_output_says",
    "report --output": U + "test_report_writes_its_title_where_output_says",
    "report --title": U + "test_report_writes_its_title_where_output_says",
    "report --max-rollouts": "tests/unit/test_report_streaming.py::test_a_larger_run_shows_max_rollouts_of_whole_tasks_and_examples_of_every_failure",
    "export --verbose": VERBOSE,
    "export RUN_DIR": "tests/e2e/test_report.py::test_inspect_export_is_read_back_by_inspect_ai",
    "export --inspect": "tests/e2e/test_report.py::test_inspect_export_is_read_back_by_inspect_ai",
    "export --output": "tests/e2e/test_report.py::test_inspect_export_is_read_back_by_inspect_ai",
    "export --max-rollouts": "tests/e2e/test_report.py::test_inspect_export_is_read_back_by_inspect_ai",
    "export --format": "tests/unit/test_export.py::test_the_export_command_writes_each_format_where_it_says",
    "export --min-reward": "tests/unit/test_export.py::test_the_export_command_s_filters_and_pairing_flags_shape_the_rows",
    "export --max-reward": "tests/unit/test_export.py::test_the_export_command_s_filters_and_pairing_flags_shape_the_rows",
    "export --include-masked": "tests/unit/test_export.py::test_the_export_command_s_filters_and_pairing_flags_shape_the_rows",
    "export --include-errors": "tests/unit/test_export.py::test_the_export_command_s_filters_and_pairing_flags_shape_the_rows",
    "export --pairs": "tests/unit/test_export.py::test_the_export_command_s_filters_and_pairing_flags_shape_the_rows",
    "export --min-gap": "tests/unit/test_export.py::test_the_export_command_s_filters_and_pairing_flags_shape_the_rows",
    "export --max-pairs": "tests/unit/test_export.py::test_the_export_command_s_filters_and_pairing_flags_shape_the_rows",
    "envs --verbose": VERBOSE,
    "envs TEXT": U + "test_envs_filter_and_recorded_narrow_the_list",
    "envs --runnable": CLI + "test_envs_lists_the_catalogue_and_filters_runnable",
    "envs --recorded": U + "test_envs_filter_and_recorded_narrow_the_list",
    "envs --json": CLI + "test_envs_lists_the_catalogue_and_filters_runnable",
    "envs --kind": "tests/e2e/test_gym07_catalogue.py::test_envs_lists_every_environment_and_benchmark_gym_lists_with_its_kind",
    "prepare --verbose": VERBOSE,
    "prepare ENV": "tests/e2e/test_requirements.py::test_prepare_installs_an_environments_packages_ahead_of_its_first_run",
    "prepare --gym-python": U + "test_prepare_uses_the_gym_python_it_is_given",
    "prepare --gym-root": "tests/unit/test_own_envs.py::test_envs_and_prepare_take_a_gym_root",
    "prepare --gather": "tests/e2e/test_offline.py::test_the_folder_holds_wheels_for_every_package_and_names_its_platform",
    "prepare --check": "tests/e2e/test_offline.py::test_check_offline_says_which_would_start_what_they_need_and_what_is_missing",
    "prepare --offline-dir": "tests/e2e/test_offline.py::test_a_package_the_folder_lacks_ends_at_once_naming_it_and_the_gather_command",
    "eval --offline-dir": "tests/e2e/test_offline.py::test_a_package_the_folder_lacks_ends_at_once_naming_it_and_the_gather_command",
    "envs --gym-root": "tests/unit/test_own_envs.py::test_envs_and_prepare_take_a_gym_root",
    "eval --gym-root": "tests/e2e/test_own_envs.py::test_a_gym_root_is_listed_and_its_folder_wins_over_the_packaged_name",
    "ps --verbose": VERBOSE,
    "ps --clean": "tests/e2e/test_ps.py::test_ps_lists_a_live_stack_and_clean_stops_what_its_killed_owner_and_supervisor_left",
    "ps --json": "tests/unit/test_ps.py::test_a_stack_whose_owner_is_gone_is_left_over_and_clean_stops_it_and_removes_its_run_folder",
    "replay-server --gym-root": "tests/unit/test_own_envs.py::test_the_replay_server_serves_a_folder_found_under_a_gym_root",
    "replay-server --verbose": VERBOSE,
    "replay-server ENV": VF + "test_vf_eval_replay_on_ray_actors_reproduces_recorded_rewards",
    "replay-server --jsonl-path": U + "test_replay_server_serves_the_jsonl_file_it_is_given",
    "replay-server --port-file": VF + "test_vf_eval_replay_on_ray_actors_reproduces_recorded_rewards",
    # -- vf-eval nemo-gym-env --env.*
    "--env.taskset.nemo-env": VF + "test_vf_eval_replay_on_ray_actors_reproduces_recorded_rewards",
    "--env.taskset.dataset": E + "test_vf_taskset_jsonl_path_and_dataset_pick_the_file",
    "--env.taskset.jsonl-path": E + "test_vf_taskset_jsonl_path_and_dataset_pick_the_file",
    "--env.taskset.recorded": VF + "test_vf_eval_replay_on_ray_actors_reproduces_recorded_rewards",
    "--env.taskset.limit": E + "test_vf_taskset_limit_shuffle_and_seed_pick_the_rows",
    "--env.taskset.shuffle": E + "test_vf_taskset_limit_shuffle_and_seed_pick_the_rows",
    "--env.taskset.seed": E + "test_vf_taskset_limit_shuffle_and_seed_pick_the_rows",
    "--env.taskset.gym-python": E + "test_vf_harness_fields_build_the_harness",
    "--env.taskset.task": E + "test_vf_taskset_task_config_reaches_every_task",
    "--env.agent.harness.api": VF + "test_vf_eval_matches_our_cli_and_records_every_call",
    "--env.agent.harness.timeout": E + "test_vf_harness_fields_build_the_harness",
    "--env.agent.harness.max-steps": E + "test_vf_harness_fields_build_the_harness",
    "--env.agent.harness.isolated-venvs": E + "test_vf_harness_fields_build_the_harness",
    "--env.agent.harness.start-timeout": E + "test_vf_harness_fields_build_the_harness",
    "--env.agent.harness.judge-base-url": VF
    + "test_vf_eval_sends_judge_calls_to_the_configured_judge_with_its_own_key",
    "--env.agent.harness.judge-model": VF + "test_vf_eval_sends_judge_calls_to_the_configured_judge_with_its_own_key",
    "--env.agent.harness.judge-api-key-var": VF
    + "test_vf_eval_sends_judge_calls_to_the_configured_judge_with_its_own_key",
    "--env.agent.harness.judge-api": E + "test_vf_harness_fields_build_the_harness",
    "--env.agent.harness.ray": VF + "test_vf_eval_replay_on_ray_actors_reproduces_recorded_rewards",
    "--env.agent.harness.ray-workers": VF + "test_vf_eval_replay_on_ray_actors_reproduces_recorded_rewards",
    "--env.agent.max-turns": VF + "test_vf_eval_max_turns_bounds_gym_steps_so_rollouts_still_verify",
    # -- NeMoGymTaskset
    "NeMoGymTaskset(nemo_env=)": TASKSET + "test_every_environment_loads_its_default_dataset_or_says_why",
    "NeMoGymTaskset(dataset=)": U + "test_dataset_picks_another_dataset_of_the_environment",
    "NeMoGymTaskset(jsonl_path=)": TASKSET + "test_limit_stops_reading_at_the_limit",
    "NeMoGymTaskset(recorded=)": TASKSET + "test_recorded_tasks_carry_the_recorded_response_and_reward",
    "NeMoGymTaskset(agent=)": TASKSET + "test_rows_take_the_agent_argument_or_their_own_agent_ref",
    "NeMoGymTaskset(limit=)": TASKSET + "test_limit_stops_reading_at_the_limit",
    "NeMoGymTaskset(shuffle=)": TASKSET + "test_shuffle_is_deterministic_for_a_seed",
    "NeMoGymTaskset(seed=)": TASKSET + "test_shuffle_is_deterministic_for_a_seed",
    "NeMoGymTaskset(rollouts_per_task=)": TASKSET + "test_repeats_give_every_rollout_a_stable_task_and_rollout_index",
    "NeMoGymTaskset(on_error=)": TASKSET + "test_skip_leaves_bad_rows_out_counts_them_and_warns",
    "NeMoGymTaskset(root=)": "tests/e2e/test_gym07.py::test_rollouts_go_through_the_environment_server_in_front_of_the_agent",
    "NeMoGymTaskset(gym_python=)": TASKSET + "test_a_taskset_reads_the_packaged_rows_of_the_gym_runtime_it_names",
    "NeMoGymTaskset(gym_version=)": TASKSET + "test_a_harness_given_the_taskset_runs_the_tasksets_gym_runtime",
    # -- NeMoGymHarness
    "NeMoGymHarness(nemo_env=)": "tests/e2e/test_harness.py::test_hundred_concurrent_rollouts_keep_their_sessions_and_routes",
    "NeMoGymHarness(taskset=)": TASKSET + "test_a_harness_given_the_taskset_runs_the_tasksets_gym_runtime",
    "NeMoGymHarness(config_paths=)": "tests/faults/test_stack_faults.py::"
    "test_a_restart_that_fails_is_each_waiting_rollouts_typed_error_and_a_later_rollout_retries",
    "NeMoGymHarness(agent=)": "tests/faults/test_bad_input.py::test_an_agent_the_environment_lacks_is_refused_by_load_environment",
    "NeMoGymHarness(gym_python=)": "tests/e2e/test_gym07.py::"
    "test_rollouts_go_through_the_environment_server_in_front_of_the_agent",
    "NeMoGymHarness(gym_version=)": TASKSET + "test_a_harness_given_the_taskset_runs_the_tasksets_gym_runtime",
    "NeMoGymHarness(isolated_venvs=)": U + "test_isolated_venvs_reaches_the_stack_the_harness_launches",
    "NeMoGymHarness(max_steps=)": E + "test_env_args_max_steps_bounds_the_gym_agent_s_calls",
    "NeMoGymHarness(timeout=)": "tests/e2e/test_harness.py::test_rollout_timeout_is_typed_and_closes_the_route",
    "NeMoGymHarness(start_timeout=)": E + "test_start_timeout_bounds_the_stack_start",
    "NeMoGymHarness(overrides=)": "tests/e2e/test_gym07.py::"
    "test_rollouts_go_through_the_environment_server_in_front_of_the_agent",
    "NeMoGymHarness(shared_ray=)": U + "test_shared_ray_false_makes_the_stack_start_its_own_ray",
    "NeMoGymHarness(proxy=)": "tests/faults/test_upstream_faults.py::"
    "test_5xx_without_retry_after_uses_every_retry_within_the_backoff_bound",
    "NeMoGymHarness(secrets=)": "tests/faults/test_eval_kill_resume.py::"
    "test_cli_api_key_variable_never_reaches_gym_processes",
    "NeMoGymHarness(agent_urls=)": "tests/faults/test_result_faults.py::"
    "test_a_reward_that_is_not_a_number_is_an_invalid_result_never_a_zero",
    "NeMoGymHarness(judge=)": "tests/e2e/test_judges.py::test_judge_calls_reach_the_judge_and_policy_calls_the_policy",
    "NeMoGymHarness(death_grace=)": U + "test_death_grace_is_how_long_a_harness_waits_before_probing_a_stack",
    # -- NeMoGymPool
    "NeMoGymPool(envs=)": POOL + "test_each_task_runs_on_a_worker_of_its_own_environment",
    "NeMoGymPool(ray=)": RAY
    + "test_a_mixed_replay_over_actors_on_both_nodes_gives_each_environment_its_recorded_rewards",
    "NeMoGymPool(workers=)": POOL + "test_actors_per_environment_come_from_workers_the_cpu_budget_or_the_nodes",
    "NeMoGymPool(cpus_per_stack=)": POOL + "test_actors_per_environment_come_from_workers_the_cpu_budget_or_the_nodes",
    "NeMoGymPool(actor_options=)": RAY
    + "test_killing_an_actor_mid_run_loses_no_rollout_and_leaves_none_of_its_gym_processes",
    "NeMoGymPool(secrets=)": POOL
    + "test_workers_get_the_secrets_and_their_own_environment_s_replay_tasks_and_judge_calls_are_gathered",
    "NeMoGymPool(**harness_args)": RAY
    + "test_a_mixed_replay_over_actors_on_both_nodes_gives_each_environment_its_recorded_rewards",
    # -- Endpoint
    "Endpoint(base_url=)": PROXY + "test_thousand_concurrent_routes_reach_only_their_own_upstream",
    "Endpoint(model=)": PROXY + "test_request_is_rewritten_for_the_endpoint",
    "Endpoint(api_key=)": PROXY + "test_request_is_rewritten_for_the_endpoint",
    "Endpoint(api=)": U + "test_endpoint_api_chooses_the_protocol_the_upstream_is_spoken_to",
    "Endpoint(sampling_args=)": PROXY + "test_request_is_rewritten_for_the_endpoint",
    "Endpoint(extra_headers=)": PROXY + "test_request_is_rewritten_for_the_endpoint",
    "Endpoint(extra_body=)": PROXY + "test_request_is_rewritten_for_the_endpoint",
    "Endpoint(name=)": U + "test_endpoint_name_is_how_a_failed_call_is_logged",
    "Endpoint(return_tokens=)": U + "test_endpoint_return_tokens_asks_vllm_for_token_ids_and_records_them",
    "Endpoint(exact_tokens=)": U + "test_endpoint_exact_tokens_renders_on_vllm_s_scale_out_routes",
    # -- load_environment
    "load_environment(nemo_env=)": U + "test_load_environment_arguments_shape_the_tasks_and_reach_the_harness",
    "load_environment(dataset=)": U + "test_dataset_picks_another_dataset_of_the_environment",
    "load_environment(jsonl_path=)": U + "test_load_environment_arguments_shape_the_tasks_and_reach_the_harness",
    "load_environment(recorded=)": U + "test_load_environment_arguments_shape_the_tasks_and_reach_the_harness",
    "load_environment(num_examples=)": U + "test_load_environment_arguments_shape_the_tasks_and_reach_the_harness",
    "load_environment(rollouts_per_example=)": U
    + "test_load_environment_arguments_shape_the_tasks_and_reach_the_harness",
    "load_environment(shuffle=)": U + "test_load_environment_arguments_shape_the_tasks_and_reach_the_harness",
    "load_environment(seed=)": U + "test_load_environment_arguments_shape_the_tasks_and_reach_the_harness",
    "load_environment(**harness_args)": U + "test_load_environment_arguments_shape_the_tasks_and_reach_the_harness",
    # -- ProxyConfig / RoutingProxy
    "ProxyConfig(host=)": U + "test_proxy_host_and_port_are_where_it_listens",
    "ProxyConfig(port=)": U + "test_proxy_host_and_port_are_where_it_listens",
    "ProxyConfig(upstream_timeout=)": U + "test_proxy_upstream_timeout_bounds_a_call_over_all_attempts",
    "ProxyConfig(connect_timeout=)": U + "test_proxy_connect_timeout_bounds_each_connection_attempt",
    "ProxyConfig(max_retries=)": U + "test_proxy_max_retries_backoff_and_backoff_max_shape_the_retries",
    "ProxyConfig(backoff=)": U + "test_proxy_max_retries_backoff_and_backoff_max_shape_the_retries",
    "ProxyConfig(backoff_max=)": U + "test_proxy_max_retries_backoff_and_backoff_max_shape_the_retries",
    "ProxyConfig(connector_limit=)": U + "test_proxy_connector_limits_bound_the_connections_to_upstreams",
    "ProxyConfig(connector_limit_per_host=)": U + "test_proxy_connector_limits_bound_the_connections_to_upstreams",
    "ProxyConfig(keepalive_timeout=)": U + "test_proxy_keepalive_timeout_closes_idle_upstream_connections",
    "ProxyConfig(max_request_bytes=)": U + "test_proxy_max_request_bytes_refuses_bigger_bodies",
    "ProxyConfig(tombstones=)": U + "test_proxy_tombstones_bound_how_many_closed_keys_are_told_apart",
    "ProxyConfig(backlog=)": U + "test_proxy_backlog_is_the_listen_queue_of_its_socket",
    "ProxyConfig(shutdown_grace=)": U + "test_proxy_shutdown_grace_bounds_how_long_stop_waits_for_requests_in_flight",
    "ProxyConfig(context_overflow_as_incomplete=)": U
    + "test_proxy_context_overflow_as_incomplete_decides_what_an_overflow_is",
    "ProxyConfig(record_requests=)": U + "test_proxy_record_requests_decides_whether_calls_keep_the_conversation",
    "ProxyConfig(use_uvloop=)": U + "test_proxy_use_uvloop_picks_the_loop_its_upstreams_run_on",
    "RoutingProxy(config=)": U + "test_proxy_record_requests_decides_whether_calls_keep_the_conversation",
    "RoutingProxy(upstreams=)": U + "test_routing_proxy_upstreams_replace_the_upstream_of_an_api",
    "RoutingProxy(**options)": U + "test_proxy_max_retries_backoff_and_backoff_max_shape_the_retries",
    # -- FunctionUpstream, ReplayServer
    "FunctionUpstream(handler=)": PROXY + "test_function_upstream_replies_are_validated",
    "TrainingDataWriter(path=)": "tests/unit/test_export.py::test_a_writer_in_your_own_loop_writes_the_file_the_export_of_the_saved_run_writes",
    "TrainingDataWriter(format=)": "tests/unit/test_export.py::test_jsonl_and_parquet_hold_the_same_rows_and_describe_themselves",
    "TrainingDataWriter(min_reward=)": "tests/unit/test_export.py::test_filters_keep_rollouts_by_reward_and_add_failed_and_masked_ones_as_typed_rows",
    "TrainingDataWriter(max_reward=)": "tests/unit/test_export.py::test_filters_keep_rollouts_by_reward_and_add_failed_and_masked_ones_as_typed_rows",
    "TrainingDataWriter(include_masked=)": "tests/unit/test_export.py::test_filters_keep_rollouts_by_reward_and_add_failed_and_masked_ones_as_typed_rows",
    "TrainingDataWriter(include_errors=)": "tests/unit/test_export.py::test_filters_keep_rollouts_by_reward_and_add_failed_and_masked_ones_as_typed_rows",
    "TrainingDataWriter(pairs=)": "tests/unit/test_export.py::test_pairs_are_a_task_s_scored_rollouts_apart_by_the_minimum_gap_best_against_worst_by_default",
    "TrainingDataWriter(min_gap=)": "tests/unit/test_export.py::test_pairs_are_a_task_s_scored_rollouts_apart_by_the_minimum_gap_best_against_worst_by_default",
    "TrainingDataWriter(max_pairs_per_task=)": "tests/unit/test_export.py::test_pairs_are_a_task_s_scored_rollouts_apart_by_the_minimum_gap_best_against_worst_by_default",
    "TrainingDataWriter(rollouts_per_task=)": "tests/unit/test_export.py::test_a_task_s_rows_are_written_as_soon_as_it_has_all_its_rollouts",
    "TrainingDataWriter(model=)": "tests/unit/test_export.py::test_a_writer_in_your_own_loop_writes_the_file_the_export_of_the_saved_run_writes",
    "TrainingDataWriter(run_id=)": "tests/unit/test_export.py::test_sft_tokens_rows_are_the_training_samples_with_labels_off_where_the_policy_did_not_sample",
    "TrainingDataWriter(source=)": "tests/unit/test_export.py::test_jsonl_and_parquet_hold_the_same_rows_and_describe_themselves",
    "TrainingDataWriter(group_memory=)": "tests/unit/test_export.py::test_groups_in_any_order_beyond_the_memory_bound_go_to_disk_and_come_out_the_same",
    "FunctionUpstream(chat=)": U + "test_function_upstream_chat_answers_a_judge_s_chat_calls",
    "ReplayServer(recordings=)": "tests/unit/test_replay_judge.py::test_policy_calls_are_unaffected_by_judge_recordings",
    "ReplayServer(judge=)": "tests/unit/test_replay_judge.py::"
    "test_judge_request_gets_the_recorded_judge_evaluation_whatever_its_model_and_sampling",
}
