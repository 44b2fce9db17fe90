"""The verifiers v1 environment: a Taskset, a Harness and an Env over the real Gym stack.

``vf-eval nemo-gym-env`` and prime-rl's env server import the ``nemo_gym_env`` package, which exports
the three classes defined here. They are thin: the work is done by ``NeMoGymTaskset`` (rows) and
``NeMoGymHarness`` (rollouts through the persistent Gym stack and the routing proxy).

* ``GymTaskset.load()`` reads the packaged (or any) JSONL without the stack: verifiers loads tasks
  before ``Env.start()``.
* ``GymHarness.launch()`` runs one rollout in-process. Every policy call the Gym agent makes goes
  through the endpoint and per-rollout secret verifiers hands it (its interception server records
  them into the trace); Gym's reward and numeric fields land on ``trace.info["nemo_gym"]``, where
  ``GymTask``'s ``@vf.reward`` / ``@vf.metric`` read them. A failed rollout returns a non-zero
  ``ProgramResult`` (verifiers raises a ``HarnessError``): never a reward of 0.
* ``GymEnv`` defaults its agent to the local subprocess runtime and owns the stack: ``start()``
  brings it up once per process, ``stop()`` releases it.

Importing this module imports ``verifiers`` (seconds): only the environment package does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import random
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, Literal

import verifiers.v1 as vf
from pydantic import Field, TypeAdapter, ValidationError, model_validator

from ._endpoint import Endpoint
from ._eval.token_ids import VERIFIERS_FIX, rollout_token_ids
from ._exceptions import ConfigurationError, TasksetError
from ._harness import DEFAULT_MAX_STEPS, NeMoGymHarness
from ._judge import judge_endpoint
from ._replay import ROW_HEADER
from ._result import RolloutResult
from ._tasks import NeMoGymTaskset, Task

# Only the ``verifiers.v1`` logger tree reaches vf-eval's log.
logger = logging.getLogger("verifiers.v1.nemo_gym_env")

ENVIRONMENT_ID = "nemo-gym-env"
"""The id verifiers knows this environment by (``vf-eval nemo-gym-env``)."""
INFO_KEY = "nemo_gym"
"""Where a rollout's Gym outcome lives on ``trace.info``."""


class GymTaskConfig(vf.TaskConfig):
    """Per-task knobs (none yet beyond verifiers' own)."""


class GymTasksetConfig(vf.TasksetConfig):
    """``--env.taskset.*``: which Gym environment and rows."""

    nemo_env: str = "example_multi_step"
    """The packaged NeMo Gym environment (``verifiers-nemo envs`` lists them)."""
    dataset: str | None = None
    """Another dataset of the environment, by name or type (default: its example dataset)."""
    jsonl_path: Path | None = None
    """Any JSONL file of Gym rows instead of the packaged data."""
    recorded: bool = False
    """Use the recorded rollouts (``example_rollouts.jsonl``): with ``verifiers-nemo replay-server``
    as the model, a GPU-free check of the whole chain that must reproduce the recorded rewards."""
    limit: int | None = Field(None, ge=1)
    """Read at most this many rows (verifiers' ``-n`` also bounds the run)."""
    shuffle: bool = False
    """Shuffle the rows (with ``seed``); with ``limit``, a uniform sample of that many."""
    seed: int = 0
    """The shuffle's seed."""
    gym_python: str | None = None
    """The interpreter with nemo-gym (default: ``VERIFIERS_NEMO_GYM_PYTHON``, else this one if it has nemo-gym,
    else a managed venv built once with uv, of the series ``VERIFIERS_NEMO_GYM_VERSION`` names or the newest a
    Python here can run). Its release runs the rollouts, and the packaged rows (recordings included) are that
    release's."""
    task: GymTaskConfig = GymTaskConfig()
    """verifiers' per-task keys (this package adds none)."""

    @model_validator(mode="after")
    def _check_environment(self) -> GymTasksetConfig:
        """Refuse what cannot run while verifiers is still reading its config: nothing has started.

        Only a config that names its environment or runtime is checked: verifiers first builds one from
        defaults alone (``vf-eval``'s ``narrow_config``), before the user's ``--env.taskset.gym-python`` is
        applied, and checking that one would look for (or build) a runtime the user did not ask for."""
        if self.nemo_env and self.model_fields_set & {"nemo_env", "gym_python"}:
            check_environment(self.nemo_env, self.gym_python)
        return self


def check_environment(nemo_env: str, gym_python: str | None) -> None:
    """Raise ``ValueError`` (what pydantic reports as a config error) naming the problem and the fix:
    no Gym runtime, an unknown environment (with close names). (A judge is the harness's config: checked
    when the env starts, see ``GymEnv.start``.)"""
    from ._exceptions import VerifiersNemoError
    from ._gym import get_environment, gym_root

    try:
        get_environment(nemo_env, gym_root(gym_python))
    except VerifiersNemoError as exc:
        raise ValueError(str(exc)) from None


class GymTaskData(vf.TaskData):
    """One Gym row: sent unchanged to the Gym agent's ``/run``."""

    row: dict[str, Any]
    example_id: str | None = None
    """The row's durable id in its file (verifiers 0.4.0 also shows it as ``id``; its later releases have none)."""
    nemo_env: str | None = None
    agent: str | None = None
    """The Gym agent instance that runs the row."""
    source: str = ""
    """``file:line`` the row came from."""
    recorded_row: int | None = None
    """Position of a recorded rollout in its file (names the row to the replay server)."""
    recorded_reward: float | None = None


class GymTask(vf.Task[GymTaskData, vf.State, GymTaskConfig]):
    """A Gym task: scored by the Gym resources server's own ``/verify`` (run by the Gym agent)."""

    @vf.reward(weight=1.0)
    async def nemo_gym(self, trace: vf.Trace) -> float:
        """Gym's reward for this rollout."""
        outcome = trace.info.get(INFO_KEY) or {}
        reward = outcome.get("reward")
        if reward is None:
            error = outcome.get("error") or {"type": "missing", "message": "the harness recorded no Gym outcome"}
            raise RuntimeError(f"no Gym reward: {error['type']}: {error['message']}")
        return float(reward)

    @vf.metric
    async def branches(self, trace: vf.Trace) -> float:
        """The training samples this rollout makes: 1 when every turn continued what was sampled, more where a turn
        forked (a training client whose renderer cannot bridge re-tokenizes sampled turns; docs/guides/train.md)."""
        return float(trace.num_branches)

    @vf.metric
    async def nemo_gym_metrics(self, trace: vf.Trace) -> dict[str, float]:
        """Every numeric field of Gym's ``/verify`` answer (other than the reward)."""
        outcome = trace.info.get(INFO_KEY) or {}
        return dict(outcome.get("metrics") or {})


class GymTaskset(vf.Taskset[GymTask, GymTasksetConfig]):
    """Rows of a packaged NeMo Gym environment (or any JSONL) as verifiers tasks."""

    def load(self) -> list[GymTask]:
        config = self.config
        tasks = _load_gym_tasks(config)
        if config.shuffle:
            random.Random(config.seed).shuffle(tasks)
        return [GymTask(task_data(task, config), config.task) for task in tasks]


def _load_gym_tasks(config: GymTasksetConfig) -> list[Task]:
    taskset = NeMoGymTaskset(
        config.nemo_env or None,
        dataset=config.dataset,
        jsonl_path=config.jsonl_path,
        recorded=config.recorded,
        limit=config.limit,
        gym_python=config.gym_python,  # the rows of the release GymEnv runs (the same gym_python)
    )
    return list(taskset)  # recorded: the recordings, runnable as they are


def task_data(task: Task, config: GymTasksetConfig) -> GymTaskData:
    recorded_reward = task.recorded_reward
    durable = {"id": str(task.example_id)} if "id" in vf.TaskData.model_fields else {}
    return GymTaskData(
        **durable,
        example_id=str(task.example_id),
        name=f"{task.env or Path(task.source).stem}:{task.example_id}",
        prompt=_prompt_messages(task.prompt, task.source),
        row=task.row,
        nemo_env=task.env,
        agent=task.agent_name,
        source=task.source,
        recorded_row=task.task_index if config.recorded else None,
        recorded_reward=float(recorded_reward) if isinstance(recorded_reward, int | float) else None,
    )


def _prompt_messages(messages: list[dict[str, Any]], source: str = "") -> list[Any]:
    """The row's input as verifiers messages, for display and traces (the Gym agent gets the row itself).

    Each message verifiers cannot type as it is becomes the nearest one it can: ``developer`` → ``system``, a
    tool output without its call id gets a placeholder id, content parts verifiers does not know (files,
    images in Gym's shape...) are shown as text. A row that still cannot be typed is refused, naming it."""
    try:
        return _MESSAGES.validate_python(messages)
    except ValidationError:
        pass
    shown = [_displayable(message, position) for position, message in enumerate(messages)]
    try:
        return _MESSAGES.validate_python(shown)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise TasksetError(
            f"{source or 'a Gym row'}: its input cannot be shown as verifiers messages "
            f"({'.'.join(map(str, first['loc']))}: {first['msg']}); its environment cannot run under verifiers."
        ) from None


_ROLES = {"developer": "system", "system": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


def _displayable(message: Any, position: int) -> dict[str, Any]:
    """One input message as the nearest verifiers message (see ``_prompt_messages``)."""
    if not isinstance(message, dict):
        return {"role": "user", "content": str(message)}
    try:
        return _MESSAGE.validate_python(message)
    except ValidationError:
        pass
    role = _ROLES.get(str(message.get("role")), "user")
    shown: dict[str, Any] = {"role": role, "content": _as_text(message.get("content"))}
    if role == "tool":
        call_id = message.get("tool_call_id") or message.get("call_id")
        shown["tool_call_id"] = str(call_id) if call_id else f"gym-unpaired-{position}"
    if role == "assistant" and message.get("tool_calls"):
        shown["tool_calls"] = message["tool_calls"]
        try:
            _MESSAGE.validate_python(shown)
        except ValidationError:
            shown["content"] = f"{shown['content']}\n[tool calls] {json.dumps(shown.pop('tool_calls'))}".strip()
    return shown


def _as_text(content: Any) -> str:
    if isinstance(content, list):
        return "\n".join(
            str(part.get("text") or part.get("content") or f"[{part.get('type', 'part')}]")
            for part in content
            if isinstance(part, dict)
        )
    return str(content or "")


_MESSAGES: TypeAdapter[list[Any]] = TypeAdapter(vf.Messages)
_MESSAGE: TypeAdapter[Any] = TypeAdapter(vf.Message)


ApiChoice = Literal["auto", "responses", "chat"]


class GymHarnessConfig(vf.HarnessConfig):
    """``--env.agent.harness.*``: how rollouts reach the model."""

    api: ApiChoice = "auto"
    """What the Gym agent's calls are sent to verifiers as: ``responses`` (passthrough), ``chat``
    (converted), or ``auto``: ``chat`` under a training client (prime-rl speaks chat only), else
    ``responses``."""
    timeout: float = Field(600.0, gt=0)
    """Seconds one rollout may take (Gym agent, tools, ``/verify``)."""
    max_steps: int | None = Field(DEFAULT_MAX_STEPS, ge=1)
    """Model calls per rollout for Gym agents that set no bound (``--env.agent.max-turns`` wins)."""
    isolated_venvs: bool = False
    """Give each Gym server its own venv with its requirements (slow first start)."""
    start_timeout: float | None = Field(None, gt=0)
    """Seconds the Gym stack's whole start may take (default ``VERIFIERS_NEMO_START_TIMEOUT``, else 600)."""
    judge_base_url: str | None = None
    """OpenAI-compatible base URL of the judge model, for environments that score with one."""
    judge_model: str | None = None
    """The model the judge server serves (with ``judge_base_url``)."""
    judge_api_key_var: str | None = None
    """NAME of the environment variable holding the judge's API key (default ``OPENAI_API_KEY``)."""
    judge_api: Literal["responses", "chat"] = "responses"
    """How the judge's calls reach its server: ``responses`` (passed through) or ``chat`` (converted to Chat
    Completions: a vLLM judge)."""
    ray: str | None = None
    """Run the Gym stacks on Ray actors: ``local`` (a cluster started here) or a cluster's address. The
    actors call verifiers' interception server, so they must reach it (actors on this machine do)."""
    ray_workers: int | None = Field(None, ge=1)
    """Ray actors (Gym stacks); default one per live node."""

    def judge_endpoint(self) -> Endpoint | None:
        """The judge as an ``Endpoint`` (its key read now), or None when none is configured."""
        if not self.judge_base_url and not self.judge_model:
            return None
        if not (self.judge_base_url and self.judge_model):
            raise ConfigurationError("judge-base-url and judge-model go together (the judge's URL and model).")
        return judge_endpoint(
            self.judge_base_url,
            self.judge_model,
            api_key_var=self.judge_api_key_var,
            api=self.judge_api,
            key_option="--env.agent.harness.judge-api-key-var",
        )


class GymHarness(vf.Harness[GymHarnessConfig]):
    """Runs a Gym task through the process's persistent Gym stack, in-process.

    The Gym agent's policy calls go through our routing proxy to the endpoint verifiers hands this
    rollout (its interception server), with the rollout's own secret."""

    APPENDS_SYSTEM_PROMPT: ClassVar[bool] = True
    EXECUTES_CODE: ClassVar[bool] = False
    NEEDS_CONTAINER: ClassVar[bool] = False

    async def launch(
        self,
        ctx: vf.ModelContext,
        trace: vf.Trace,
        runtime: vf.Runtime,
        endpoint: str,
        secret: str,
        mcp_urls: dict[str, str],
        data: vf.TaskData,
        **_: Any,
    ) -> vf.ProgramResult:
        if not isinstance(data, GymTaskData):
            data = GymTaskData.model_validate(data.model_dump())
        harness = await _shared_harness(data.nemo_env, self.config, gym_python=None)
        result = await harness.rollout(_gym_task(data), self._endpoint(ctx, endpoint, secret, data))
        trace.info[INFO_KEY] = {**_outcome(result), "nemo_gym_version": getattr(harness, "gym_version", None)}
        ROLLOUT_RESULTS.put(trace.id, result)
        if result.masked and trace.agent is not None:
            # Gym says this reward is no valid measurement (mask_sample): verifiers' own flag for a trace whose
            # tokens must not train the policy (its dashboard also leaves untrainable traces out of its means).
            trace.agent.trainable = False
        if result.error is not None:
            return vf.ProgramResult(exit_code=1, stdout="", stderr=f"{result.error.type}: {result.error.message}")
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")

    def _endpoint(self, ctx: vf.ModelContext, endpoint: str, secret: str, data: GymTaskData) -> Endpoint:
        base_url = endpoint.rstrip("/")
        if not base_url.endswith("/v1"):
            base_url += "/v1"
        headers = {ROW_HEADER: str(data.recorded_row)} if data.recorded_row is not None else {}
        return Endpoint(
            base_url=base_url,
            model=ctx.model,
            api_key=secret,
            api=resolve_api(self.config.api, ctx),
            extra_headers=headers,
            name=f"verifiers:{ctx.model}",
        )


def resolve_api(choice: ApiChoice, ctx: Any) -> Literal["responses", "chat"]:
    """``auto`` is ``chat`` under a training client (prime-rl's speaks chat only), else ``responses``; ``responses``
    under a training client is refused (``ConfigurationError``: its every call would fail)."""
    training = isinstance(getattr(ctx, "client", None), vf.TrainClientConfig)
    if choice == "responses" and training:
        raise ConfigurationError(
            "verifiers' training client (client.type = train) speaks Chat Completions only, and this harness is set "
            'to the Responses API: leave --env.agent.harness.api at "auto" or set it to "chat".'
        )
    if choice != "auto":
        return choice
    return "chat" if training else "responses"


def _gym_task(data: GymTaskData) -> Task:
    return Task(
        task_index=data.idx or 0,
        rollout_index=0,
        row=data.row,
        agent_name=data.agent,
        env=data.nemo_env,
        example_id=data.example_id or str(data.idx),
        source=data.source,
        recorded=data.recorded_row is not None,
    )


def _outcome(result: RolloutResult) -> dict[str, Any]:
    outcome: dict[str, Any] = {
        "reward": result.reward,
        "metrics": {k: v for k, v in result.metrics.items() if isinstance(v, int | float) and math.isfinite(v)},
        "error": result.error.to_dict() if result.error is not None else None,
        "masked": result.masked,
        "failure_kind": result.failure_kind,
        "failure_reason": result.failure_reason,
        "env": result.env,
        "agent": result.agent,
        "policy_calls": len(result.trace),
        "timing": result.timing,
        "worker": result.worker,
    }
    token_ids = rollout_token_ids(result.trace)
    if token_ids is not None:  # token IDs recorded: whether they are one training sample, else where they broke
        outcome["token_ids"] = token_ids if token_ids["contiguous"] else {**token_ids, "fix": VERIFIERS_FIX}
    return outcome


class GymEnvConfig(vf.EnvConfig):
    """The environment's config: one ``agent`` seat, run in-process (local subprocess runtime)."""

    agent: vf.AgentConfig = vf.AgentConfig(runtime=vf.SubprocessConfig(), harness=GymHarnessConfig(id=ENVIRONMENT_ID))
    """The one seat. Its harness is ours by default, so ``--env.agent.harness.api chat`` needs no
    ``--env.agent.harness.id``."""


class GymEnv(vf.Env[GymEnvConfig]):
    """The single-agent env over Gym tasks; owns the persistent Gym stack (``start``/``stop``)."""

    async def run(self, task: vf.Task, agents: vf.Agents) -> None:
        await agents.agent.run(task)

    async def start(self) -> None:
        _forward_logs_to_verifiers()
        taskset = self.taskset
        if not isinstance(taskset, GymTaskset):
            return
        harness = self._harnesses.get("agent")
        config = harness.config if isinstance(harness, GymHarness) else GymHarnessConfig()
        max_turns = self.config.agent.max_turns
        if max_turns is not None:
            # verifiers' interception refuses calls past max_turns, so the Gym agent would never
            # reach /verify: bound Gym's own steps instead.
            config = config.model_copy(update={"max_steps": max_turns})
        _refuse_policy_judge_without_judge(taskset.config.nemo_env, taskset.config.gym_python, config)
        try:
            self._gym = await _shared_harness(
                taskset.config.nemo_env or None, config, gym_python=taskset.config.gym_python, start=True
            )
        except ConfigurationError as exc:
            if "judge" not in str(exc) or _JUDGE_FLAGS in str(exc):
                raise
            raise ConfigurationError(f"{exc} With verifiers: {_JUDGE_FLAGS}.") from None

    async def stop(self) -> None:
        gym = getattr(self, "_gym", None)
        if gym is not None:
            self._gym = None
            await _release_harness(gym)


_JUDGE_FLAGS = (
    "--env.agent.harness.judge-base-url URL --env.agent.harness.judge-model MODEL "
    "[--env.agent.harness.judge-api-key-var VAR] [--env.agent.harness.judge-api chat]"
)


def _refuse_policy_judge_without_judge(nemo_env: str, gym_python: str | None, config: GymHarnessConfig) -> None:
    """An env whose judge is the policy needs a judge of its own here: its calls would otherwise go through
    verifiers' interception and be recorded as turns of the rollout (the same server may serve both)."""
    from ._gym import get_environment, gym_root
    from ._judge.router import JudgeRouter

    if not nemo_env:
        return
    root = gym_root(gym_python)
    env = get_environment(nemo_env, root)
    if env.default_config is not None:
        router = JudgeRouter(nemo_env, config.judge_endpoint())
        router.check((env.default_config.path,), root, policy_may_judge=False, hint=f"{_JUDGE_FLAGS}.")


class _ToVerifiersLog(logging.Handler):
    """Hands our records to verifiers' logger tree where verifiers owns its output (vf-eval: its library logger
    keeps its records, ``propagate`` off); elsewhere (our own CLI's training check) that tree ends at the root logger,
    which has our records already."""

    def emit(self, record: logging.LogRecord) -> None:
        if not logging.getLogger("verifiers.v1").propagate:
            logger.handle(record)


def _forward_logs_to_verifiers() -> None:
    ours = logging.getLogger("verifiers_nemo")
    if not any(isinstance(handler, _ToVerifiersLog) for handler in ours.handlers):
        ours.addHandler(_ToVerifiersLog())
        ours.setLevel(logger.getEffectiveLevel())


class RolloutResults:
    """The ``RolloutResult`` of each rollout this process's ``GymHarness`` ran, by trace id, kept only while someone
    in this process runs verifiers episodes and reads them back (the eval's training-client runner: ``keep()``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keepers = 0
        self._results: dict[str, RolloutResult] = {}

    def put(self, trace_id: str, result: RolloutResult) -> None:
        with self._lock:
            if self._keepers:
                self._results[trace_id] = result

    def take(self, trace_id: str) -> RolloutResult | None:
        with self._lock:
            return self._results.pop(trace_id, None)

    def keep(self) -> contextlib.AbstractContextManager[None]:
        @contextlib.contextmanager
        def keeping() -> Iterator[None]:
            with self._lock:
                self._keepers += 1
            try:
                yield
            finally:
                with self._lock:
                    self._keepers -= 1
                    if not self._keepers:
                        self._results.clear()

        return keeping()


ROLLOUT_RESULTS = RolloutResults()


# -- one NeMoGymHarness per (environment, options) in this process --------------------------------

_registry_lock = threading.Lock()
_registry: dict[str | None, tuple[NeMoGymHarness, int]] = {}


async def _shared_harness(
    nemo_env: str | None, config: GymHarnessConfig, *, gym_python: str | None, start: bool = False
) -> NeMoGymHarness:
    """The process's harness for ``nemo_env``: the one ``GymEnv.start`` configured, else a default
    one (a harness paired with another env). ``start=True`` takes a reference and starts the stack."""
    if nemo_env is None:
        raise ConfigurationError("a Gym task without nemo_env needs the nemo-gym-env environment's taskset")
    with _registry_lock:
        entry = _registry.get(nemo_env)
        if entry is None:
            options: dict[str, Any] = {
                "gym_python": gym_python,
                "isolated_venvs": config.isolated_venvs,
                "max_steps": config.max_steps,
                "timeout": config.timeout,
                "start_timeout": config.start_timeout,
                "judge": config.judge_endpoint(),
            }
            if config.ray is not None:
                from ._scale import NeMoGymPool

                harness: Any = NeMoGymPool(nemo_env, ray=config.ray, workers=config.ray_workers, **options)
            else:
                harness = NeMoGymHarness(nemo_env, **options)
            entry = (harness, 0)
        harness, refs = entry
        _registry[nemo_env] = (harness, refs + 1 if start else refs)
    if start:
        await harness.astart()
    return harness


def shared_harness(nemo_env: str) -> NeMoGymHarness | None:
    """The process's harness for ``nemo_env`` when one is registered (its judge calls, for an eval's summary)."""
    with _registry_lock:
        entry = _registry.get(nemo_env)
    return entry[0] if entry is not None else None


async def _release_harness(harness: NeMoGymHarness) -> None:
    with _registry_lock:
        for name, (candidate, refs) in list(_registry.items()):
            if candidate is harness:
                if refs > 1:
                    _registry[name] = (candidate, refs - 1)
                    return
                del _registry[name]
    await asyncio.shield(harness.aclose())


__all__ = ["GymEnv", "GymEnvConfig", "GymHarness", "GymHarnessConfig", "GymTask", "GymTaskData", "GymTaskset"]
