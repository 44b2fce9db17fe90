"""``TrainingClientRunner``: an eval's rollouts run the way prime-rl trains.

Each environment is verifiers' own environment (``nemo-gym-env``, loaded with ``vf.load_environment``) served in this
process, and each rollout is one verifiers episode (``env.run_slot``, what verifiers' env-server workers and its
in-process eval run) whose model client is verifiers' training client: a ``renderers`` renderer turns every prompt
into token IDs, an engine samples from ``/inference/v1/generate`` (a real one at ``-b``, or the ``ReplayEngine``
playing the recorded rollouts as tokens), and the turns are recorded as a message graph. Each result carries Gym's
outcome as every eval's does, and ``training``: the samples the rollout makes and where it forked
(``forks.training_record``). An engine reply the client cannot read at all (``refusals.run_ending``: its shape)
ends the run at the first rollout that meets it, in one line naming the versions installed and the fix.

It stands where a ``NeMoGymHarness`` stands in an eval (``astart``, ``run``, ``aclose``, the judge calls), so the
run's tasks, results folder, summary, progress and report are the same code for both clients.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from .._dispatch import check_concurrency, stream_rollouts
from .._exceptions import ConfigurationError, VerifiersEpisodeError
from .._result import RolloutResult
from .._upstreams.refusals import run_ending
from .renderer_spec import RendererSpec, build_renderer

if TYPE_CHECKING:
    from .._endpoint import Endpoint
    from .._tasks import Task
    from .engine import GenerateShape, ReplayEngine

logger = logging.getLogger(__name__)

REPLAY_KEY_VAR = "VERIFIERS_NEMO_REPLAY_ENGINE_KEY"
"""The API key variable of a replay engine's client (unset: no key, the engine asks for none)."""


@dataclass(frozen=True)
class TrainingSetup:
    """What the training client of an eval is: its renderer, and the engine it samples from (``base_urls`` of a
    real engine's roots, or None for the replay engine), with its API key variable and model."""

    renderer: RendererSpec
    model: str
    base_urls: tuple[str, ...] | None = None
    api_key_var: str | None = None
    generate_shape: str = "vllm-0.31"
    """The replay engine's generate reply shape (``engine.GENERATE_SHAPES``; a real engine answers in its own)."""


class TrainingClientRunner:
    """Runs eval tasks as verifiers episodes under its training client (see the module docstring).

    ``env_configs``: each Gym environment's verifiers env config (``taskset`` and ``agent.harness`` tables as a
    user writes them for ``vf-eval nemo-gym-env`` or prime-rl's ``[[orchestrator.train.source]]``)."""

    def __init__(self, setup: TrainingSetup, env_configs: Mapping[str, dict[str, Any]]) -> None:
        try:
            import verifiers.v1  # noqa: F401
        except ImportError as exc:
            raise ConfigurationError(
                f"--client-type train runs verifiers' training client, and verifiers is not installed here ({exc}): "
                "run it from a venv with 'verifiers-nemo[verifiers]' and nemo-gym-env (without nemo-gym: the Gym "
                "runtime lives apart, VERIFIERS_NEMO_GYM_PYTHON or the one the harness builds)."
            ) from None
        self.setup = setup
        self.env_configs = dict(env_configs)
        self.engine: ReplayEngine | None = None
        self._envs: dict[str, Any] = {}
        self._stack = contextlib.AsyncExitStack()
        self._renderer: Any = None
        self._tokenizer: Any = None
        self._next_replica = 0

    # -- the eval's harness interface -----------------------------------------------------------

    def add_secrets(self, *secrets: str) -> None:
        """Keys stay in this process: verifiers' client reads its key from its variable; Gym never sees it."""

    def judge_label(self, name: str) -> str:
        for harness in self._gym_harnesses():
            return harness.judge_label(name)
        return name

    def judge_calls(self) -> dict[str, list[Any]]:
        calls: dict[str, list[Any]] = {}
        for harness in self._gym_harnesses():
            for name, taken in harness.judge_calls().items():
                calls.setdefault(name, []).extend(taken)
        return calls

    def _gym_harnesses(self) -> list[Any]:
        from .._verifiers_v1 import shared_harness

        return [h for h in (shared_harness(name) for name in self._envs) if h is not None]

    @property
    def renderer(self) -> Any:
        """The renderer (built once): the replay engine writes turns with it, fork reports decode with it."""
        if self._renderer is None:
            self._renderer, self._tokenizer = build_renderer(self.setup.renderer, self.setup.model)
        return self._renderer

    def use_judge(self, nemo_env: str, judge: Endpoint) -> None:
        """Answer ``nemo_env``'s judge calls at ``judge`` (the replay server's recorded judge answers)."""
        from .env_config import judge_fields

        harness = self.env_configs[nemo_env]["agent"]["harness"]
        harness.update(judge_fields({"base_url": judge.base_url, "model": judge.model, "api": judge.api}))

    def use_replay(self, tasks: Iterable[Task]) -> None:
        """Sample from a replay engine of ``tasks``' recordings (their first rollouts)."""
        from .engine import ReplayEngine

        self.engine = ReplayEngine.from_tasks(
            tasks, self.renderer, self.setup.model, shape=cast("GenerateShape", self.setup.generate_shape)
        )

    async def astart(self) -> None:
        """Load each environment through verifiers and bring it up (its Gym stack included)."""
        import verifiers.v1 as vf

        if self.engine is not None:
            self.engine.start()
        else:
            _ = self.renderer  # a missing tokenizer fails now, not at the first rollout
        try:
            for name, config in self.env_configs.items():
                env = vf.load_environment(vf.resolve_env_config(config))
                await self._stack.enter_async_context(env.serving())
                self._envs[name] = env
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        try:
            await self._stack.aclose()
        finally:
            self._envs.clear()
            if self.engine is not None:
                self.engine.stop()

    async def run(
        self,
        tasks: Iterable[Task],
        endpoints: Endpoint | list[Endpoint] | Callable[[Task], Endpoint] | None = None,
        *,
        concurrency: int = 32,
        sampling_args: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> AsyncIterator[RolloutResult]:
        """Run ``tasks`` as episodes, at most ``concurrency`` at once; yield each result as it finishes
        (``endpoints`` is unused: the training client's engine is this runner's)."""
        import verifiers.v1 as vf

        from .._verifiers_v1 import ROLLOUT_RESULTS

        check_concurrency(concurrency)
        sampling = vf.SamplingConfig.model_validate(_verifiers_sampling(sampling_args or {}))
        with ROLLOUT_RESULTS.keep():
            async with contextlib.aclosing(
                stream_rollouts(tasks, lambda task: self._episode(task, sampling), concurrency)
            ) as stream:
                async for result in stream:
                    yield result

    # -- one rollout ------------------------------------------------------------------------------

    def _client(self, task: Task) -> Any:
        import verifiers.v1 as vf

        setup = self.setup
        if self.engine is not None:
            base_url, key_var = self.engine.endpoint_for(task.task_index), REPLAY_KEY_VAR
        else:
            assert setup.base_urls
            base_url = setup.base_urls[self._next_replica % len(setup.base_urls)]
            self._next_replica += 1
            key_var = setup.api_key_var or "OPENAI_API_KEY"
        return vf.TrainClientConfig(base_url=base_url, api_key_var=key_var, **setup.renderer.client_fields())

    async def _episode(self, task: Task, sampling: Any) -> RolloutResult:
        import verifiers.v1 as vf

        from .._verifiers_v1 import ROLLOUT_RESULTS, task_data

        env = self._envs[task.env or next(iter(self._envs))]
        task_cls = type(env.taskset).task_type()
        data_cls = task_cls.data_type()
        # The task crosses the wire as prime-rl's orchestrator sends it to an env server: its data dumped as JSON,
        # validated back into the taskset's own types.
        wire = task_data(task, env.taskset.config).model_dump(mode="json")
        episode_task = task_cls(data_cls.model_validate(wire), env.config.taskset.task)
        ctx = vf.ModelContext(client=self._client(task), model=self.setup.model, sampling=sampling)
        (slot,) = env.slots(episode_task)
        episode = await env.run_slot(slot, ctx)
        trace = episode.traces[0] if episode.traces else None
        result = ROLLOUT_RESULTS.take(trace.id) if trace is not None else None
        if result is None:
            result = RolloutResult(task_index=task.task_index, rollout_index=0, env=task.env, prompt=list(task.prompt))
        result.task_index, result.rollout_index = task.task_index, task.rollout_index
        result.example_id = task.example_id
        result.endpoint = self._endpoint_label()
        result.training = self._training(trace) if trace is not None else {"branches": 0, "samples": 0, "turns": 0}
        if result.error is None and not episode.ok:
            result.error = VerifiersEpisodeError(_episode_error(episode, trace))
            result.reward = None
        refusal = run_ending(str(result.error)) if result.error is not None else None
        if refusal is not None:  # every call of every rollout would fail the same way: one line, no more rollouts
            raise ConfigurationError(f"the engine's reply ended the run: {refusal.describe()}")
        return result

    def _training(self, trace: Any) -> dict[str, Any]:
        from .forks import training_record

        tokenizer = self._tokenizer
        decode = None if tokenizer is None else lambda ids: tokenizer.decode(ids, skip_special_tokens=False)
        record = training_record(trace, decode)
        if self.engine is not None:
            notes = self.engine.take_notes(trace.id)
            if notes.unfaithful:
                record["replay_unfaithful"] = notes.unfaithful
            if notes.exhausted:
                record["replay_exhausted"] = True
        return record

    def _endpoint_label(self) -> str:
        where = "replay engine" if self.engine is not None else ",".join(self.setup.base_urls or ())
        return f"{self.setup.model}@{where} (training client, renderer {self.setup.renderer.name})"


def _episode_error(episode: Any, trace: Any) -> str:
    errors = [*(getattr(trace, "errors", None) or ()), *(episode.errors or ())]
    if not errors:
        return "verifiers ended the episode as failed without an error"
    first = errors[0]
    return f"{getattr(first, 'type', type(first).__name__)}: {getattr(first, 'message', first)}"


_SAMPLING_RENAMES = {"max_output_tokens": "max_tokens"}


def _verifiers_sampling(sampling_args: Mapping[str, Any]) -> dict[str, Any]:
    """The eval's sampling args as verifiers' ``SamplingConfig`` (``-t`` is ``max_tokens``; ``return_tokens`` is the
    endpoint client's own switch: the training client always has token IDs)."""
    out = {_SAMPLING_RENAMES.get(k, k): v for k, v in sampling_args.items() if k != "return_tokens"}
    return out


__all__ = ["TrainingClientRunner", "TrainingSetup"]
