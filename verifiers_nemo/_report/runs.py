"""Saved eval runs read into one shape: our run folders (``results.jsonl`` + ``metadata.json``) and
verifiers' eval folders (``traces.jsonl``, from ``vf-eval nemo-gym-env`` or a prime-rl eval).

Every rollout becomes a ``Rollout`` whose ``status`` is ``scored``, ``error`` (a typed failure: no
reward) or ``masked`` (Gym said its reward is no valid measurement: ``mask_sample``/``failure_kind``),
so the report counts each apart and never scores a failure as 0.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._eval.token_ids import VERIFIERS_FIX, describe_token_ids, record_token_ids, summarize_token_ids
from .._exceptions import ConfigurationError
from .transcript import Strings, from_messages, from_policy_calls, from_trace_nodes

RESULTS_FILE, METADATA_FILE, TRACES_FILE = "results.jsonl", "metadata.json", "traces.jsonl"
_NOT_METRICS = {"mask_sample", "masked"}


class ReportError(ConfigurationError):
    """Input the report cannot use; the message says what is missing or what was compared."""


@dataclass(slots=True)
class Rollout:
    """One rollout as the report shows it (``transcript`` is the compact shape of ``transcript.py``)."""

    env: str
    task: str
    """The task's key across runs: the example id when recorded, else the task index."""
    rollout_index: int
    """Which of the task's repeats (``-r``) this is, from 0."""
    status: str
    """``scored``, ``error`` or ``masked``."""
    reward: float | None = None
    kind: str | None = None
    """The error's type, or a masked row's ``failure_kind``."""
    message: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    turns: int = 0
    tool_calls: int = 0
    input_tokens: int | None = None
    output_tokens: int | None = None
    latency_s: float | None = None
    call_latencies: list[float] = field(default_factory=list)
    recorded_reward: float | None = None
    transcript: dict[str, Any] = field(default_factory=dict)
    token_ids: dict[str, Any] | None = None
    """Whether its recorded token IDs are contiguous (``rollout_token_ids``); None when none were recorded."""


@dataclass
class Run:
    """One saved run: where it came from, what ran, and its rollouts."""

    path: Path
    source: str
    """``verifiers-nemo eval`` or ``vf-eval`` (verifiers' traces)."""
    label: str
    info: dict[str, Any]
    """Model, endpoint, sampling args, versions, environments, status: shown as they are."""
    rollouts: list[Rollout]
    rollouts_per_example: int
    pass_threshold: float = 0.5
    judges: dict[str, dict[str, Any]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    strings: Strings = field(default_factory=Strings)

    @property
    def envs(self) -> list[str]:
        return sorted({r.env for r in self.rollouts})


def load_run(path: Path, strings: Strings | None = None) -> Run:
    """The run saved at ``path``: a run folder of either kind, or its ``results.jsonl`` / ``traces.jsonl``.

    ``strings``: the table its transcripts' long texts go to (shared by the runs of one report)."""
    path = Path(path)
    strings = strings if strings is not None else Strings()
    if not path.exists():
        raise ReportError(f"{path} does not exist.")
    if path.is_file():
        if path.name == TRACES_FILE:
            return _load_traces(path, strings)
        if path.name in (RESULTS_FILE, METADATA_FILE):
            return _load_results(path.parent, strings)
        raise ReportError(f"{path} is a file but neither {RESULTS_FILE} nor {TRACES_FILE}: pass the run folder.")
    if (path / RESULTS_FILE).exists() or (path / METADATA_FILE).exists():
        return _load_results(path, strings)
    if (path / TRACES_FILE).exists():
        return _load_traces(path / TRACES_FILE, strings)
    inner = sorted(
        {p.parent for name in (METADATA_FILE, TRACES_FILE) for p in path.glob(f"*/{name}")}
        | {p.parent for name in (METADATA_FILE, TRACES_FILE) for p in path.glob(f"*/*/{name}")}
    )
    if len(inner) == 1:
        return load_run(inner[0], strings)
    hint = ""
    if inner:
        shown = ", ".join(str(p.relative_to(path)) for p in inner[-8:])
        hint = f" It holds {len(inner)} runs ({shown}); pass the ones to report."
    raise ReportError(
        f"{path} is neither a verifiers-nemo run folder ({RESULTS_FILE} + {METADATA_FILE}, from "
        f"`verifiers-nemo eval -s`) nor a verifiers eval folder ({TRACES_FILE}, from vf-eval).{hint}"
    )


def _read_jsonl(path: Path, notes: list[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` of each good line; a cut-off last line or a bad line is noted, not fatal."""
    bad: list[int] = []
    last_bad_is_tail = False
    with open(path, "rb") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except ValueError:
                bad.append(number)
                last_bad_is_tail = not line.endswith(b"\n")
                continue
            if isinstance(value, dict):
                yield number, value
            else:
                bad.append(number)
    if bad:
        if len(bad) == 1 and last_bad_is_tail:
            notes.append(f"{path.name}: the last line was cut off (the run was stopped while writing it); left out")
        else:
            where = ", ".join(map(str, bad[:5])) + (" ..." if len(bad) > 5 else "")
            notes.append(f"{path.name}: {len(bad)} unreadable lines left out (line {where})")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _metrics(raw: Any) -> dict[str, float]:
    out = {}
    for name, value in (raw or {}).items() if isinstance(raw, Mapping) else ():
        number = value if isinstance(value, bool) else _number(value)
        if name not in _NOT_METRICS and number is not None:
            out[str(name)] = float(number)
    return out


def _masking(*sources: Any) -> tuple[bool, str | None, str | None]:
    """Whether Gym masked the rollout (``mask_sample``/``masked``), and its ``failure_kind``/``failure_reason``."""
    masked, kind, reason = False, None, None
    for source in sources:
        if not isinstance(source, Mapping):
            continue
        if source.get("mask_sample") in (True, 1, 1.0) or source.get("masked") in (True, 1, 1.0):
            masked = True
        failure = source.get("failure") if isinstance(source.get("failure"), Mapping) else {}
        kind = kind or source.get("failure_kind") or failure.get("kind")
        reason = reason or source.get("failure_reason") or failure.get("reason")
    return masked, (str(kind) if kind else None), (str(reason) if reason else None)


def _status(error: Any, reward: float | None, masked: bool) -> str:
    if error or (reward is None and not masked):
        return "error"
    return "masked" if masked else "scored"


# -- our run folders ---------------------------------------------------------------------------------


def _load_results(folder: Path, strings: Strings) -> Run:
    results, metadata_path = folder / RESULTS_FILE, folder / METADATA_FILE
    notes: list[str] = []
    metadata: dict[str, Any] = {}
    if metadata_path.exists():
        try:
            loaded = json.loads(metadata_path.read_text())
            metadata = loaded if isinstance(loaded, dict) else {}
        except (OSError, ValueError) as exc:
            notes.append(f"{METADATA_FILE} could not be read ({exc}); run details are unknown")
    else:
        notes.append(f"no {METADATA_FILE} (the run was stopped before writing it); run details are unknown")
    if not results.exists() or results.stat().st_size == 0:
        raise ReportError(
            f"{folder} has no rollouts yet: {RESULTS_FILE} is {'empty' if results.exists() else 'missing'} "
            "(the run saved none; was it stopped before the first rollout finished?)."
        )
    settings = metadata.get("settings") if isinstance(metadata.get("settings"), dict) else {}
    rollouts: list[Rollout] = []
    seen: set[tuple[Any, Any, Any]] = set()
    duplicates = 0
    for _line, record in _read_jsonl(results, notes):
        if "task_index" not in record or "rollout_index" not in record:
            continue
        key = (record.get("env"), record["task_index"], record["rollout_index"])
        if key in seen:  # a resumed run may repeat a line; the first one counts (as in the summary)
            duplicates += 1
            continue
        seen.add(key)
        rollouts.append(_rollout_of_record(record, settings, strings))
    if duplicates:
        notes.append(f"{duplicates} duplicate lines of {RESULTS_FILE} left out (the first of each counts)")
    if not rollouts:
        raise ReportError(f"{results} holds no complete rollout line (the run saved none).")
    counts = metadata.get("counts") or {}
    if counts.get("missing"):
        notes.append(
            f"{counts['missing']} of {counts.get('expected')} rollouts were not run (status {metadata.get('status')})"
        )
    summary = metadata.get("summary") or {}
    versions = metadata.get("versions") or {}
    run_id = metadata.get("run_id") or folder.name
    info = {
        "source": "verifiers-nemo eval",
        "environment": settings.get("env") or metadata.get("env"),
        "model": metadata.get("model") or settings.get("model"),
        "endpoint": settings.get("base_url") or (f"policy {settings['policy']}" if settings.get("policy") else None),
        "api": settings.get("api"),
        "sampling args": settings.get("sampling_args"),
        "env args": settings.get("env_args") or None,
        "rollouts per example": settings.get("rollouts_per_example"),
        "timeout": settings.get("timeout"),
        "nemo-gym": versions.get("nemo-gym"),
        "verifiers-nemo": versions.get("verifiers-nemo"),
        "ray": settings.get("ray"),
        "status": metadata.get("status"),
        "created": metadata.get("created_at"),
        "updated": metadata.get("updated_at"),
        "run id": run_id,
        "folder": str(folder),
    }
    if summary.get("timing"):
        timing = summary["timing"]
        info["wall time (s)"] = _rounded(timing.get("total_wall_s") or timing.get("wall_s"))
        info["stack start (s)"] = _rounded(timing.get("stack_start_s"))
    info["token IDs"] = _token_ids_info(rollouts, exact_tokens=bool(settings.get("exact_tokens")))
    return Run(
        path=folder,
        source="verifiers-nemo eval",
        label=f"{folder.parent.name}/{folder.name}" if metadata else folder.name,
        info={k: v for k, v in info.items() if v not in (None, "", {})},
        rollouts=rollouts,
        rollouts_per_example=int(settings.get("rollouts_per_example") or _max_repeats(rollouts)),
        pass_threshold=float(settings.get("pass_threshold") if settings.get("pass_threshold") is not None else 0.5),
        judges=dict(summary.get("judges") or {}),
        notes=notes,
        strings=strings,
    )


def _rollout_of_record(record: Mapping[str, Any], settings: Mapping[str, Any], strings: Strings) -> Rollout:
    error = record.get("error")
    reward = _number(record.get("reward"))
    metrics_raw = record.get("metrics") or {}
    masked, failure_kind, failure_reason = _masking(record, metrics_raw, record.get("gym_result"))
    status = _status(error, reward, masked)
    trace = record.get("trace")
    if isinstance(trace, list) and trace:
        transcript = from_policy_calls([c for c in trace if isinstance(c, Mapping)], strings)
    else:
        transcript = from_messages(record.get("prompt") or [], record.get("completion") or [], strings)
    usage = record.get("usage") or {}
    timing = record.get("timing") or {}
    example_id = record.get("example_id")
    rollout = Rollout(
        env=str(record.get("env") or settings.get("nemo_env") or settings.get("env") or "?"),
        task=str(example_id if example_id not in (None, "") else record["task_index"]),
        rollout_index=int(record["rollout_index"]),
        status=status,
        reward=reward,
        metrics=_metrics(metrics_raw),
        input_tokens=_count(usage.get("input_tokens")),
        output_tokens=_count(usage.get("output_tokens")),
        latency_s=_number(timing.get("rollout_s")),
        recorded_reward=_number(record.get("recorded_reward")),
        transcript=transcript,
        token_ids=record_token_ids(record),
    )
    return _finished(rollout, error, failure_kind, failure_reason)


def _fill_error(rollout: Rollout, error: Any, failure_kind: str | None, failure_reason: str | None) -> None:
    if rollout.status == "error":
        if isinstance(error, Mapping):
            rollout.kind, rollout.message = str(error.get("type") or "error"), str(error.get("message") or "")
        else:
            rollout.kind, rollout.message = "error", str(error or "the rollout has no reward")
    elif failure_kind or failure_reason or rollout.status == "masked":
        rollout.kind = failure_kind or ("masked" if rollout.status == "masked" else None)
        rollout.message = failure_reason


def _count_turns(rollout: Rollout) -> None:
    messages, calls = rollout.transcript["m"], rollout.transcript["c"]
    replies = {m["k"] for m in messages if "k" in m}
    rollout.turns = len(calls) or len(replies)
    rollout.tool_calls = sum(len(m.get("tc") or ()) for m in messages)


def _max_repeats(rollouts: list[Rollout]) -> int:
    counts = Counter((r.env, r.task) for r in rollouts)
    return max(counts.values()) if counts else 1


def _rounded(value: Any) -> float | None:
    return round(float(value), 2) if isinstance(value, int | float) else None


# -- verifiers' traces -------------------------------------------------------------------------------


def _load_traces(path: Path, strings: Strings) -> Run:
    notes: list[str] = []
    if path.stat().st_size == 0:
        raise ReportError(f"{path} is empty: the verifiers run saved no episode yet.")
    rollouts: list[Rollout] = []
    repeats: Counter[tuple[str, str]] = Counter()
    versions: set[str] = set()
    models: set[str] = set()
    for _line, episode in _read_jsonl(path, notes):
        task_data = ((episode.get("task") or {}).get("data")) or {}
        for trace in episode.get("traces") or []:
            if not isinstance(trace, Mapping):
                continue
            rollout = _rollout_of_trace(episode, task_data, trace, strings, repeats)
            rollouts.append(rollout)
            version = (trace.get("verifiers") or {}).get("version")
            if version:
                versions.add(str(version))
            model = ((trace.get("agent") or {}).get("config") or {}).get("model")
            if model:
                models.add(str(model))
    if not rollouts:
        raise ReportError(f"{path} holds no complete episode with a trace (the run saved none).")
    config = _read_json(path.parent / "configs" / "resolved" / "eval.json", notes)
    taskset = ((config.get("env") or {}).get("taskset")) or {}
    client = config.get("client") or {}
    harness = ((config.get("env") or {}).get("agent") or {}).get("harness") or {}
    info = {
        "source": "vf-eval (verifiers traces.jsonl)",
        "environment": taskset.get("nemo_env") or ", ".join(sorted({r.env for r in rollouts})),
        "model": config.get("model") or ", ".join(sorted(models)) or None,
        "endpoint": client.get("base_url"),
        "api": harness.get("api"),
        "sampling args": {k: v for k, v in (config.get("sampling") or {}).items() if v is not None} or None,
        "rollouts per example": config.get("num_rollouts"),
        "verifiers": ", ".join(sorted(versions)) or None,
        "nemo-gym": "not recorded by verifiers",
        "run": ((config.get("run") or {}).get("name")) or path.parent.name,
        "folder": str(path.parent),
        "token IDs": _token_ids_info(rollouts, exact_tokens=False, fix=VERIFIERS_FIX),
    }
    return Run(
        path=path.parent,
        source="vf-eval",
        label=path.parent.name,
        info={k: v for k, v in info.items() if v not in (None, "", {})},
        rollouts=rollouts,
        rollouts_per_example=int(config.get("num_rollouts") or _max_repeats(rollouts)),
        notes=notes,
        strings=strings,
    )


def _rollout_of_trace(
    episode: Mapping[str, Any],
    task_data: Mapping[str, Any],
    trace: Mapping[str, Any],
    strings: Strings,
    repeats: Counter[tuple[str, str]],
) -> Rollout:
    gym = ((trace.get("info") or {}).get("nemo_gym")) or {}
    env = str(gym.get("env") or task_data.get("nemo_env") or (episode.get("env") or {}).get("id") or "?")
    task_id = task_data.get("id", task_data.get("idx", (episode.get("task") or {}).get("key", "?")))
    task = str(task_id)
    rollout_index = repeats[(env, task)]
    repeats[(env, task)] += 1
    rewards = trace.get("rewards") or {}
    reward = _number(gym.get("reward"))
    if reward is None and "reward" not in gym:
        scores = [
            (v.get("score"), v.get("weight", 1.0)) if isinstance(v, Mapping) else (v, 1.0) for v in rewards.values()
        ]
        numbers = [(s, w) for s, w in scores if _number(s) is not None and _number(w) is not None]
        reward = math.fsum(s * w for s, w in numbers) if numbers else None
    errors = [e for e in trace.get("errors") or [] if isinstance(e, Mapping)]
    error: Any = gym.get("error") or (errors[0] if errors else None)
    if not error and trace.get("ok") is False:
        error = {"type": "error", "message": "verifiers marked the trace failed"}
    masked, failure_kind, failure_reason = _masking(gym, gym.get("metrics"), trace.get("metrics"))
    if error:
        reward = None
    transcript = from_trace_nodes(trace, strings)
    timing = gym.get("timing") or {}
    latency = _number(timing.get("rollout_s"))
    if latency is None:
        agent = (trace.get("timing") or {}).get("agent") or {}
        if _number(agent.get("end")) is not None and _number(agent.get("start")) is not None:
            latency = float(agent["end"]) - float(agent["start"])
    rollout = Rollout(
        env=env,
        task=task,
        rollout_index=rollout_index,
        status=_status(error, reward, masked),
        reward=reward,
        metrics=_metrics(trace.get("metrics") or gym.get("metrics")),
        input_tokens=_count(trace.get("num_input_tokens")),
        output_tokens=_count(trace.get("num_output_tokens")),
        latency_s=latency,
        recorded_reward=_number(task_data.get("recorded_reward")),
        transcript=transcript,
        token_ids=gym.get("token_ids") if isinstance(gym.get("token_ids"), Mapping) else None,
    )
    return _finished(rollout, error, failure_kind, failure_reason)


def _token_ids_info(rollouts: list[Rollout], *, exact_tokens: bool, fix: str | None = None) -> str | None:
    """The run's token-ID figures as the summary words them (None when no rollout recorded token IDs)."""
    records = [{"task_index": r.task, "rollout_index": r.rollout_index, "token_ids": r.token_ids} for r in rollouts]
    summary = summarize_token_ids(records, exact_tokens=exact_tokens, **({"fix": fix} if fix else {}))
    return describe_token_ids(summary) if summary is not None else None


def _read_json(path: Path, notes: list[str]) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        notes.append(f"{path.name} could not be read ({exc})")
        return {}
    return value if isinstance(value, dict) else {}


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _finished(rollout: Rollout, error: Any, failure_kind: Any, failure_reason: Any) -> Rollout:
    """``rollout`` with its error (or failure), turns and per-call latencies filled in."""
    _fill_error(rollout, error, failure_kind, failure_reason)
    _count_turns(rollout)
    rollout.call_latencies = [c["lat"] for c in rollout.transcript["c"] if isinstance(c.get("lat"), float)]
    return rollout
