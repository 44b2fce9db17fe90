"""Fixtures and plugins of the whole suite: ``tests/suite_costs.py`` prints, at the end of every run, each
test file's wall and CPU seconds and how many Gym stacks and Ray heads it started."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from verifiers_nemo._stack.ray_head import RAY_DIR_ENV_VAR

pytest_plugins = ["tests.suite_costs"]


@pytest.fixture
def own_ray_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder of shared Ray heads for this test alone (``VERIFIERS_NEMO_RAY_DIR``): the stacks it starts
    join no head the rest of the suite holds, so the test sees its head start and stop. Short: Ray's socket
    paths live under the head's own temporary folder, not here, but keep it tidy."""
    folder = Path(tempfile.mkdtemp(prefix="vnr-t-"))
    monkeypatch.setenv(RAY_DIR_ENV_VAR, str(folder))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


_GYM07_PYTHON = Path(__file__).parents[1] / ".venv-gym07" / "bin" / "python"


class _SessionHeads:
    """The machine's shared Ray heads of the suite's Gym runtimes (nemo-gym 0.4 here, 0.7 in .venv-gym07),
    held by this process from the session's start to its end: every stack the suite starts, in this process or
    in a CLI, vf-eval, env-server or Ray-actor subprocess, joins them instead of starting a Ray head of its own.
    The same for their warm parents (``_stack/warm_parent.py``): the stacks whose processes see the environment
    this one gives them fork from these instead of each starting one. Started in the background, so the heads
    and warm parents come up while the first tests run."""

    def __init__(self) -> None:
        import threading

        from verifiers_nemo._stack.ray_head import ray_dir

        self.heads: list[object] = []
        self.warm_parents: list[object] = []
        self.failures: list[str] = []
        self._heads_dir = ray_dir()  # now: a test may name a folder of its own (own_ray_dir) before the thread runs
        self._thread = threading.Thread(target=self._hold, name="session-ray-heads", daemon=True)
        self._thread.start()

    def _hold(self) -> None:
        import os

        from verifiers_nemo._gym import find_gym_runtime
        from verifiers_nemo._stack.config import StackConfig
        from verifiers_nemo._stack.plan import child_env
        from verifiers_nemo._stack.ray_head import acquire_ray_head
        from verifiers_nemo._stack.stack import warm_parent_env
        from verifiers_nemo._stack.warm_parent import acquire_warm_parent

        pythons = [None, *([str(_GYM07_PYTHON)] if _GYM07_PYTHON.exists() else [])]
        for python in pythons:
            try:
                runtime = find_gym_runtime(python)
                env = child_env(os.environ, runtime.bin_dir, StackConfig("suite", (), ""))
                self.heads.append(acquire_ray_head(runtime, env, self._heads_dir))
            except Exception as exc:  # the tests that need it start one (and report why it fails)
                self.failures.append(f"{python or 'this interpreter'}: {exc}")
        for python in pythons:  # the warm parents the suite's stacks fork from (those whose environment is this one)
            try:
                runtime = find_gym_runtime(python)
                parent = acquire_warm_parent(
                    runtime, warm_parent_env(StackConfig("suite", (), ""), runtime), self._heads_dir
                )
                self.warm_parents.append(parent)
            except Exception as exc:
                self.failures.append(f"warm parent of {python or 'this interpreter'}: {exc}")

    def release(self) -> None:
        from verifiers_nemo._stack.ray_head import release_ray_head
        from verifiers_nemo._stack.warm_parent import release_warm_parent

        self._thread.join(timeout=300)
        for head in self.heads:
            release_ray_head(head)  # type: ignore[arg-type]
        for parent in self.warm_parents:
            release_warm_parent(parent)  # type: ignore[arg-type]


@pytest.fixture(scope="session", autouse=True)
def session_ray_heads(request: pytest.FixtureRequest) -> Iterator[_SessionHeads | None]:
    """Hold the shared Ray heads for the whole run when it has tests that start Gym stacks (not unit tests)."""
    if all(Path(str(item.fspath)).parent.name == "unit" for item in request.session.items):
        yield None
        return
    heads = _SessionHeads()
    yield heads
    heads.release()


LONGEST_FIRST = (
    "tests/e2e/test_offline.py",
    "tests/e2e/test_docs.py",
    "tests/e2e/test_gym07.py",
    "tests/e2e/test_replay.py",
    "tests/e2e/test_verifiers_env.py",
    "tests/e2e/test_training_check.py",
    "tests/faults/test_shared_ray_head.py",
    "tests/e2e/test_stack.py",
    "tests/e2e/test_env_server.py",
    "tests/e2e/test_own_envs_guide.py",
    "tests/e2e/test_own_envs.py",
    "tests/e2e/test_gym07_catalogue.py",
    "tests/e2e/test_training_recipe.py",
    "tests/faults/test_first_use.py",
    "tests/e2e/test_options.py",
    "tests/realmodel/test_training_client_real.py",
    "tests/realmodel/test_cli_exact_tokens_real.py",
    "tests/realmodel/test_exact_tokens_real.py",
    "tests/realmodel/test_training_data_real.py",
    "tests/e2e/test_ray.py",
    "tests/e2e/test_multi_node.py",
    "tests/e2e/test_report.py",
    "tests/faults/test_eval_kill_resume.py",
    "tests/e2e/test_cli.py",
    "tests/faults/test_stack_faults.py",
    "tests/faults/test_port_collision.py",
)
"""The test files that take longest (the suite-costs table's wall column, two xdist workers), run first: each
worker takes the next file when it is free, so the long ones are spread over both and none is left for the end
while the other worker idles (pyproject's ``--no-loadscope-reorder`` keeps xdist to this order). The others keep
their collection order, the unit tests last. The real-model files come once their server, started with the run,
has had time to load."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))  # stable: the rest keep order


REAL_MODEL_URL_VAR = "VERIFIERS_NEMO_TEST_REAL_MODEL_URL"
"""Where the real-model server the run started early listens (inherited by xdist's workers)."""


def _runs_real_model_tests(config: pytest.Config) -> bool:
    tier = Path(__file__).parent / "realmodel"
    for arg in config.args or [str(Path(__file__).parent)]:
        path = Path(arg.split("::", 1)[0]).resolve()
        if path == tier or tier in path.parents or path in tier.parents:
            return True
    return False


def pytest_configure(config: pytest.Config) -> None:
    """When the run has real-model tests, their vLLM server starts now (it takes minutes to load on 2 cores) and
    loads while the other tests run; ``tests/realmodel``'s ``real_model`` waits for it. Started once, by the
    controller under xdist (its workers inherit the address); failures to start are reported by the tier."""
    from tests.realmodel.server import SWITCH, Launch, NotBuilt, find_build

    if hasattr(config, "workerinput") or os.environ.get(SWITCH) == "0" or not _runs_real_model_tests(config):
        return
    try:
        log = Path(tempfile.mkdtemp(prefix="vn-real-model-")) / "server.log"
        launch = Launch(find_build(), log)
    except (NotBuilt, OSError):
        return  # the tier's fixture starts it itself and says why it cannot
    config.stash[_EARLY_REAL_MODEL] = launch
    os.environ[REAL_MODEL_URL_VAR] = f"{launch.root} {log}"


def pytest_unconfigure(config: pytest.Config) -> None:
    launch = config.stash.get(_EARLY_REAL_MODEL, None)
    if launch is not None:
        launch.stop()


_EARLY_REAL_MODEL = pytest.StashKey[object]()
