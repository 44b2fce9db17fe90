"""`verifiers-nemo eval` argument checks and endpoint preflight: one clear message, no stack started."""

from __future__ import annotations

import argparse
import socket
from collections.abc import AsyncIterator
from dataclasses import fields
from pathlib import Path

import pytest
from aiohttp import web

from tests.unit.fake_upstream import FakeUpstream
from verifiers_nemo import ConfigurationError
from verifiers_nemo._cli import build_parser, main, new_settings, resumed_settings
from verifiers_nemo._cli.settings import CONSUMED_ELSEWHERE, FIELDS
from verifiers_nemo._eval import EvalSettings, Evaluation, check_env_args, resolve_nemo_env
from verifiers_nemo._eval.preflight import (
    ApiKey,
    PreflightError,
    check_base_url,
    choose_model,
    list_models,
    resolve_api_key,
)

ENV = "example_multi_step"


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


# ---- flags argparse refuses


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["eval", ENV, "-c", "0"], "-c/--max-concurrent: must be at least 1, not 0"),
        (["eval", ENV, "-n", "-2"], "-n/--num-examples: must be at least 1, not -2"),
        (["eval", ENV, "-r", "two"], "-r/--rollouts-per-example: 'two' is not a whole number"),
        (["eval", ENV, "--timeout", "0"], "--timeout: must be a positive number"),
        (["eval", ENV, "-T", "-1"], "-T/--temperature: must be a number >= 0"),
        (["eval", ENV, "-S", "{'a': 1}"], "-S/--sampling-args: not valid JSON"),
        (["eval", ENV, "-a", '"dataset"'], "-a/--env-args: must be a JSON object"),
        (["eval", ENV, "--api", "grpc"], "argument --api: invalid choice: 'grpc'"),
        (["eval", ENV, "--pass-threshold", "nan"], "--pass-threshold: must be a finite number"),
        (["eval", ENV, "--rollouts", "4"], "unrecognized arguments: --rollouts"),  # no prefix of a flag
        (["envs", "--run"], "unrecognized arguments: --run"),
        ([], "the following arguments are required: COMMAND"),
    ],
)
def test_bad_flag_values_exit_2_with_one_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(argv, capsys)

    assert code == 2
    assert message in err
    assert err.count("error:") == 1 and "Traceback" not in err and out == ""


# ---- combinations and values checked before anything starts


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["eval"], "name the environment to evaluate (ENV)"),
        (["eval", ENV, "-m", "gpt"], "-m needs an endpoint: add -b URL"),
        (["eval", ENV, "--policy", "endpoint"], "--policy endpoint needs -b URL"),
        (["eval", ENV, "--policy", "replay", "-b", "http://127.0.0.1:1/v1"], "drop -b"),
        (["eval", "nemo-gym-env"], "nemo-gym-env needs the Gym environment to run: pass -a"),
        (["eval", ENV, "-a", '{"nemo_env": "other"}'], "-a sets nemo_env='other' but ENV is"),
        (["eval", "example_multi_stpe"], "Closest: example_multi_step"),
        (["eval", ENV, "-b", "127.0.0.1:8000/v1", "-m", "m"], "Did you mean http://127.0.0.1:8000/v1?"),
        (["eval", ENV, "-b", "http://localhost/v1", "-m", "m"], "without a port"),
        (["eval", ENV, "-b", "http://127.0.0.1:1/v1", "-k", "VN_UNSET_VAR"], "$VN_UNSET_VAR (named with -k)"),
        (
            ["eval", ENV, "-a", '{"datset": "example"}'],
            "unknown environment arg 'datset' (did you mean 'dataset'?)",
        ),
        (["eval", ENV, "-a", '{"num_examples": 3}'], "'num_examples' is set by the eval command's flags"),
        (["eval", ENV, "-a", '{"dataset": "x"}'], "-a dataset picks the tasks for a model endpoint"),
        (["eval", "-R", "no/such/dir"], "-R no/such/dir: no metadata.json there"),
        (["eval", ENV, "--exact-tokens"], "--exact-tokens needs a vLLM endpoint started with --enable-scale-out"),
    ],
)
def test_bad_input_exits_2_before_anything_starts(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, err = run_cli(argv, capsys)

    assert code == 2, err
    assert message in err
    assert err.count("error:") == 1 and "Traceback" not in err and out == ""
    assert not (tmp_path / "outputs").exists()


def test_unreachable_endpoint_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["eval", ENV, "-b", f"http://127.0.0.1:{_closed_port()}/v1", "-m", "m"], capsys)

    assert code == 1
    assert "Cannot reach the endpoint" in err and "connection refused" in err


def test_help_names_every_flag(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["eval", "--help"], capsys)

    assert code == 0
    parser = build_parser()
    eval_parser = parser._subparsers._group_actions[0].choices["eval"]  # type: ignore[union-attr]
    for action in eval_parser._actions:
        for option in action.option_strings:
            assert option in out
        assert action.help, action.dest


# ---- settings


def _args(*argv: str):  # type: ignore[no-untyped-def]
    return build_parser().parse_args(["eval", *argv])


def test_no_base_url_means_replay_and_a_base_url_means_endpoint() -> None:
    replay = new_settings(_args(ENV))
    endpoint = new_settings(_args(ENV, "-b", "http://h:1/v1", "-m", "org/m", "-r", "3", "-c", "4"))

    assert (replay.policy, replay.model, replay.rollouts_per_example) == ("replay", "replay", 1)
    assert (endpoint.policy, endpoint.model, endpoint.rollouts_per_example) == ("endpoint", "org/m", 3)
    assert endpoint.max_concurrent == 4 and endpoint.timeout == 600.0 and endpoint.pass_threshold == 0.5


def test_max_tokens_and_temperature_win_over_sampling_args() -> None:
    settings = new_settings(
        _args(ENV, "-b", "http://h:1/v1", "-S", '{"temperature": 1.0, "top_p": 0.9}', "-T", "0.2", "-t", "64")
    )

    assert settings.sampling_args == {"temperature": 0.2, "top_p": 0.9, "max_tokens": 64}


def test_env_package_reads_the_gym_environment_from_env_args() -> None:
    settings = new_settings(_args("nemo-gym-env", "-a", '{"nemo_env": "example_single_tool_call"}'))

    assert (settings.env, settings.nemo_env) == ("nemo-gym-env", "example_single_tool_call")
    assert resolve_nemo_env(ENV, {"nemo_env": ENV}) == ENV


def test_env_args_accept_taskset_and_harness_keywords() -> None:
    check_env_args({"dataset": "example", "shuffle": True, "seed": 1, "max_steps": 5, "gym_python": "py"})


def test_loading_tasks_for_an_endpoint_picks_the_dataset_and_limits_it() -> None:
    settings = new_settings(_args(ENV, "-b", "http://h:1/v1", "-m", "m", "-n", "2", "-r", "3"))
    evaluation = Evaluation(settings)

    tasks = evaluation.load()

    assert list(evaluation.expected) == [(t, r) for t in range(2) for r in range(3)]
    assert [(t.task_index, t.rollout_index) for t in tasks] == list(evaluation.expected)
    assert all(not task.recorded for task in tasks)
    settings.env_args = {"dataset": "nope"}
    with pytest.raises(ConfigurationError, match="has no dataset 'nope'"):
        Evaluation(settings).load()


def test_loading_a_replay_keeps_each_task_recorded_reward() -> None:
    evaluation = Evaluation(new_settings(_args(ENV, "-r", "2")))

    evaluation.load()

    assert len(evaluation.tasks) == 10
    assert evaluation.recorded_rewards == {t: 1.0 for t in range(5)}


def _saved() -> EvalSettings:
    return EvalSettings(
        env=ENV,
        nemo_env=ENV,
        policy="endpoint",
        model="org/m",
        base_url="http://old:8000/v1",
        num_examples=5,
        rollouts_per_example=4,
        sampling_args={"temperature": 0.7},
    )


def test_resume_keeps_saved_settings_and_takes_operational_overrides() -> None:
    resumed = resumed_settings(
        _args("-R", "x", "-b", "http://new:8000/v1", "-c", "3", "--timeout", "9", "-r", "4", "-T", "0.7"),
        _saved(),
    )

    assert resumed.base_url == "http://new:8000/v1"
    assert (resumed.max_concurrent, resumed.timeout) == (3, 9.0)
    assert (resumed.num_examples, resumed.rollouts_per_example, resumed.model) == (5, 4, "org/m")
    assert resumed.sampling_args == {"temperature": 0.7}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-R", "x", "-r", "2"], "-r 2 differs from the resumed run's 4"),
        (["-R", "x", "-m", "other"], "-m 'other' differs"),
        (["-R", "x", "-T", "0.1"], "-S/-t/-T {'temperature': 0.1} differs"),
        (["other_env", "-R", "x"], "ENV 'other_env' differs"),
        (["-R", "x", "-o", "elsewhere"], "-o has no effect with -R"),
    ],
)
def test_resume_refuses_flags_that_change_the_run(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        resumed_settings(_args(*argv), _saved())

    assert message in str(info.value)


def test_resume_says_all_examples_where_the_saved_run_had_no_n() -> None:
    from dataclasses import replace

    with pytest.raises(ConfigurationError) as info:
        resumed_settings(_args("-R", "x", "-n", "3"), replace(_saved(), num_examples=None))

    assert "-n 3 differs from the resumed run's (all examples)" in str(info.value)
    assert "None" not in str(info.value)


# ---- every eval flag reaches the settings (fresh and resumed runs alike)


def _eval_flags() -> set[str]:
    """The eval command's flags (argparse dests), read from the parser itself."""
    eval_parser = build_parser()._subparsers._group_actions[0].choices["eval"]  # type: ignore[union-attr]
    return {action.dest for action in eval_parser._actions if not isinstance(action, argparse._HelpAction)}


def test_every_eval_flag_sets_a_setting_or_is_consumed_elsewhere() -> None:
    mapped = [dest for spec in FIELDS.values() for dest in spec.flags]
    flags = _eval_flags()

    assert sorted(flags - set(mapped) - set(CONSUMED_ELSEWHERE)) == [], "flags parsed but neither mapped nor consumed"
    assert len(mapped) == len(set(mapped)) and not set(mapped) & set(CONSUMED_ELSEWHERE)
    assert set(mapped) | set(CONSUMED_ELSEWHERE) <= flags, "mapped names that are no flag of the parser"
    assert set(FIELDS) <= {f.name for f in fields(EvalSettings)}


URL = "http://h:1/v1"
FLAG_EFFECTS: dict[str, tuple[list[str], list[str]]] = {
    # dest: (flags it needs beside it, the flag itself); the run is `ENV -b URL` unless the flag changes that
    "env": ([], ["example_single_tool_call"]),
    "model": ([], ["-m", "org/other"]),
    "base_url": ([], ["-b", "http://other:2/v1"]),
    "api_key_var": ([], ["-k", "MY_KEY"]),
    "api": ([], ["--api", "chat"]),
    "policy": ([], ["--policy", "replay"]),
    "num_examples": ([], ["-n", "2"]),
    "rollouts_per_example": ([], ["-r", "3"]),
    "max_concurrent": ([], ["-c", "3"]),
    "timeout": ([], ["--timeout", "5"]),
    "env_args": ([], ["-a", '{"max_steps": 3}']),
    "sampling_args": ([], ["-S", '{"top_p": 0.5}']),
    "max_tokens": ([], ["-t", "7"]),
    "temperature": ([], ["-T", "0.5"]),
    "return_tokens": ([], ["--return-tokens"]),
    "save_trace": ([], ["--save-trace"]),
    "pass_threshold": ([], ["--pass-threshold", "0.9"]),
    "judge_base_url": ([], ["--judge-base-url", "http://j:1/v1", "--judge-model", "J"]),
    "judge_model": (["--judge-base-url", "http://j:1/v1"], ["--judge-model", "J"]),
    "judge_api_key_var": (["--judge", "g=http://j:1/v1,J"], ["--judge-api-key-var", "JUDGE_KEY"]),
    "judge_api": (["--judge", "g=http://j:1/v1,J"], ["--judge-api", "chat"]),
    "judge": ([], ["--judge", "g=http://j:1/v1,J"]),
    "ray": ([], ["--ray"]),
    "workers": (["--ray"], ["--workers", "2"]),
    "cpus_per_stack": (["--ray"], ["--cpus-per-stack", "2"]),
    "exact_tokens": ([], ["--exact-tokens"]),
    "client_type": ([], ["--client-type", "train"]),
    "renderer": (["--client-type", "train"], ["--renderer", "qwen3"]),
    "renderer_model": (["--client-type", "train"], ["--renderer-model", "Qwen/Qwen3-8B"]),
    "renderer_config": (["--client-type", "train"], ["--renderer-config", '{"thinking_retention": "all"}']),
    "generate_shape": (["--client-type", "train", "--renderer-model", "d"], ["--generate-shape", "vllm-0.33"]),
    "policy_script": ([], ["--policy-script", str(Path(__file__).parent / "policy_scripts" / "weather_policy.py")]),
}
"""One use of every mapped flag, so a flag added to the parser and the mapping needs an effect here too."""
FIELD_OF = {dest: name for name, spec in FIELDS.items() for dest in spec.flags}
REPLAY_ONLY = {"generate_shape", "policy_script"}
"""Flags of the replay or script policy: their run is `ENV` without -b."""


def _eval_argv(dest: str, with_flag: bool) -> list[str]:
    context, flag = FLAG_EFFECTS[dest]
    if dest == "env":
        return [*(flag if with_flag else [ENV]), "-b", URL, *context]
    endpoint = [] if dest in REPLAY_ONLY else ["-b", URL]
    return [ENV, *endpoint, *context, *(flag if with_flag else [])]


def test_every_mapped_flag_has_an_effect_below() -> None:
    assert set(FLAG_EFFECTS) == set(FIELD_OF)


@pytest.mark.parametrize("dest", sorted(FLAG_EFFECTS))
def test_a_fresh_run_takes_every_flag(dest: str) -> None:
    name = FIELD_OF[dest]
    try:
        without = new_settings(_args(*_eval_argv(dest, False)))
    except ConfigurationError as exc:  # the flag completes a pair: without it the run is refused
        assert FIELDS[name].label.strip("*") in str(exc) or "go together" in str(exc)
        without = None
    try:
        given = new_settings(_args(*_eval_argv(dest, True)))
    except ConfigurationError as exc:  # a flag refused in this combination was read too
        assert dest == "policy" and "drop -b" in str(exc)
        return
    assert without is None or getattr(given, name) != getattr(without, name), f"{dest} left {name} unchanged"


@pytest.mark.parametrize("dest", sorted(FLAG_EFFECTS))
def test_a_resumed_run_takes_or_refuses_every_flag(dest: str) -> None:
    from verifiers_nemo._eval import RUN_DEFINING

    name = FIELD_OF[dest]
    context, _ = FLAG_EFFECTS[dest]
    saved = new_settings(_args(ENV, "-b", URL, *(c for c in context if dest != "judge_model")))
    argv = _eval_argv(dest, True)
    resume = ["-R", "x", *argv[1:]] if dest != "env" else [*argv[:1], "-R", "x"]

    if name in RUN_DEFINING:
        with pytest.raises(ConfigurationError, match=f"{FIELDS[name].label} .* differs from the resumed run's"):
            resumed_settings(_args(*resume), saved)
    else:
        resumed = resumed_settings(_args(*resume), saved)
        assert getattr(resumed, name) != getattr(saved, name), f"{dest} left {name} unchanged on resume"


def test_exact_tokens_reaches_a_fresh_run_and_is_kept_on_resume() -> None:
    settings = new_settings(_args(ENV, "-b", URL, "-m", "m", "--return-tokens", "--exact-tokens"))

    assert settings.exact_tokens is True and settings.sampling_args == {"return_tokens": True}
    assert settings.to_dict()["exact_tokens"] is True  # what metadata.json saves
    assert resumed_settings(_args("-R", "x"), settings).exact_tokens is True


# ---- preflight pieces


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("localhost:8000/v1", "Did you mean http://localhost:8000/v1?"),
        ("ftp://host/v1", "has no http:// or https:// scheme"),
        ("http://127.0.0.1:99999/v1", "invalid port"),
        ("http:///v1", "has no host"),
        ("http://127.0.0.1/v1", "without a port"),
    ],
)
def test_check_base_url_refuses_urls_that_cannot_work(url: str, message: str) -> None:
    with pytest.raises(PreflightError) as info:
        check_base_url(url)

    assert message in str(info.value)


@pytest.mark.parametrize("route", ["/chat/completions", "/responses", "/models"])
def test_check_base_url_refuses_the_url_of_one_route_naming_the_base(route: str) -> None:
    with pytest.raises(PreflightError) as info:
        check_base_url(f"http://127.0.0.1:8000/v1{route}")

    assert info.value.usage and "Did you mean -b http://127.0.0.1:8000/v1?" in str(info.value)


async def test_a_base_url_without_v1_on_a_server_that_serves_only_v1_is_refused(fake: FakeUpstream) -> None:
    without = fake.base_url.removesuffix("/v1")

    with pytest.raises(PreflightError) as info:
        await list_models(without, ApiKey(None, "OPENAI_API_KEY", False))

    assert info.value.usage
    assert f"Did you mean -b {without}/v1?" in str(info.value)


async def test_a_server_without_a_model_list_anywhere_is_still_used() -> None:
    app = web.Application()  # answers 404 to everything, /v1/models included
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        assert await list_models(f"http://127.0.0.1:{port}", ApiKey(None, "OPENAI_API_KEY", False)) is None
    finally:
        await runner.cleanup()


def test_check_base_url_accepts_remote_hosts_without_port_and_strips_the_slash() -> None:
    assert check_base_url("https://api.openai.com/v1/") == "https://api.openai.com/v1"
    assert check_base_url("http://gpu-node:8000/v1") == "http://gpu-node:8000/v1"


def test_api_key_var_named_with_k_must_be_set_but_the_default_may_be_unset() -> None:
    assert resolve_api_key(None, {}) == ApiKey(value=None, var="OPENAI_API_KEY", explicit=False)
    assert resolve_api_key(None, {"OPENAI_API_KEY": "sk-1"}).value == "sk-1"
    assert resolve_api_key("MY_KEY", {"MY_KEY": "sk-2"}).value == "sk-2"
    with pytest.raises(PreflightError, match=r"\$MY_KEY \(named with -k\) is not set"):
        resolve_api_key("MY_KEY", {})


def test_a_key_passed_to_k_is_refused_without_echoing_it() -> None:
    with pytest.raises(PreflightError) as info:
        resolve_api_key("sk-proj-abc123", {})

    assert "sk-proj" not in str(info.value) and "NAME" in str(info.value)


@pytest.fixture
async def fake() -> AsyncIterator[FakeUpstream]:
    async with FakeUpstream("served-model") as upstream:
        yield upstream


async def test_list_models_reads_the_served_models_with_the_key(fake: FakeUpstream) -> None:
    models = await list_models(fake.base_url, ApiKey("sk-9", "K", True))

    assert models == ["served-model"]


def test_choose_model_checks_the_name_or_takes_the_only_one() -> None:
    assert choose_model("a", ["a", "b"], "u") == "a"
    assert choose_model(None, ["only"], "u") == "only"
    assert choose_model("x", None, "u") == "x"
    with pytest.raises(PreflightError, match=r"'Qwen/Qwen3-8b' is not served by u\. Closest: Qwen/Qwen3-8B"):
        choose_model("Qwen/Qwen3-8b", ["Qwen/Qwen3-8B", "other"], "u")
    with pytest.raises(PreflightError, match="Pass the model to evaluate with -m; u serves: a, b"):
        choose_model(None, ["a", "b"], "u")


async def test_unreachable_endpoint_fails_within_the_timeout() -> None:
    with pytest.raises(PreflightError) as info:
        await list_models(f"http://127.0.0.1:{_closed_port()}/v1", ApiKey(None, "OPENAI_API_KEY", False))

    assert not info.value.usage
    assert "Cannot reach the endpoint" in str(info.value)


async def test_a_server_that_wants_a_key_names_the_variable() -> None:
    async def unauthorized(request: web.Request) -> web.Response:
        return web.json_response({"error": "no key"}, status=401)

    app = web.Application()
    app.router.add_get("/v1/models", unauthorized)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    try:
        with pytest.raises(PreflightError, match=r"needs an API key .* \$OPENAI_API_KEY is not set"):
            await list_models(url, ApiKey(None, "OPENAI_API_KEY", False))
        with pytest.raises(PreflightError, match=r"refused the API key in \$MY_KEY"):
            await list_models(url, ApiKey("bad", "MY_KEY", True))
    finally:
        await runner.cleanup()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("key", ["secrets", "proxy"])
def test_env_args_cannot_carry_secrets_or_a_proxy(key: str) -> None:
    with pytest.raises(ConfigurationError, match=f"unknown environment arg '{key}'"):
        check_env_args({key: ["sk-not-for-metadata"]})
