"""Tasks for NeMo Gym environments: JSONL rows read, validated and given a framework-friendly view.

A row is what Gym's agent ``/run`` takes: ``{"responses_create_params": {"input": [...], "tools": [...]},
"agent_ref": {"name": ...}, ...extra fields for the resources server}``. ``NeMoGymTaskset`` reads rows
from a packaged environment's dataset, its recorded rollouts, or any JSONL file, streaming (a small
``limit`` reads only that many rows), checks each row the way nemo-gym would and reports a bad one
with its file and line and the fix. Rows are kept as their compact JSON text; a ``Task`` is built when
asked for, holding the row exactly as read plus a chat-style view (prompt, tools, agent, extras).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import json
import logging
import operator
import random
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

from .._exceptions import ConfigurationError, TasksetError
from .._gym.catalogue import EXAMPLE_ROLLOUTS, RESPONSES_API_AGENTS, GymEnvironment, get_environment
from .._protocol import to_chat_messages, to_chat_tools

if TYPE_CHECKING:
    import datasets

logger = logging.getLogger(__name__)

OnError = Literal["raise", "skip"]

RESPONSES_CREATE_PARAMS = "responses_create_params"
AGENT_REF = "agent_ref"
# Top-level fields a recorded rollout carries that are verify outputs, not task inputs.
_RECORDED_OUTPUTS = ("response", "reward")
# Fields Gym's rollout collection stamps on rows; the harness stamps its own.
_GYM_STAMP_PREFIX = "_ng_"
_EXAMPLE_ID_FIELDS = ("id", "example_id", "task_id")
_MAX_SKIP_REASONS = 5

# The fields of nemo-gym 0.4.0's NeMoGymResponseCreateParamsNonStreaming (extra="forbid"); used only
# when no nemo-gym source is at hand to read them from.
_NEMO_GYM_0_4_PARAMS = frozenset(
    {
        "background",
        "include",
        "input",
        "instructions",
        "max_output_tokens",
        "max_tool_calls",
        "metadata",
        "model",
        "parallel_tool_calls",
        "previous_response_id",
        "prompt",
        "reasoning",
        "service_tier",
        "store",
        "temperature",
        "text",
        "tool_choice",
        "tools",
        "top_logprobs",
        "top_p",
        "truncation",
        "user",
        "stream",
    }
)
_GYM_PARAMS_CLASS = "NeMoGymResponseCreateParamsNonStreaming"


@dataclass(frozen=True)
class Task:
    """One rollout's work: a Gym row (untouched) and a chat-style view of it.

    ``task_index`` is the row's position in its taskset, ``rollout_index`` counts the repeats of that
    row (``rollouts_per_task``). ``example_id`` is stable across shuffles and limits: the row's
    ``id``/``example_id``/``task_id`` field, else its 0-based position among the file's rows.
    """

    task_index: int
    rollout_index: int
    row: dict[str, Any]
    """The row exactly as read from the file."""
    agent_name: str | None
    """The Gym agent instance that runs this task."""
    env: str | None
    example_id: str
    source: str
    """``path:line`` the row was read from."""
    recorded: bool = False
    """The row is a recorded rollout (it carries the model's ``response`` and the ``reward``)."""

    def __hash__(self) -> int:  # the row is a dict; equal tasks share these fields
        return hash((self.source, self.task_index, self.rollout_index, self.example_id))

    @property
    def prompt(self) -> list[dict[str, Any]]:
        """The input as chat messages: ``developer`` becomes ``system``, plain-text parts are joined."""
        return to_chat_messages(self.row[RESPONSES_CREATE_PARAMS].get("input", []))

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The tools in Chat Completions form (``{"type": "function", "function": {...}}``)."""
        return to_chat_tools(self.row[RESPONSES_CREATE_PARAMS].get("tools") or [])

    @property
    def extras(self) -> dict[str, Any]:
        """The row's other top-level fields (what Gym passes to ``/seed_session`` and ``/verify``)."""
        return {k: v for k, v in self.row.items() if k not in (RESPONSES_CREATE_PARAMS, AGENT_REF)}

    @property
    def recorded_response(self) -> dict[str, Any] | None:
        """The recorded model response (Responses API object) of a recorded rollout."""
        response = self.row.get("response")
        return response if self.recorded and isinstance(response, dict) else None

    @property
    def recorded_reward(self) -> Any:
        """The recorded reward of a recorded rollout (as written, normally a number)."""
        return self.row.get("reward") if self.recorded else None

    def gym_row(self) -> dict[str, Any]:
        """The row to send to Gym's agent ``/run``.

        Drops ``null`` values inside ``responses_create_params`` (recordings hold explicit nulls that
        Gym answers with 422), verify outputs of recordings (``response``, ``reward``) and Gym's own
        ``_ng_*`` stamps, and names the resolved agent in ``agent_ref``.
        """
        row = {
            key: value
            for key, value in self.row.items()
            if key not in _RECORDED_OUTPUTS and not key.startswith(_GYM_STAMP_PREFIX)
        }
        row[RESPONSES_CREATE_PARAMS] = {
            key: value for key, value in self.row[RESPONSES_CREATE_PARAMS].items() if value is not None
        }
        if self.agent_name is not None:
            row[AGENT_REF] = {"type": RESPONSES_API_AGENTS, "name": self.agent_name}
        return row


@dataclass(frozen=True)
class SkippedRows:
    """What ``on_error="skip"`` left out: how many rows, and why (the first few)."""

    count: int = 0
    reasons: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return self.count > 0


class NeMoGymTaskset(Sequence[Task]):
    """Tasks of a NeMo Gym environment, from its packaged data or any JSONL file.

    * ``NeMoGymTaskset("example_multi_step")``: the environment's default dataset (its shipped
      ``example`` dataset; see ``GymEnvironment.default_dataset``).
    * ``dataset="validation"``: another dataset its configs name (by name, else by type).
    * ``recorded=True``: ``data/example_rollouts.jsonl``; each task keeps the recorded response and reward.
      With ``jsonl_path=`` it reads that file as recordings instead.
    * ``jsonl_path=``: any file. The agent of a row is its ``agent_ref.name``, else ``agent``. With
      ``nemo_env`` too, every ``agent_ref`` must name one of the environment's agents.

    Packaged files are upstream data: a row whose ``agent_ref`` names an agent outside the config that
    lists the dataset (stale names in some recordings, another config's agent) runs on the dataset's
    own agent instead, so every task of a packaged dataset runs on one config's stack.

    ``limit`` keeps the first ``limit`` valid rows and stops reading there. With ``shuffle`` the rows
    are shuffled with ``random.Random(seed)``; with ``shuffle`` and ``limit`` a uniform sample of
    ``limit`` rows is drawn by reservoir sampling: the whole file is read, but only ``limit`` rows are
    held. Each row gives ``rollouts_per_task`` consecutive tasks (``aabbcc``), with rollout indices
    ``0..r-1``. ``on_error="skip"`` leaves bad rows out (see ``skipped``) instead of raising.

    Rows are held as compact JSON text; indexing or iterating builds ``Task`` objects on demand.
    """

    def __init__(
        self,
        nemo_env: str | None = None,
        *,
        dataset: str | None = None,
        jsonl_path: str | Path | None = None,
        recorded: bool = False,
        agent: str | None = None,
        limit: int | None = None,
        shuffle: bool = False,
        seed: int = 0,
        rollouts_per_task: int = 1,
        on_error: OnError = "raise",
        root: str | Path | None = None,
    ) -> None:
        _check_arguments(nemo_env, dataset, jsonl_path, recorded, limit, rollouts_per_task, on_error)
        env = get_environment(nemo_env, root) if nemo_env is not None else None
        if env is not None and agent is not None:
            env.agent(agent)  # raises, listing the environment's agents
        path, default_agent, packaged_agents = _resolve_source(env, dataset, jsonl_path, recorded)
        checker = _RowChecker(
            path=path,
            allowed_params=_gym_params(env.root if env else _local_root(root)),
            env=env,
            fallback_agent=agent or default_agent,
            packaged_agents=packaged_agents,
            recorded=recorded,
        )
        store, skipped = _read_rows(path, checker, limit=limit, shuffle=shuffle, seed=seed, on_error=on_error)
        self._init(
            store=store,
            path=path,
            env_name=env.name if env else None,
            env=env,
            recorded=recorded,
            rollouts_per_task=rollouts_per_task,
            skipped=skipped,
            root=root,
        )
        logger.debug("loaded %d rows from %s (%d skipped)", store.size, path, skipped.count)

    def _init(
        self,
        *,
        store: _RowStore,
        path: Path,
        env_name: str | None,
        env: GymEnvironment | None,
        recorded: bool,
        rollouts_per_task: int,
        skipped: SkippedRows,
        root: str | Path | None,
    ) -> None:
        self._store = store
        self._path = path
        self._env_name = env_name
        self._env = env
        self._recorded = recorded
        self._rollouts_per_task = rollouts_per_task
        self._skipped = skipped
        self._root = root

    # ---- what it holds

    @property
    def path(self) -> Path:
        """The JSONL file the rows came from."""
        return self._path

    @property
    def env_name(self) -> str | None:
        return self._env_name

    @property
    def env(self) -> GymEnvironment | None:
        """The packaged environment, when the taskset names one (looked up on first use)."""
        if self._env is None and self._env_name is not None:
            self._env = get_environment(self._env_name, self._root)
        return self._env

    @property
    def recorded(self) -> bool:
        return self._recorded

    @property
    def rollouts_per_task(self) -> int:
        return self._rollouts_per_task

    @property
    def num_rows(self) -> int:
        """Distinct rows (tasks before repeats)."""
        return self._store.size

    @property
    def skipped(self) -> SkippedRows:
        """Rows left out by ``on_error="skip"``."""
        return self._skipped

    @property
    def agents(self) -> tuple[str, ...]:
        """The agent instances the rows run on, in first-seen order."""
        return tuple(dict.fromkeys(a for a in self._store.agents if a is not None))

    # ---- sequence protocol

    def __len__(self) -> int:
        return self._store.size * self._rollouts_per_task

    @overload
    def __getitem__(self, index: int) -> Task: ...

    @overload
    def __getitem__(self, index: slice) -> list[Task]: ...

    def __getitem__(self, index: int | slice) -> Task | list[Task]:
        if isinstance(index, slice):
            return [self._task(i) for i in range(*index.indices(len(self)))]
        index = operator.index(index)  # numpy integers too; TypeError for anything else
        position = index + len(self) if index < 0 else index
        if not 0 <= position < len(self):
            raise IndexError(f"task index {index} out of range for {len(self)} tasks")
        return self._task(position)

    def __iter__(self) -> Iterator[Task]:
        for position in range(len(self)):
            yield self._task(position)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, NeMoGymTaskset):
            return NotImplemented
        return (
            self._env_name == other._env_name
            and self._rollouts_per_task == other._rollouts_per_task
            and len(self) == len(other)
            and all(a == b for a, b in zip(self, other, strict=True))
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"NeMoGymTaskset(env={self._env_name!r}, path='{self._path}', rows={self.num_rows}, "
            f"rollouts_per_task={self._rollouts_per_task}, recorded={self._recorded})"
        )

    def _task(self, position: int) -> Task:
        task_index, rollout_index = divmod(position, self._rollouts_per_task)
        line, line_no, row_index, agent = self._store.get(task_index)
        row = json.loads(line)
        return Task(
            task_index=task_index,
            rollout_index=rollout_index,
            row=row,
            agent_name=agent,
            env=self._env_name,
            example_id=_example_id(row, row_index),
            source=f"{self._path}:{line_no}",
            recorded=self._recorded,
        )

    # ---- Hugging Face datasets

    def to_dataset(self) -> datasets.Dataset:
        """One row per task (before repeats): ``prompt``, ``example_id``, ``task``, ``info`` (JSON).

        ``task`` is the environment name (else the agent name); ``info`` holds the raw row, agent,
        task index and where the row came from, so ``from_dataset`` can rebuild this taskset.
        """
        import datasets

        records = []
        for task_index in range(self.num_rows):
            task = self._task(task_index * self._rollouts_per_task)
            line_no = int(task.source.rsplit(":", 1)[1])
            info = {
                "row": task.row,
                "agent": task.agent_name,
                "env": task.env,
                "task_index": task.task_index,
                "row_index": self._store.get(task_index)[2],
                "path": str(self._path),
                "line": line_no,
                "recorded": self._recorded,
                "rollouts_per_task": self._rollouts_per_task,
            }
            records.append(
                {
                    "prompt": task.prompt,
                    "example_id": task.example_id,
                    "task": task.env or task.agent_name or "nemo_gym",
                    "info": json.dumps(info, ensure_ascii=False),
                }
            )
        if any(not isinstance(m.get("content"), str) for r in records for m in r["prompt"]):
            for record in records:  # Arrow needs one type per column: use content parts everywhere
                record["prompt"] = [_content_as_parts(m) for m in record["prompt"]]
        return datasets.Dataset.from_list(records)

    @classmethod
    def from_dataset(cls, dataset: Iterable[Mapping[str, Any]], *, root: str | Path | None = None) -> NeMoGymTaskset:
        """Rebuild a taskset from ``to_dataset()``'s output (its ``info`` column)."""
        store = _RowStore()
        env_name: str | None = None
        recorded = False
        rollouts_per_task = 1
        path = Path("<dataset>")
        for index, record in enumerate(dataset):
            try:
                info = json.loads(record["info"])
                row = info["row"]
                if not isinstance(row, dict) or RESPONSES_CREATE_PARAMS not in row:
                    raise ValueError("info.row is not a Gym row")
            except (KeyError, TypeError, ValueError) as exc:
                raise ConfigurationError(
                    f"dataset row {index} has no usable 'info' ({exc}). from_dataset() takes what "
                    "NeMoGymTaskset.to_dataset() returns."
                ) from exc
            if index == 0:
                env_name = info.get("env")
                recorded = bool(info.get("recorded", False))
                rollouts_per_task = int(info.get("rollouts_per_task", 1))
                path = Path(info.get("path") or path)
            line = json.dumps(row, ensure_ascii=False, separators=(",", ":")).encode()
            store.append(line, int(info.get("line", index + 1)), int(info.get("row_index", index)), info.get("agent"))
        if store.size == 0:
            raise ConfigurationError("from_dataset() got an empty dataset: there are no tasks to rebuild.")
        taskset = cls.__new__(cls)
        taskset._init(
            store=store,
            path=path,
            env_name=env_name,
            env=None,
            recorded=recorded,
            rollouts_per_task=rollouts_per_task,
            skipped=SkippedRows(),
            root=root,
        )
        return taskset


# --------------------------------------------------------------------------------------------
# Reading and checking rows


class _RowStore:
    """Rows as compact JSON bytes plus their line, row index and agent; cheap to hold by the million."""

    def __init__(self) -> None:
        self.lines: list[bytes] = []
        self.line_nos = array("q")
        self.row_indexes = array("q")
        self.agents: list[str | None] = []

    @property
    def size(self) -> int:
        return len(self.lines)

    def append(self, line: bytes, line_no: int, row_index: int, agent: str | None) -> None:
        self.lines.append(line)
        self.line_nos.append(line_no)
        self.row_indexes.append(row_index)
        self.agents.append(agent)

    def put(self, slot: int, line: bytes, line_no: int, row_index: int, agent: str | None) -> None:
        self.lines[slot] = line
        self.line_nos[slot] = line_no
        self.row_indexes[slot] = row_index
        self.agents[slot] = agent

    def get(self, slot: int) -> tuple[bytes, int, int, str | None]:
        return self.lines[slot], self.line_nos[slot], self.row_indexes[slot], self.agents[slot]

    def shuffle(self, rng: random.Random) -> None:
        order = list(range(self.size))
        rng.shuffle(order)
        self.lines = [self.lines[i] for i in order]
        self.line_nos = array("q", (self.line_nos[i] for i in order))
        self.row_indexes = array("q", (self.row_indexes[i] for i in order))
        self.agents = [self.agents[i] for i in order]


class _RowError(Exception):
    """A bad row: what is wrong and how to fix it."""

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.fix = fix


class _RowChecker:
    """Checks one row the way nemo-gym would take it and resolves the agent that runs it."""

    def __init__(
        self,
        *,
        path: Path,
        allowed_params: frozenset[str],
        env: GymEnvironment | None,
        fallback_agent: str | None,
        packaged_agents: frozenset[str] | None,
        recorded: bool,
    ) -> None:
        self.path = path
        self.allowed_params = allowed_params
        self.env = env
        self.known_agents = {a.name for a in env.agents} if env is not None else None
        self.fallback_agent = fallback_agent
        self.packaged_agents = packaged_agents
        self.recorded = recorded
        self._interned: dict[str, str] = {}

    def check(self, row: Any) -> str | None:
        """The agent for a valid row; raises ``_RowError`` for a bad one."""
        if not isinstance(row, dict):
            raise _RowError(
                f"the row is a JSON {_json_type(row)}, not an object",
                'write one JSON object per line: {"responses_create_params": {"input": [...]}, ...}',
            )
        params = row.get(RESPONSES_CREATE_PARAMS)
        if params is None:
            raise _RowError(
                f"the row has no {RESPONSES_CREATE_PARAMS!r}",
                f'add "{RESPONSES_CREATE_PARAMS}": {{"input": [...messages...]}} (what the policy is asked)',
            )
        if not isinstance(params, dict):
            raise _RowError(
                f"{RESPONSES_CREATE_PARAMS!r} is a JSON {_json_type(params)}, not an object",
                f'make it an object: "{RESPONSES_CREATE_PARAMS}": {{"input": [...messages...]}}',
            )
        if "input" not in params:
            raise _RowError(
                f"{RESPONSES_CREATE_PARAMS!r} has no 'input'",
                f"add {RESPONSES_CREATE_PARAMS}.input: the prompt, a string or a list of messages "
                '({"role": "user", "content": "..."})',
            )
        if not isinstance(params["input"], str | list):
            raise _RowError(
                f"{RESPONSES_CREATE_PARAMS}.input is a JSON {_json_type(params['input'])}",
                "make it a string or a list of messages",
            )
        unknown = sorted(k for k in params if k not in self.allowed_params)
        if unknown:
            raise _RowError(*self._unknown_params(unknown))
        if self.recorded and ("response" not in row or "reward" not in row):
            missing = " and ".join(repr(k) for k in _RECORDED_OUTPUTS if k not in row)
            raise _RowError(
                f"the row has no recorded {missing}",
                "recorded=True reads rollouts written by Gym's rollout collection (rows with response and "
                "reward); load plain task rows without recorded=True",
            )
        return self._agent(row)

    def _agent(self, row: dict[str, Any]) -> str | None:
        ref = row.get(AGENT_REF)
        name: str | None = None
        if ref is not None:
            if not isinstance(ref, dict) or not isinstance(ref.get("name"), str):
                raise _RowError(
                    f"{AGENT_REF!r} is {json.dumps(ref)[:80]}, not an object with a name",
                    f'write "{AGENT_REF}": {{"name": "<agent instance>"}}, or drop it and pass agent=',
                )
            name = ref["name"]
        if name is not None and self.packaged_agents is not None and name not in self.packaged_agents:
            name = None  # upstream data naming another config's or a stale agent: use the dataset's own
        elif name is not None and self.known_agents is not None and name not in self.known_agents:
            assert self.env is not None
            choices = ", ".join(sorted(self.known_agents)) or "(none)"
            raise _RowError(
                f"{AGENT_REF}.name {name!r} is not an agent of environment {self.env.name!r}",
                f"use one of its agents ({choices}), or drop {AGENT_REF} and pass agent=",
            )
        if name is None:
            name = self.fallback_agent
        if name is None:
            raise _RowError(
                f"the row has no {AGENT_REF} and no agent was given",
                f'add "{AGENT_REF}": {{"name": "<agent instance>"}} to the row, or pass agent= or nemo_env=',
            )
        return self._interned.setdefault(name, name)

    def _unknown_params(self, unknown: list[str]) -> tuple[str, str]:
        import difflib

        openai_only = [k for k in unknown if k in _openai_params()]
        problem = f"{RESPONSES_CREATE_PARAMS} has key(s) nemo-gym rejects: {', '.join(map(repr, unknown))}"
        if openai_only:
            problem += f" ({', '.join(map(repr, openai_only))}: valid for OpenAI, not in this nemo-gym)"
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key, sorted(self.allowed_params), n=1, cutoff=0.75)
            if close:
                hints.append(f"{key!r} -> {close[0]!r}?")
        fix = "remove them, or move fields meant for the resources server to the row's top level"
        if hints:
            fix += f" (did you mean {', '.join(hints)})"
        return problem, f"{fix}; allowed: {', '.join(sorted(self.allowed_params))}"

    def error(self, line_no: int, problem: str, fix: str) -> TasksetError:
        return TasksetError(f"{self.path}:{line_no}: {problem}. Fix: {fix}.")


def _read_rows(
    path: Path,
    checker: _RowChecker,
    *,
    limit: int | None,
    shuffle: bool,
    seed: int,
    on_error: OnError,
) -> tuple[_RowStore, SkippedRows]:
    store = _RowStore()
    rng = random.Random(seed)
    sampling = shuffle and limit is not None
    seen_rows = 0  # non-blank lines
    valid_rows = 0
    skipped = 0
    reasons: list[str] = []
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        raise TasksetError(
            f"{path}: no such file. Fix: check the path (relative paths are taken from {Path.cwd()})."
        ) from None
    except OSError as exc:
        raise TasksetError(
            f"{path}: cannot be opened ({exc.strerror}). Fix: check the path and its permissions."
        ) from None
    with handle:
        for line_no, raw in enumerate(handle, 1):
            line = raw.strip()
            if line_no == 1 and line.startswith(b"\xef\xbb\xbf"):
                line = line[3:].strip()
            if not line:
                continue
            row_index = seen_rows
            seen_rows += 1
            try:
                try:
                    row = json.loads(line)
                except (ValueError, RecursionError) as exc:
                    raise _RowError(_json_problem(exc), "make the line one complete JSON object") from None
                agent = checker.check(row)
            except _RowError as exc:
                if on_error == "raise":
                    raise checker.error(line_no, exc.problem, exc.fix) from None
                skipped += 1
                if len(reasons) < _MAX_SKIP_REASONS:
                    reasons.append(f"line {line_no}: {exc.problem}")
                continue
            if sampling:
                assert limit is not None
                if valid_rows < limit:
                    store.append(line, line_no, row_index, agent)
                else:
                    slot = rng.randrange(valid_rows + 1)
                    if slot < limit:
                        store.put(slot, line, line_no, row_index, agent)
                valid_rows += 1
                continue
            store.append(line, line_no, row_index, agent)
            valid_rows += 1
            if limit is not None and valid_rows >= limit:
                break
    if shuffle:
        store.shuffle(rng)
    if seen_rows == 0:
        raise TasksetError(
            f"{path}: the file is empty (no JSON lines). Fix: write one task per line, "
            '{"responses_create_params": {"input": [...]}}, or point at another file.'
        )
    if store.size == 0:
        raise TasksetError(
            f"{path}: no usable rows, all {skipped} were skipped (first: {reasons[0]}). "
            "Fix: correct the rows, or load with on_error='raise' to see the first error in full."
        )
    if skipped:
        logger.warning(
            "skipped %d bad row(s) of %s (on_error='skip'); first: %s", skipped, path, "; ".join(reasons[:3])
        )
    return store, SkippedRows(skipped, tuple(reasons))


def _check_arguments(
    nemo_env: str | None,
    dataset: str | None,
    jsonl_path: str | Path | None,
    recorded: bool,
    limit: int | None,
    rollouts_per_task: int,
    on_error: str,
) -> None:
    if dataset is not None and nemo_env is None:
        raise ConfigurationError("dataset= names a dataset of an environment: pass nemo_env= too.")
    if nemo_env is None and jsonl_path is None:
        raise ConfigurationError(
            "NeMoGymTaskset needs nemo_env= (a packaged environment) or jsonl_path= (a JSONL file)."
        )
    if dataset is not None and (jsonl_path is not None or recorded):
        raise ConfigurationError("Pass one source: dataset=, jsonl_path= or recorded=True, not several.")
    if on_error not in ("raise", "skip"):
        raise ConfigurationError(f"on_error must be 'raise' or 'skip', not {on_error!r}.")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ConfigurationError(f"limit must be a positive integer or None, not {limit!r}.")
    if isinstance(rollouts_per_task, bool) or not isinstance(rollouts_per_task, int) or rollouts_per_task < 1:
        raise ConfigurationError(f"rollouts_per_task must be a positive integer, not {rollouts_per_task!r}.")


def _resolve_source(
    env: GymEnvironment | None, dataset: str | None, jsonl_path: str | Path | None, recorded: bool
) -> tuple[Path, str | None, bool]:
    """``(file, the agent its rows default to, for packaged data the agents of the config that owns it)``."""
    if jsonl_path is not None:
        # With an environment, rows without agent_ref run on its default agent (its only one, usually).
        fallback = env.default_agent.name if env is not None and env.default_agent is not None else None
        return Path(jsonl_path).expanduser(), fallback, None
    assert env is not None
    default_agent = env.default_agent
    if default_agent is None:
        raise TasksetError(
            f"{env.directory}: environment {env.name!r} defines no agent in its configs, so it has no "
            "tasks to run on its own. Fix: pick an environment with an agent (`verifiers-nemo envs`), "
            "or pass jsonl_path= and nemo_env= of one."
        )
    if recorded:
        path = env.example_rollouts_path
        if not path.is_file():
            raise TasksetError(
                f"{path}: environment {env.name!r} ships no recorded rollouts. Fix: pick an environment "
                "whose catalogue entry has has_example_rollouts, or pass jsonl_path= with your recordings."
            )
        if not env.has_example_rollouts:
            why = next((p for p in env.problems if p.startswith(EXAMPLE_ROLLOUTS)), ": no recordings")
            raise TasksetError(
                f"{path}: environment {env.name!r} ships no usable recordings ({why.split(': ', 1)[-1]}). "
                "Fix: pick an environment whose catalogue entry has has_example_rollouts, or pass "
                "jsonl_path= with your own recordings."
            )
        return path, default_agent.name, _agents_of(env, default_agent.config)
    if dataset is not None:
        chosen = env.dataset(dataset)
    else:
        found = env.default_dataset
        if found is None:
            raise TasksetError(
                f"{env.directory}: environment {env.name!r} ships no dataset file, so it has no tasks "
                "to load. Fix: pass jsonl_path= with your own rows."
            )
        chosen = found
    if not chosen.exists:
        where = f" (Gym fetches it from {chosen.source})" if chosen.source else ""
        raise TasksetError(
            f"{chosen.path}: dataset {chosen.name!r} of environment {env.name!r} is not shipped with "
            f"nemo-gym{where}. Fix: download it to that path (nemo-gym's ng_prepare_data with "
            f"{chosen.config.name}), or pass jsonl_path= to a copy."
        )
    return chosen.path, chosen.agent, _agents_of(env, chosen.config)


def _agents_of(env: GymEnvironment, config: Path) -> frozenset[str]:
    return frozenset(a.name for a in env.agents if a.config == config)


def _local_root(root: str | Path | None) -> Path | None:
    """The Gym root to read nemo-gym's schema from when no environment names one (never builds one)."""
    if root is not None:
        return Path(root).expanduser()
    spec = importlib.util.find_spec("nemo_gym")
    return Path(spec.origin).parent.parent if spec is not None and spec.origin else None


@functools.lru_cache(maxsize=8)
def _gym_params(root: Path | None) -> frozenset[str]:
    """The keys nemo-gym accepts in ``responses_create_params`` (it rejects any other).

    Read from the fields of ``NeMoGymResponseCreateParamsNonStreaming`` in the Gym root's
    ``nemo_gym/openai_utils.py`` (parsed, not imported); nemo-gym 0.4.0's fields when no source is found.
    """
    source = root / "nemo_gym" / "openai_utils.py" if root is not None else None
    if source is not None and source.is_file():
        try:
            tree = ast.parse(source.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
            tree = None
        for node in ast.walk(tree) if tree is not None else ():
            if isinstance(node, ast.ClassDef) and node.name == _GYM_PARAMS_CLASS:
                fields = frozenset(
                    s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
                )
                if "input" in fields:
                    return fields
        logger.debug("no %s in %s; using nemo-gym 0.4.0's fields", _GYM_PARAMS_CLASS, source)
    return _NEMO_GYM_0_4_PARAMS


@functools.lru_cache(maxsize=1)
def _openai_params() -> frozenset[str]:
    """The keys of the OpenAI SDK's ``ResponseCreateParamsNonStreaming`` (for error hints only)."""
    try:
        from openai.types.responses.response_create_params import ResponseCreateParamsNonStreaming
    except ImportError:  # pragma: no cover - openai is a dependency
        return frozenset()
    keys: set[str] = set()
    for klass in ResponseCreateParamsNonStreaming.__mro__:
        keys.update(getattr(klass, "__annotations__", {}))
    return frozenset(keys)


def _json_problem(exc: BaseException) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"malformed JSON ({exc.msg} at column {exc.colno})"
    if isinstance(exc, UnicodeDecodeError):
        return f"the line is not UTF-8 text ({exc.reason} at byte {exc.start})"
    if isinstance(exc, RecursionError):
        return "malformed JSON (nested too deeply)"
    return f"malformed JSON ({exc})"


def _json_type(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")


def _example_id(row: dict[str, Any], row_index: int) -> str:
    for field in _EXAMPLE_ID_FIELDS:
        value = row.get(field)
        if isinstance(value, str | int) and not isinstance(value, bool):
            return str(value)
    return str(row_index)


def _content_as_parts(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    if isinstance(content, str):
        return {**message, "content": [{"type": "text", "text": content}]}
    return message
