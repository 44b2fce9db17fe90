"""Bad input that no other test covers, each answered by one clear error naming the fix, with nothing
left running afterwards (every process a stack could have started carries a marker in its
environment; none may remain).

Covered elsewhere: unknown env, missing key variable, unreachable endpoint, model not served, -c 0 and
bad -S JSON through the CLI (tests/e2e/test_cli.py::test_bad_input_fails_fast_with_one_clear_message);
flag values, base URLs without scheme or port (tests/unit/test_cli_args.py); file:line errors and
unknown agents in JSONL (tests/unit/test_taskset.py); rewards that are not numbers
(tests/unit/test_result.py, and on the real stack tests/faults/test_result_faults.py); missing packages
(installed for the user: tests/e2e/test_requirements.py)."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from pathlib import Path

import pytest

from tests.e2e.test_cli import CLI, ENV, SynonymPolicy, _child_env
from tests.faults.helpers import pids_with_env, record_figures
from verifiers_nemo import (
    ConfigurationError,
    Endpoint,
    MissingRequirementsError,
    NeMoGymHarness,
    NeMoGymTaskset,
    UnknownEnvironmentError,
    load_environment,
)

pytestmark = pytest.mark.e2e

VALID_ROW = {
    "responses_create_params": {"input": [{"role": "user", "content": "hi"}]},
    "agent_ref": {"name": f"{ENV}_simple_agent"},
}
# case: (args after `eval`, exit status, what the one error line must say)
CLI_CASES = {
    "env args not JSON": ([ENV, "-a", "{nemo_env: 1}"], 2, "-a/--env-args: not valid JSON"),
    "negative concurrency": ([ENV, "-c", "-3"], 2, "-c/--max-concurrent: must be at least 1, not -3"),
    "malformed JSONL": (
        [ENV, "-b", "{fake}", "-m", "fake/policy-1", "-a", '{"jsonl_path": "{bad_jsonl}"}'],
        2,
        "{bad_jsonl}:2: ",
    ),
    "task for an agent the env lacks": (
        [ENV, "-b", "{fake}", "-m", "fake/policy-1", "-a", '{"jsonl_path": "{foreign_jsonl}"}'],
        2,
        "'example_single_tool_call_simple_agent' is not an agent of environment 'example_multi_step'",
    ),
    "server packages cannot install": (["mcqa"], 1, "mcqa: tiktoken"),
}
# cases run with more in their environment: nothing installed yet, an empty uv cache and no network
OFFLINE_INSTALL = {"server packages cannot install"}


async def test_bad_cli_input_is_one_clear_error_and_leaves_nothing_running(tmp_path: Path) -> None:
    bad_jsonl = tmp_path / "bad.jsonl"
    bad_jsonl.write_text(json.dumps(VALID_ROW) + '\n{"responses_create_params": {"input": \n')
    foreign_jsonl = tmp_path / "foreign.jsonl"
    foreign_jsonl.write_text(json.dumps(VALID_ROW | {"agent_ref": {"name": "example_single_tool_call_simple_agent"}}))
    marker = f"vn-faults-{secrets.token_hex(8)}"
    three_at_a_time = asyncio.Semaphore(3)

    def fill(text: str, fake_url: str) -> str:
        return (
            text.replace("{fake}", fake_url)
            .replace("{bad_jsonl}", str(bad_jsonl))
            .replace("{foreign_jsonl}", str(foreign_jsonl))
        )

    async def case(name: str, fake_url: str) -> tuple[str, int, str, str, float]:
        args = [fill(a, fake_url) for a in CLI_CASES[name][0]]
        cwd = tmp_path / name.replace(" ", "-")
        cwd.mkdir()
        async with three_at_a_time:
            started = time.monotonic()
            proc = await asyncio.create_subprocess_exec(
                CLI, "eval", *args, cwd=cwd, env=_child_env() | {"VN_FAULTS_MARKER": marker} | _offline(name, cwd),
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            out, err = await asyncio.wait_for(proc.communicate(), 90)
            return name, proc.returncode, out.decode(), err.decode(), time.monotonic() - started

    async with SynonymPolicy([], []) as policy:  # serves fake/policy-1
        outcomes = await asyncio.gather(*(case(name, policy.base_url) for name in CLI_CASES))
    left_running = pids_with_env(marker)

    record_figures(
        "bad CLI input",
        cases=len(outcomes),
        slowest_s=max(o[4] for o in outcomes),
        processes_left_running=len(left_running),
    )
    for name, code, out, err, _ in outcomes:
        _, expected_code, message = CLI_CASES[name]
        message = fill(message, "")
        errors = [line for line in err.splitlines() if "error:" in line]
        assert (code, len(errors)) == (expected_code, 1), f"{name}: {err}"
        assert message in err and "Traceback" not in err and out == "", f"{name}: {err}"
        assert not (tmp_path / name.replace(" ", "-") / "outputs").exists(), name
    missing = next(o for o in outcomes if o[0] == "server packages cannot install")[3]
    assert "could not be installed" in missing and "isolated_venvs" in missing  # why, and the fix
    assert left_running == []


def _offline(name: str, cwd: Path) -> dict[str, str]:
    if name not in OFFLINE_INSTALL:
        return {}
    return {"VERIFIERS_NEMO_CACHE_DIR": str(cwd / "cache"), "UV_CACHE_DIR": str(cwd / "uv"), "UV_OFFLINE": "1"}


@pytest.fixture
def marker(monkeypatch: pytest.MonkeyPatch) -> str:
    """A marker in this process's environment: any process a stack starts from here inherits it."""
    value = f"vn-faults-{secrets.token_hex(8)}"
    monkeypatch.setenv("VN_FAULTS_MARKER", value)
    return value


def test_unknown_environment_names_the_closest_ones_and_starts_nothing(marker: str) -> None:
    harness = NeMoGymHarness("example_mult_step")
    with pytest.raises(UnknownEnvironmentError, match="example_multi_step"):
        harness.start()
    harness.close()
    assert not harness.started and pids_with_env(marker) == []


def test_server_packages_that_cannot_install_are_named_with_the_fix_and_leave_nothing(
    marker: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VERIFIERS_NEMO_CACHE_DIR", str(tmp_path / "cache"))  # nothing installed yet
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv"))  # an empty uv cache, and no network:
    monkeypatch.setenv("UV_OFFLINE", "1")  # tiktoken cannot be found
    harness = NeMoGymHarness("mcqa")
    with pytest.raises(MissingRequirementsError, match=r"(?s)mcqa: tiktoken.*could not be installed.*tiktoken.*"
                       r"isolated_venvs=True"):  # fmt: skip
        harness.start()
    assert not harness.stack.running
    harness.close()
    assert pids_with_env(marker) == []


@pytest.mark.parametrize("concurrency", [0, -1, 2.5, "8"])
async def test_bad_concurrency_is_refused_before_any_stack_starts(marker: str, concurrency: object) -> None:
    harness = NeMoGymHarness(ENV)
    tasks = NeMoGymTaskset(ENV)
    endpoint = Endpoint(base_url="http://127.0.0.1:9/v1", model="m")
    with pytest.raises(ConfigurationError, match="concurrency must be a positive integer"):
        async for _ in harness.run(tasks, endpoint, concurrency=concurrency):  # type: ignore[arg-type]
            pass
    await harness.aclose()
    assert not harness.started and pids_with_env(marker) == []


@pytest.mark.parametrize(
    ("base_url", "message"),
    [
        ("127.0.0.1:8000/v1", "is not an http(s) URL with a host"),
        ("http:///v1", "is not an http(s) URL with a host"),
        ("ftp://gpu-node/v1", "is not an http(s) URL with a host"),
    ],
)
def test_endpoint_without_scheme_or_host_is_refused_with_an_example(base_url: str, message: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        Endpoint(base_url=base_url, model="m")
    assert message in str(caught.value) and "'http://127.0.0.1:8000/v1'" in str(caught.value)


def test_an_agent_the_environment_lacks_is_refused_by_load_environment(marker: str) -> None:
    with pytest.raises(ConfigurationError, match="example_multi_step_simple_agent"):
        load_environment(ENV, agent="no_such_agent")
