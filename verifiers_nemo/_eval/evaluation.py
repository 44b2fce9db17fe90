"""The eval run behind ``verifiers-nemo eval``: settings, orchestration, statistics, results folder, resume.

Statistics are pure functions of result records (the dicts written to ``results.jsonl``), so a
resumed run summarises old and new rollouts alike. Orchestration reports progress through a small
observer interface; the console belongs to the CLI.
"""

from __future__ import annotations

import contextlib
import difflib
import fcntl
import inspect
import json
import logging
import math
import os
import re
import secrets
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal, Protocol

from .._endpoint import register_api_key
from .._exceptions import ConfigurationError

if TYPE_CHECKING:
    from .._endpoint import Endpoint
    from .._environment import NeMoGymEnv
    from .._result import RolloutResult
    from .._tasks.taskset import Task
    from .._upstreams.replay import ReplayUpstream

logger = logging.getLogger(__name__)

Policy = Literal["replay", "endpoint"]
Pair = tuple[int, int]

ENV_PACKAGE = "nemo-gym-env"
"""The installable environment package; its Gym environment comes from ``env_args["nemo_env"]``."""
REPLAY_MODEL = "replay"
RESULTS_FILE = "results.jsonl"
METADATA_FILE = "metadata.json"
DEFAULT_OUTPUT_DIR = Path("outputs") / "evals"
# Arguments the eval command sets itself; env args may not set them.
_OWNED_ARGS = frozenset({"num_examples", "rollouts_per_example", "recorded", "timeout", "taskset", "root"})
_UNSAFE_PATH_CHARS = re.compile(r"[^A-Za-z0-9._=+-]+")


# ---------------------------------------------------------------------------------------------
# Settings


@dataclass
class EvalSettings:
    """Everything that defines an eval run; saved in ``metadata.json`` (it never holds a secret)."""

    env: str
    """What the user named: a packaged Gym environment, or ``nemo-gym-env``."""
    nemo_env: str
    """The packaged Gym environment that runs."""
    policy: Policy
    model: str
    base_url: str | None = None
    api: Literal["responses", "chat"] = "responses"
    api_key_var: str | None = None
    """The *name* of the environment variable holding the API key."""
    num_examples: int | None = None
    rollouts_per_example: int = 1
    max_concurrent: int = 32
    sampling_args: dict[str, Any] = field(default_factory=dict)
    env_args: dict[str, Any] = field(default_factory=dict)
    timeout: float = 600.0
    pass_threshold: float = 0.5
    save_trace: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EvalSettings:
        """Settings as saved by ``to_dict`` (unknown keys are ignored, so older folders still load)."""
        known = {f.name for f in fields(cls)}
        try:
            return cls(**{k: v for k, v in data.items() if k in known})
        except TypeError as exc:
            raise ConfigurationError(f"the saved settings are incomplete: {exc}") from None


# Settings that decide which rollouts exist and what they mean: fixed for the life of a results folder.
RUN_DEFINING = (
    "env",
    "nemo_env",
    "policy",
    "model",
    "api",
    "num_examples",
    "rollouts_per_example",
    "sampling_args",
    "env_args",
    "save_trace",
)


def env_arg_names() -> frozenset[str]:
    """The keys ``-a`` accepts: ``load_environment``'s and ``NeMoGymHarness``'s keyword arguments."""
    from .._environment import load_environment
    from .._harness import NeMoGymHarness

    names = set(inspect.signature(load_environment).parameters)
    names |= set(inspect.signature(NeMoGymHarness.__init__).parameters)
    names -= {"self", "harness_args"}
    return frozenset(names - _OWNED_ARGS)


def check_env_args(env_args: Mapping[str, Any]) -> None:
    """Every ``-a`` key is one the environment takes (else one error listing the accepted keys)."""
    accepted = env_arg_names() | {"nemo_env"}
    for key in env_args:
        if key in _OWNED_ARGS:
            raise ConfigurationError(
                f"-a: {key!r} is set by the eval command's flags (-n, -r, --timeout, --policy); use those."
            )
        if key not in accepted:
            close = difflib.get_close_matches(key, sorted(accepted), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigurationError(
                f"-a: unknown environment arg {key!r}{hint}. Accepted: {', '.join(sorted(accepted))}."
            )


def resolve_nemo_env(env: str, env_args: Mapping[str, Any]) -> str:
    """The Gym environment an ENV argument names (``nemo-gym-env`` reads ``env_args["nemo_env"]``)."""
    if env in (ENV_PACKAGE, ENV_PACKAGE.replace("-", "_")):
        nemo_env = env_args.get("nemo_env")
        if not isinstance(nemo_env, str) or not nemo_env:
            raise ConfigurationError(
                f'{env} needs the Gym environment to run: pass -a \'{{"nemo_env": "example_multi_step"}}\' '
                "(`verifiers-nemo envs` lists them)."
            )
        return nemo_env
    if "nemo_env" in env_args and env_args["nemo_env"] != env:
        raise ConfigurationError(
            f"-a sets nemo_env={env_args['nemo_env']!r} but ENV is {env!r}; name one environment "
            f"(use ENV {ENV_PACKAGE} with -a nemo_env, or drop nemo_env from -a)."
        )
    return env


# ---------------------------------------------------------------------------------------------
# Statistics (pure)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one example: the chance that at least one of k of its n samples is correct."""
    _check_nck(n, c, k)
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_power_k(n: int, c: int, k: int) -> float:
    """Unbiased pass^k of one example: the chance that all k of k of its n samples are correct."""
    _check_nck(n, c, k)
    return math.comb(c, k) / math.comb(n, k)


def _check_nck(n: int, c: int, k: int) -> None:
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")


def powers_of_two_up_to(r: int) -> list[int]:
    """1, 2, 4, ... up to ``r`` (the k of pass@k for r rollouts per example)."""
    ks, k = [], 1
    while k <= r:
        ks.append(k)
        k *= 2
    return ks


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _mean(values: Sequence[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def summarize(
    records: Iterable[Mapping[str, Any]],
    *,
    rollouts_per_example: int,
    pass_threshold: float = 0.5,
) -> dict[str, Any]:
    """Summary statistics of result records (``results.jsonl`` lines).

    Errored rollouts (``error`` set, ``reward`` None) are left out of every reward statistic and
    counted by type. pass@k / pass^k (k = powers of two up to ``rollouts_per_example``) use the
    unbiased estimators per example over its scored rollouts, correct meaning reward >= threshold,
    averaged over the examples that have at least k scored rollouts.
    """
    records = list(records)
    rewards: list[float] = []
    by_index: dict[int, list[float]] = defaultdict(list)
    by_task: dict[int, list[float]] = defaultdict(list)
    metric_values: dict[str, list[float]] = defaultdict(list)
    errors: Counter[str] = Counter()
    error_examples: dict[str, str] = {}
    usage: Counter[str] = Counter()
    latencies: list[float] = []
    tasks: set[int] = set()
    for record in records:
        task_index = int(record["task_index"])
        tasks.add(task_index)
        for key, value in (record.get("usage") or {}).items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                usage[key] += value
        latency = (record.get("timing") or {}).get("rollout_s")
        if isinstance(latency, int | float):
            latencies.append(float(latency))
        error = record.get("error")
        reward = record.get("reward")
        if error or reward is None:
            kind = str(error.get("type", "error")) if isinstance(error, dict) else "error"
            errors[kind] += 1
            if kind not in error_examples:
                message = error.get("message") if isinstance(error, dict) else error
                error_examples[kind] = _clip(str(message or "the rollout has no reward"), 200)
            continue
        reward = float(reward)
        rewards.append(reward)
        by_index[int(record["rollout_index"])].append(reward)
        by_task[task_index].append(reward)
        for name, value in (record.get("metrics") or {}).items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                metric_values[name].append(float(value))

    pass_at: dict[str, float] = {}
    pass_power: dict[str, float] = {}
    pass_examples: dict[str, int] = {}
    for k in powers_of_two_up_to(rollouts_per_example):
        eligible = [(len(v), sum(r >= pass_threshold for r in v)) for v in by_task.values() if len(v) >= k]
        if not eligible:
            continue
        pass_at[str(k)] = _mean([pass_at_k(n, c, k) for n, c in eligible])  # type: ignore[assignment]
        pass_power[str(k)] = _mean([pass_power_k(n, c, k) for n, c in eligible])  # type: ignore[assignment]
        pass_examples[str(k)] = len(eligible)

    return {
        "rollouts": {
            "total": len(records),
            "scored": len(rewards),
            "errored": sum(errors.values()),
            "examples": len(tasks),
        },
        "reward": {
            "avg": _mean(rewards),
            "std": statistics.pstdev(rewards) if rewards else None,
            "min": min(rewards) if rewards else None,
            "max": max(rewards) if rewards else None,
        },
        "reward_by_rollout_index": [
            _mean(by_index.get(i, [])) for i in range(max([rollouts_per_example, *(k + 1 for k in by_index)]))
        ],
        "pass_threshold": pass_threshold,
        "pass_at_k": pass_at,
        "pass_power_k": pass_power,
        "pass_k_examples": pass_examples,
        "metrics": {name: _mean(values) for name, values in sorted(metric_values.items())},
        "errors_by_type": dict(errors.most_common()),
        "error_examples": {kind: error_examples[kind] for kind in errors},
        "usage": dict(sorted(usage.items())),
        "latency": {
            "mean_rollout_s": _mean(latencies),
            "max_rollout_s": max(latencies) if latencies else None,
        },
    }


def replay_agreement(
    records: Iterable[Mapping[str, Any]],
    tolerance: float = 1e-6,
    known: Callable[[int], str | None] | None = None,
) -> dict[str, Any] | None:
    """How many replayed rollouts reproduced their recorded reward (None when none was replayed).

    An errored rollout counts as not reproduced. Rollouts of a recording known not to reproduce
    (``known(task_index)`` gives why) are left out of the comparison and listed under ``known``.
    """
    compared, mismatches, known_rows = 0, [], []
    for record in records:
        if "recorded_reward" not in record:
            continue
        reason = known(int(record["task_index"])) if known is not None else None
        if reason:
            known_rows.append(
                {"task_index": record["task_index"], "rollout_index": record["rollout_index"], "reason": reason}
            )
            continue
        compared += 1
        reward, recorded = record.get("reward"), record.get("recorded_reward")
        try:
            same = reward is not None and abs(float(reward) - float(recorded)) <= tolerance  # type: ignore[arg-type]
        except (TypeError, ValueError):
            same = False
        if not same:
            mismatches.append(
                {
                    "task_index": record["task_index"],
                    "rollout_index": record["rollout_index"],
                    "reward": reward,
                    "recorded_reward": recorded,
                }
            )
    if not compared and not known_rows:
        return None
    agreement: dict[str, Any] = {
        "compared": compared,
        "reproduced": compared - len(mismatches),
        "mismatches": mismatches[:20],
    }
    if known_rows:
        agreement["known_unreproducible"] = sorted(known_rows, key=lambda r: (r["task_index"], r["rollout_index"]))
    return agreement


# ---------------------------------------------------------------------------------------------
# Results folder and resume bookkeeping


def run_folder_name(env: str, model: str) -> str:
    """``<env>--<model>`` with ``/`` as ``--`` and anything unsafe in a path as ``_``."""
    return f"{_safe(env)}--{_safe(model.replace('/', '--'))}"


def _safe(text: str) -> str:
    return _UNSAFE_PATH_CHARS.sub("_", text).strip("._") or "_"


def new_run_id() -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def missing_pairs(expected: Iterable[Pair], records: Iterable[Mapping[str, Any]]) -> list[Pair]:
    """The expected (task_index, rollout_index) pairs no record covers, in expected order."""
    done = {(int(r["task_index"]), int(r["rollout_index"])) for r in records}
    return [pair for pair in expected if pair not in done]


def dedupe_records(
    records: Iterable[Mapping[str, Any]], expected: set[Pair] | None = None
) -> tuple[list[dict[str, Any]], int, int]:
    """Records keeping the first of each pair and (when given) only expected pairs.

    Returns ``(kept, duplicates, unexpected)``.
    """
    seen: set[Pair] = set()
    kept, duplicates, unexpected = [], 0, 0
    for record in records:
        pair = (int(record["task_index"]), int(record["rollout_index"]))
        if expected is not None and pair not in expected:
            unexpected += 1
        elif pair in seen:
            duplicates += 1
        else:
            seen.add(pair)
            kept.append(dict(record))
    return kept, duplicates, unexpected


def read_results(path: Path, *, repair: bool = False) -> tuple[list[dict[str, Any]], bool]:
    """Records of a ``results.jsonl``; returns ``(records, truncated_tail)``.

    A last line cut short (the run was killed mid-write) is tolerated, and with ``repair`` cut off
    the file so new lines append cleanly. A bad line anywhere else is an error naming file:line.
    """
    if not path.exists():
        return [], False
    lines = path.read_bytes().split(b"\n")
    records: list[dict[str, Any]] = []
    good_end = 0  # byte offset just past the last good line
    truncated = False
    for number, line in enumerate(lines, start=1):
        if line.strip():
            try:
                record = json.loads(line)
                if not isinstance(record, dict) or "task_index" not in record or "rollout_index" not in record:
                    raise ValueError("not a rollout record (no task_index/rollout_index)")
            except ValueError as exc:
                if any(rest.strip() for rest in lines[number:]):
                    raise ConfigurationError(
                        f"{path}:{number} is not a valid result line ({exc}). Delete that line (its rollout "
                        "then runs again when the run is resumed) or fix it, then resume."
                    ) from None
                truncated = True
                break
            records.append(record)
        good_end += len(line) + 1
    if repair:
        with open(path, "r+b") as f:
            size = f.seek(0, os.SEEK_END)
            if truncated:
                logger.warning("%s: dropping a truncated last line (the run was cut off writing it)", path)
                f.truncate(good_end)
                size = good_end
            if size:
                f.seek(size - 1)
                if f.read(1) != b"\n":
                    f.write(b"\n")
    return records, truncated


class ResultsFolder:
    """``<output-dir>/<env>--<model>/<run id>/``: ``results.jsonl`` and ``metadata.json``.

    Open for writing, it holds an exclusive lock on ``results.jsonl`` so two runs never write the
    same folder at once.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: IO[str] | None = None

    @property
    def results_path(self) -> Path:
        return self.path / RESULTS_FILE

    @property
    def metadata_path(self) -> Path:
        return self.path / METADATA_FILE

    @property
    def run_id(self) -> str:
        return self.path.name

    @classmethod
    def create(cls, output_dir: Path, env: str, model: str) -> ResultsFolder:
        parent = output_dir / run_folder_name(env, model)
        for _ in range(5):
            path = parent / new_run_id()
            try:
                path.mkdir(parents=True)
            except FileExistsError:
                continue
            except OSError as exc:
                raise ConfigurationError(f"cannot create the results folder {path}: {exc.strerror}") from None
            return cls(path)
        raise ConfigurationError(f"cannot find a fresh run folder name under {parent}")

    @classmethod
    def existing(cls, path: Path) -> ResultsFolder:
        """A folder to resume; it must hold ``metadata.json``."""
        folder = cls(path)
        if not folder.metadata_path.is_file():
            hint = ""
            if path.is_dir():
                runs = sorted(p.parent.name for p in path.glob(f"*/{METADATA_FILE}"))
                if runs:
                    hint = f" It holds runs: {', '.join(runs[-5:])}; pass one of them."
            raise ConfigurationError(f"-R {path}: no {METADATA_FILE} there, so it is no eval results folder.{hint}")
        return folder

    def read_metadata(self) -> dict[str, Any]:
        try:
            data = json.loads(self.metadata_path.read_text())
        except (OSError, ValueError) as exc:
            raise ConfigurationError(f"cannot read {self.metadata_path}: {exc}") from None
        if not isinstance(data, dict) or not isinstance(data.get("settings"), dict):
            raise ConfigurationError(f"{self.metadata_path} holds no run settings.")
        return data

    def write_metadata(self, metadata: Mapping[str, Any]) -> None:
        """Replace ``metadata.json`` atomically."""
        tmp = self.metadata_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(metadata, indent=2, ensure_ascii=False, default=str) + "\n")
        os.replace(tmp, self.metadata_path)

    def open_for_append(self) -> None:
        """Open ``results.jsonl`` for new lines, locked; the folder must be writable (metadata.json
        is replaced in it), else one ConfigurationError naming the folder."""
        if self._file is not None:
            return
        probe = self.path / f".write-test-{secrets.token_hex(4)}"
        try:
            probe.touch()
            probe.unlink()
            handle = open(self.results_path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        except OSError as exc:
            where = self.path if exc.filename in (None, str(probe)) else exc.filename
            raise ConfigurationError(
                f"cannot write to the run folder {self.path} ({exc.strerror}: {where}); the run saves its "
                "rollouts there. Make it writable, or copy the folder somewhere writable and pass that copy."
            ) from None
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            raise ConfigurationError(
                f"another run is writing to {self.path} right now; wait for it or stop it first."
            ) from None
        self._file = handle

    def append(self, record: Mapping[str, Any]) -> None:
        """Write one rollout as one line and flush it, so a killed run keeps every finished rollout."""
        assert self._file is not None, "open_for_append() first"
        self._file.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            self._file.close()
            self._file = None


# ---------------------------------------------------------------------------------------------
# Orchestration


class RunObserver(Protocol):
    """What the eval reports while it runs (the CLI draws it)."""

    def stack_starting(self, env: str) -> None: ...

    def stack_ready(self, seconds: float) -> None: ...

    def rollouts_starting(self, total: int, done: int) -> None: ...

    def rollout_finished(self, result: RolloutResult) -> None: ...


@dataclass
class SessionTiming:
    """Timing of one invocation (a resumed run has several)."""

    started_at: float = field(default_factory=time.time)
    stack_start_s: float | None = None
    rollouts_s: float | None = None
    rollouts: int = 0


class Evaluation:
    """One eval: its tasks, the harness that runs them and the policy that answers.

    ``load()`` reads the tasks (no processes yet); ``start(observer)`` starts the Gym stack;
    ``run(pending, observer)`` starts the policy (the replay server, or an endpoint), runs the pending
    tasks and yields their results as they finish; ``aclose()`` releases everything.
    """

    def __init__(self, settings: EvalSettings, *, api_key: str | None = None) -> None:
        self.settings = settings
        self._api_key: str | None = None
        self.use_api_key(api_key)
        self.env: NeMoGymEnv | None = None
        self.tasks: list[Task] = []
        self._replay: ReplayUpstream | None = None
        self.timing = SessionTiming()
        self.recorded_rewards: dict[int, Any] = {}
        """Replay: each task's recorded reward, which its rollouts must reproduce."""

    def load(self) -> list[Task]:
        """Build the environment's taskset and harness (raises ConfigurationError on bad input)."""
        from .._environment import load_environment

        s = self.settings
        args = {k: v for k, v in s.env_args.items() if k != "nemo_env"}
        check_env_args(args)
        if s.policy == "replay" and "dataset" in args:
            raise ConfigurationError(
                "-a dataset picks the tasks for a model endpoint (add -b URL); the replay policy runs the "
                "recorded rollouts (or the recordings in -a jsonl_path)."
            )
        try:
            self.env = load_environment(
                s.nemo_env,
                recorded=s.policy == "replay",
                num_examples=s.num_examples,
                rollouts_per_example=s.rollouts_per_example,
                timeout=s.timeout,
                **args,
            )
        except TypeError as exc:  # an env arg of the wrong kind
            raise ConfigurationError(f"-a: {exc}") from None
        if s.policy == "replay":
            from .._upstreams.replay import replay_tasks

            self.tasks = replay_tasks(self.env.taskset)
            self.recorded_rewards = {t.task_index: t.recorded_reward for t in self.tasks}
        else:
            self.tasks = list(self.env.taskset)
        if not self.tasks:
            raise ConfigurationError(f"{s.nemo_env}: the dataset has no tasks.")
        return self.tasks

    def use_api_key(self, api_key: str | None) -> None:
        """The endpoint's API key (call before ``start``: Gym processes must not inherit it)."""
        self._api_key = api_key
        if api_key:
            register_api_key(api_key)

    def check(self) -> tuple[str, ...]:
        """Raise now what starting the stack would refuse (judge-scored environment, missing packages);
        starts nothing. Returns why the environment may need an external service."""
        assert self.env is not None, "load() first"
        return self.env.harness.check()

    @property
    def expected_pairs(self) -> list[Pair]:
        return [(t.task_index, t.rollout_index) for t in self.tasks]

    def _endpoints(self, pending: Sequence[Task]) -> Endpoint | Callable[[Task], Endpoint]:
        from .._endpoint import Endpoint

        s = self.settings
        if s.policy == "replay":
            from .._upstreams.replay import ReplayUpstream

            self._replay = ReplayUpstream.from_tasks(list(pending)).start()
            return self._replay.endpoint_for
        assert s.base_url is not None
        return Endpoint(base_url=s.base_url, model=s.model, api_key=self._api_key or "EMPTY", api=s.api)

    async def start(self, observer: RunObserver) -> None:
        """Start the Gym stack (shown as its own step)."""
        assert self.env is not None, "load() first"
        observer.stack_starting(self.settings.nemo_env)
        started = time.monotonic()
        await self.env.harness.astart()
        self.timing.stack_start_s = time.monotonic() - started
        observer.stack_ready(self.timing.stack_start_s)

    async def run(
        self, pending: Sequence[Task], observer: RunObserver, *, done: int = 0
    ) -> AsyncIterator[RolloutResult]:
        """Run ``pending`` tasks; yield each result as it finishes."""
        assert self.env is not None, "load() first"
        if not pending:
            return
        endpoints = self._endpoints(pending)
        observer.rollouts_starting(done + len(pending), done)
        started = time.monotonic()
        try:
            stream = self.env.harness.run(
                pending,
                endpoints,
                concurrency=self.settings.max_concurrent,
                sampling_args=dict(self.settings.sampling_args) or None,
                timeout=self.settings.timeout,
            )
            async with contextlib.aclosing(stream):
                async for result in stream:
                    self.timing.rollouts += 1
                    self.timing.rollouts_s = time.monotonic() - started
                    observer.rollout_finished(result)
                    yield result
        finally:
            self.timing.rollouts_s = time.monotonic() - started

    async def aclose(self) -> None:
        if self._replay is not None:
            self._replay.stop()
            self._replay = None
        if self.env is not None:
            await self.env.harness.aclose()

    def record_of(self, result: RolloutResult) -> dict[str, Any]:
        """The ``results.jsonl`` line of a result (a replay's also carries the recorded reward)."""
        record = result.to_dict(include_trace=self.settings.save_trace)
        if result.task_index in self.recorded_rewards:
            record["recorded_reward"] = self.recorded_rewards[result.task_index]
        return record


def timing_summary(sessions: Sequence[Mapping[str, Any]], wall_s: float) -> dict[str, Any]:
    """The timing block of a summary: this invocation's wall time, stack start and throughput."""
    current = sessions[-1] if sessions else {}
    rollouts, rollouts_s = current.get("rollouts") or 0, current.get("rollouts_s")
    return {
        "wall_s": wall_s,
        "stack_start_s": current.get("stack_start_s"),
        "rollouts_s": rollouts_s,
        "rollouts_per_s": rollouts / rollouts_s if rollouts and rollouts_s else None,
        "sessions": len(sessions),
        "total_wall_s": math.fsum(s.get("wall_s") or 0.0 for s in sessions),
    }
