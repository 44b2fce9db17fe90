"""Saved eval runs read into one shape, streamed: our run folders (``results.jsonl`` + ``metadata.json``) and
verifiers' eval folders (``traces.jsonl``, from ``vf-eval nemo-gym-env`` or a prime-rl eval).

``load_run`` reads the run's file once, a rollout at a time (``source``), into its figures (``tally``) and the
choice of rollouts the report embeds (``selection``); only those are read again, from where they are, when the
report is written. Nothing is held per rollout.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._eval.token_ids import VERIFIERS_FIX, TokenIdsTally, describe_token_ids
from .errors import ReportError
from .records import Rollout
from .selection import DEFAULT_MAX_ROLLOUTS, RolloutChoice
from .source import RESULTS_FILE, TRACES_FILE, RolloutSource
from .tally import RunTally
from .transcript import Strings

METADATA_FILE = "metadata.json"

__all__ = ["METADATA_FILE", "RESULTS_FILE", "TRACES_FILE", "ReportError", "Rollout", "Run", "load_run"]


@dataclass
class Run:
    """One saved run: where it came from, what ran, its figures and the rollouts it shows."""

    path: Path
    source: str
    """``verifiers-nemo eval`` or ``vf-eval`` (verifiers' traces)."""
    label: str
    info: dict[str, Any]
    """Model, endpoint, sampling args, versions, environments, status: shown as they are."""
    tally: RunTally
    reader: RolloutSource
    choice: RolloutChoice
    rollouts_per_example: int
    pass_threshold: float = 0.5
    judges: dict[str, dict[str, Any]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def envs(self) -> list[str]:
        return self.tally.envs

    @property
    def total(self) -> int:
        """Rollouts in the run (each (task, rollout) pair once)."""
        return self.tally.overall.rollouts

    def shown(self, strings: Strings | None = None) -> Iterator[Rollout]:
        """The rollouts the report embeds (all of a small run), in file order, read back one at a time with their
        transcripts' long texts in ``strings``."""
        for where in self.choice.chosen():
            yield self.reader.read(where, strings)

    def rollouts(self) -> Iterator[Rollout]:
        """Every rollout of the run, read again in file order (transcripts without a string table)."""
        for rollout, _ in self.reader.scan([]):
            yield rollout


def load_run(path: Path, *, max_rollouts: int | None = DEFAULT_MAX_ROLLOUTS, keep_tasks: bool = False) -> Run:
    """The run saved at ``path``: a run folder of either kind, or its ``results.jsonl`` / ``traces.jsonl``.

    ``max_rollouts``: how many rollouts it shows (``selection``; None: all). ``keep_tasks``: keep each task's
    scores, to compare it with other runs task by task."""
    path = Path(path)
    if not path.exists():
        raise ReportError(f"{path} does not exist.")
    options = {"max_rollouts": max_rollouts, "keep_tasks": keep_tasks}
    if path.is_file():
        if path.name == TRACES_FILE:
            return _load_traces(path, **options)  # type: ignore[arg-type]
        if path.name in (RESULTS_FILE, METADATA_FILE):
            return _load_results(path.parent, **options)  # type: ignore[arg-type]
        raise ReportError(f"{path} is a file but neither {RESULTS_FILE} nor {TRACES_FILE}: pass the run folder.")
    if (path / RESULTS_FILE).exists() or (path / METADATA_FILE).exists():
        return _load_results(path, **options)  # type: ignore[arg-type]
    if (path / TRACES_FILE).exists():
        return _load_traces(path / TRACES_FILE, **options)  # type: ignore[arg-type]
    inner = sorted(
        {p.parent for name in (METADATA_FILE, TRACES_FILE) for p in path.glob(f"*/{name}")}
        | {p.parent for name in (METADATA_FILE, TRACES_FILE) for p in path.glob(f"*/*/{name}")}
    )
    if len(inner) == 1:
        return load_run(inner[0], **options)  # type: ignore[arg-type]
    hint = ""
    if inner:
        shown = ", ".join(str(p.relative_to(path)) for p in inner[-8:])
        hint = f" It holds {len(inner)} runs ({shown}); pass the ones to report."
    raise ReportError(
        f"{path} is neither a verifiers-nemo run folder ({RESULTS_FILE} + {METADATA_FILE}, from "
        f"`verifiers-nemo eval -s`) nor a verifiers eval folder ({TRACES_FILE}, from vf-eval).{hint}"
    )


def _read(
    reader: RolloutSource, tally: RunTally, choice: RolloutChoice, token_ids: TokenIdsTally, notes: list[str]
) -> None:
    """Stream the run's rollouts into its figures, its choice of rollouts to show and its token-ID figures."""
    for rollout, where in reader.scan(notes):
        tally.add(rollout)
        choice.offer(rollout, where)
        token_ids.add(
            {"task_index": rollout.task, "rollout_index": rollout.rollout_index, "token_ids": rollout.token_ids}
        )
    tally.finish()


# -- our run folders ---------------------------------------------------------------------------------


def _load_results(folder: Path, *, max_rollouts: int | None, keep_tasks: bool) -> Run:
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
    repeats = settings.get("rollouts_per_example")
    complete_at = repeats if isinstance(repeats, int) and not isinstance(repeats, bool) and repeats > 0 else None
    threshold = float(settings.get("pass_threshold") if settings.get("pass_threshold") is not None else 0.5)
    reader = RolloutSource(
        results, default_env=str(settings.get("nemo_env") or settings.get("env") or "?"), complete_at=complete_at
    )
    tally = RunTally(threshold, complete_at=complete_at, keep_tasks=keep_tasks)
    choice = RolloutChoice(max_rollouts)
    token_ids = TokenIdsTally(exact_tokens=bool(settings.get("exact_tokens")))
    _read(reader, tally, choice, token_ids, notes)
    if reader.duplicates:
        notes.append(f"{reader.duplicates} duplicate lines of {RESULTS_FILE} left out (the first of each counts)")
    if not choice.offered:
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
    info["token IDs"] = _token_ids_info(token_ids)
    info |= gym_metric_entries(summary.get("gym_metrics") or {})
    return Run(
        path=folder,
        source="verifiers-nemo eval",
        label=f"{folder.parent.name}/{folder.name}" if metadata else folder.name,
        info={k: v for k, v in info.items() if v not in (None, "", {})},
        tally=tally,
        reader=reader,
        choice=choice,
        rollouts_per_example=int(complete_at or tally.max_repeats),
        pass_threshold=threshold,
        judges=dict(summary.get("judges") or {}),
        notes=notes,
    )


def gym_metric_entries(gym_metrics: dict[str, Any]) -> dict[str, Any]:
    """The environment's own key metrics (its ``/aggregate_metrics``, kept in ``metadata.json``) as run facts, one
    per metric, named alike in every run so runs compared show them side by side."""
    entries: dict[str, Any] = {}
    several = len(gym_metrics) > 1 or any(len(agents) > 1 for agents in gym_metrics.values())
    for env, agents in gym_metrics.items():
        for agent, answer in (agents or {}).items():
            where = f" ({env}, {agent})" if several else ""
            if not isinstance(answer, dict) or "error" in answer:
                why = answer.get("error") if isinstance(answer, dict) else answer
                entries[f"Gym metrics{where}"] = f"not available: {why}"
                continue
            for name, value in (answer.get("key_metrics") or {}).items():
                entries[f"Gym {name}{where}"] = round(value, 4) if isinstance(value, float) else value
    return entries


def _rounded(value: Any) -> float | None:
    return round(float(value), 2) if isinstance(value, int | float) else None


# -- verifiers' traces -------------------------------------------------------------------------------


def _load_traces(path: Path, *, max_rollouts: int | None, keep_tasks: bool) -> Run:
    notes: list[str] = []
    if path.stat().st_size == 0:
        raise ReportError(f"{path} is empty: the verifiers run saved no episode yet.")
    config = _read_json(path.parent / "configs" / "resolved" / "eval.json", notes)
    reader = RolloutSource(path)
    tally = RunTally(0.5, keep_tasks=keep_tasks)
    choice = RolloutChoice(max_rollouts)
    token_ids = TokenIdsTally(exact_tokens=False, fix=VERIFIERS_FIX)
    _read(reader, tally, choice, token_ids, notes)
    if not choice.offered:
        raise ReportError(f"{path} holds no complete episode with a trace (the run saved none).")
    taskset = ((config.get("env") or {}).get("taskset")) or {}
    client = config.get("client") or {}
    harness = ((config.get("env") or {}).get("agent") or {}).get("harness") or {}
    info = {
        "source": "vf-eval (verifiers traces.jsonl)",
        "environment": taskset.get("nemo_env") or ", ".join(tally.envs),
        "model": config.get("model") or ", ".join(sorted(reader.models)) or None,
        "endpoint": client.get("base_url"),
        "api": harness.get("api"),
        "sampling args": {k: v for k, v in (config.get("sampling") or {}).items() if v is not None} or None,
        "rollouts per example": config.get("num_rollouts"),
        "verifiers": ", ".join(sorted(reader.versions)) or None,
        "nemo-gym": "not recorded by verifiers",
        "run": ((config.get("run") or {}).get("name")) or path.parent.name,
        "folder": str(path.parent),
        "token IDs": _token_ids_info(token_ids),
    }
    return Run(
        path=path.parent,
        source="vf-eval",
        label=path.parent.name,
        info={k: v for k, v in info.items() if v not in (None, "", {})},
        tally=tally,
        reader=reader,
        choice=choice,
        rollouts_per_example=int(config.get("num_rollouts") or tally.max_repeats),
        notes=notes,
    )


def _token_ids_info(tally: TokenIdsTally) -> str | None:
    """The run's token-ID figures as the summary words them (None when no rollout recorded token IDs)."""
    summary = tally.summary()
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
