"""nemo-gym 0.7's typed episodes on the wire: the request Gym's collector makes of a row for a typed environment
server (``single_agent_turn``), and its answer read back as the Gym result the harness reads: a result scored by
its reward, a failure as a failure row whose ``terminal`` says whether it may be tried again."""

from __future__ import annotations

from pathlib import Path

import pytest

from verifiers_nemo import ConfigurationError
from verifiers_nemo._gym.config import ServerInstance
from verifiers_nemo._result import episode_failure, is_retryable_failure
from verifiers_nemo._stack.episodes import episode_record, episode_request
from verifiers_nemo._stack.plan import refuse_episode_servers

ROW = {
    "responses_create_params": {"input": [{"role": "user", "content": "hi"}], "model": "vnr-key"},
    "expected": "sunny",
    "agent_ref": {"type": "responses_api_agents", "name": "agent"},
    "_ng_task_index": 3,
    "_ng_rollout_index": 1,
}


def test_a_row_becomes_the_episode_request_gym_s_collector_makes_of_it() -> None:
    assert episode_request(ROW, "weather") == {
        "episode_id": {"rollout_id": "3-1", "attempt": 0},
        "task": {
            "task_id": {"taskset": "weather", "task_id": "3"},  # no id field: the task index, as Gym's
            "task_input": {"responses_create_params": ROW["responses_create_params"], "expected": "sunny"},
        },
    }


def test_a_retry_is_the_episode_s_next_attempt_and_a_row_s_own_id_names_its_task() -> None:
    request = episode_request({**ROW, "_ng_attempt_index": 2, "task_id": "q-17"}, "weather")
    assert request["episode_id"] == {"rollout_id": "3-1", "attempt": 2}
    assert request["task"]["task_id"] == {"taskset": "weather", "task_id": "q-17"}


def test_a_result_is_the_gym_result_with_the_episode_s_task() -> None:
    task_id = {"taskset": "weather", "task_id": "3"}
    answer = {"episode_id": {}, "task_id": task_id, "result": {"reward": 1.0, "ng_agent_observations": None}}
    assert episode_record(answer) == {"reward": 1.0, "_ng_task_id": task_id}


@pytest.mark.parametrize("terminal", [True, False])
def test_a_failure_is_a_failure_row_tried_again_only_when_not_terminal(terminal: bool) -> None:
    failure = {"failure_reason": "seed failed: 422", "terminal": terminal, "stage": "seed"}
    record = episode_record({"episode_id": {}, "task_id": {}, "failure": failure})
    assert record["_ng_failure_class"] == "environment_server_failed"
    assert is_retryable_failure(record) is not terminal
    assert str(episode_failure(record)).startswith("environment_server_failed at seed")


def test_only_typed_servers_that_run_no_one_agent_s_rollouts_are_refused(tmp_path: Path) -> None:
    agent = ServerInstance("agent", "responses_api_agents", "simple_agent", {})
    ref = {"type": "responses_api_agents", "name": "agent"}
    fronting = ServerInstance("env", "environment_servers", "single_agent_turn", {"agent_server": ref})
    assert fronting.takes_episodes_of("agent") and not fronting.relays_run_of("agent")
    refuse_episode_servers([agent, fronting], [])
    user_sim = ServerInstance("sim", "environment_servers", "nemo_user_sim", {"assistant_agent": ref})
    with pytest.raises(ConfigurationError, match="names no one agent"):
        refuse_episode_servers([agent, user_sim], [tmp_path / "config.yaml"])
