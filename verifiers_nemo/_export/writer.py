"""``TrainingDataWriter``: rollouts in, one training-data file out (JSONL or Parquet), written as the rollouts come, in
bounded memory; ``export_training_data`` runs a saved run (or any results) through one. ``verifiers-nemo export RUN_DIR
--format ...`` is that function."""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._exceptions import ConfigurationError
from .._result import RolloutResult
from .formats import (
    GroupFigures,
    PairOptions,
    group_row,
    pairs_of,
    preference_row,
    sft_message_row,
    sft_token_rows,
)
from .grouping import DEFAULT_MEMORY, TaskGroups
from .options import DEFAULT_MIN_GAP, DEFAULT_PAIRING, FORMATS, GROUPED, PAIRINGS, Pairing
from .rollouts import ERROR, MASKED, SCORED, calls_tools, rollout_of, weight
from .saved_run import SavedRun
from .schema import COLUMNS, FORMAT_VERSION, MESSAGES_DOC
from .sinks import Sink

TRACE_FIX = (
    "record them with eval --save-trace plus --return-tokens (vLLM's token IDs) or --exact-tokens (training-exact); "
    "in Python, Endpoint(return_tokens=True) or Endpoint(exact_tokens=True)"
)


@dataclass
class ExportReport:
    """What an export wrote: the file, its format, its rows, the rollouts read and why some gave no row (``skipped``:
    reason → rollouts), and the format's own figures (``details``: rollouts cut into several samples, tasks, pairs
    without exact tokens...)."""

    path: Path
    format: str
    rows: int
    rollouts: int
    skipped: dict[str, int] = field(default_factory=dict)
    details: dict[str, int] = field(default_factory=dict)

    def describe(self) -> str:
        """One line: ``sft-tokens: 12 rows from 10 rollouts (...); left out: 3 error, 1 masked``."""
        unit = {"sft-tokens": "samples", "preferences": "pairs"}.get(self.format, "rows")
        text = f"{self.format}: {self.rows:,} {unit} from {self.rollouts:,} rollouts"
        notes = [f"{name.replace('_', ' ')}: {count:,}" for name, count in self.details.items() if count]
        if notes:
            text += f" ({', '.join(notes)})"
        if self.skipped:
            text += "; left out: " + ", ".join(_reason(reason, n) for reason, n in self.skipped.items())
        return text


def _reason(reason: str, count: int) -> str:
    """``error:timeout`` → ``3 failed (timeout)``; ``below_min_reward`` → ``2 below min reward``."""
    if reason.startswith("error:"):
        return f"{count:,} failed ({reason[6:]})"
    return f"{count:,} {reason.replace('_', ' ')}"


def _why_not(rollout: Mapping[str, Any]) -> str:
    """The ``skipped`` key of a rollout that is not scored: ``error:<type>`` or ``masked``."""
    return f"error:{rollout['error_type']}" if rollout["status"] == ERROR else MASKED


class TrainingDataWriter:
    """Writes rollouts to ``path`` (``.jsonl`` or ``.parquet``) as training data of one ``format`` (``FORMATS``), as
    they come: ``add`` a ``RolloutResult`` (a live one, from your own loop) or a ``results.jsonl`` line, then
    ``close()``; as a context manager it closes itself, or discards the file when the block raises. The file replaces
    ``path`` only when it is complete.

    Which rollouts give rows: by default the scored ones (``include_masked`` / ``include_errors`` add masked and failed
    ones as typed rows, their ``status`` and ``error_type`` set, never a reward of 0), with a reward of at least
    ``min_reward`` and at most ``max_reward``. ``preferences`` pairs scored rollouts of one task (``pairs``,
    ``min_gap``, ``max_pairs_per_task``; ``min_reward`` bounds the chosen one). The grouped formats (``preferences``,
    ``rollout-groups``) hold a task's rollouts until it has ``rollouts_per_task`` of them (None: to the end), at most
    ``group_memory`` bytes of them before the rest goes to disk beside ``path``. ``model`` and ``run_id`` fill those
    columns (default: the endpoint label's model, and none); ``source`` is written into the file's description."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        format: str,
        *,
        min_reward: float | None = None,
        max_reward: float | None = None,
        include_masked: bool = False,
        include_errors: bool = False,
        pairs: Pairing = DEFAULT_PAIRING,
        min_gap: float = DEFAULT_MIN_GAP,
        max_pairs_per_task: int | None = None,
        rollouts_per_task: int | None = None,
        model: str | None = None,
        run_id: str | None = None,
        source: Mapping[str, Any] | None = None,
        group_memory: int = DEFAULT_MEMORY,
    ) -> None:
        _check_options(format, pairs, min_gap, max_reward, include_masked, include_errors, max_pairs_per_task)
        self.format = format
        self.model, self.run_id = model, run_id
        self.min_reward, self.max_reward = min_reward, max_reward
        self.keep = {SCORED} | ({MASKED} if include_masked else set()) | ({ERROR} if include_errors else set())
        self.pairing = PairOptions(pairs, min_gap, min_reward, max_pairs_per_task)
        self.options = {
            "min_reward": min_reward,
            "max_reward": max_reward,
            "include_masked": include_masked,
            "include_errors": include_errors,
            **(
                {"pairs": pairs, "min_gap": min_gap, "max_pairs_per_task": max_pairs_per_task}
                if format == "preferences"
                else {}
            ),
        }
        self.rollouts = 0
        self.skipped: Counter[str] = Counter()
        self.details: Counter[str] = Counter()
        self._traced = self._tokens = False
        self._source = dict(source or {})
        self._sink = Sink(Path(path), format, {})
        self._groups = (
            TaskGroups(rollouts_per_task, memory=group_memory, weight=weight, spill_dir=Path(path).parent)
            if format in GROUPED
            else None
        )
        self._closed = False
        self.report: ExportReport | None = None
        """What was written, once ``close()`` (or the end of the ``with`` block) wrote it."""

    def add(self, result: RolloutResult | Mapping[str, Any]) -> None:
        """Take one rollout: a ``RolloutResult`` or a ``results.jsonl`` line (a dict)."""
        if self._closed:
            raise ConfigurationError("this TrainingDataWriter is closed.")
        record = (
            result.to_dict(include_trace=True, include_gym_result=True) if isinstance(result, RolloutResult) else result
        )
        if not isinstance(record, Mapping) or "task_index" not in record or "rollout_index" not in record:
            raise ConfigurationError(
                f"TrainingDataWriter.add takes a RolloutResult or a results.jsonl line (a dict with task_index and "
                f"rollout_index), not {type(record).__name__}."
            )
        rollout = rollout_of(record, self.model, self.run_id)
        self.rollouts += 1
        self._traced |= rollout["tools_known"]
        self._tokens |= rollout["samples"] is not None
        if self.format != "sft-tokens" and not rollout["tools_known"] and calls_tools(rollout):
            raise ConfigurationError(
                f"task {rollout['task_index']} rollout {rollout['rollout_index']} calls tools, but the results hold "
                "no tool definitions (a chat template needs them to render the calls): save the run with eval "
                "--save-trace, which keeps them (Gym's own record of each rollout)."
            )
        if self._groups is not None:
            group = self._groups.add(rollout)
            if group is not None:
                self._write_group(group)
        elif self._wanted(rollout):
            if self.format == "sft-tokens":
                self._write_samples(rollout)
            else:
                self._sink.write(*sft_message_row(rollout))

    def _wanted(self, rollout: Mapping[str, Any]) -> bool:
        """Whether the filters keep the rollout (else counted in ``skipped`` by why)."""
        if rollout["status"] not in self.keep:
            self.skipped[_why_not(rollout)] += 1
            return False
        reward = rollout["reward"]
        if self.min_reward is not None and (reward is None or reward < self.min_reward):
            self.skipped["below_min_reward"] += 1
            return False
        if self.max_reward is not None and (reward is None or reward > self.max_reward):
            self.skipped["above_max_reward"] += 1
            return False
        return True

    def _write_samples(self, rollout: Mapping[str, Any]) -> None:
        if rollout["samples"] is None:
            self.skipped["no_token_ids"] += 1
            return
        if not rollout["samples"]:
            self.skipped["no_answered_call"] += 1
            return
        if len(rollout["samples"]) > 1:
            self.details["rollouts_cut_where_tokens_broke"] += 1
        for row, cells in sft_token_rows(rollout):
            self._sink.write(row, cells)

    def _write_group(self, group: list[dict[str, Any]]) -> None:
        self.details["tasks"] += 1
        if self.format == "rollout-groups":
            figures = GroupFigures.of(group)
            for rollout in group:
                if self._wanted(rollout):
                    self._sink.write(*group_row(rollout, figures))
            return
        for rollout in group:
            if rollout["status"] != SCORED:
                self.skipped[_why_not(rollout)] += 1
        pairs = pairs_of(group, self.pairing)
        if not pairs:
            self.details["tasks_without_a_pair"] += 1
        for chosen, rejected in pairs:
            row, exact, cells = preference_row(chosen, rejected)
            if not exact:
                self.details["pairs_without_exact_tokens"] += 1
            self._sink.write(row, cells)

    def close(self) -> ExportReport:
        """Write what is still held, finish the file and put it in place; what was written."""
        if self._closed:
            raise ConfigurationError("this TrainingDataWriter is closed.")
        try:
            if self._groups is not None:
                for group in self._groups.finish():
                    self._write_group(group)
                if self._groups.duplicates:
                    self.details["duplicate_rollouts_ignored"] += self._groups.duplicates
            if self.format == "sft-tokens" and self.rollouts and not self._tokens:
                raise ConfigurationError(self._no_tokens_message())
            self._sink.description = self._description()
            path = self._sink.commit()
        except BaseException:
            self.discard()
            raise
        self._closed = True
        self.report = ExportReport(
            path, self.format, self._sink.rows, self.rollouts, dict(self.skipped), dict(self.details)
        )
        return self.report

    def _no_tokens_message(self) -> str:
        if not self._traced:
            return (
                "sft-tokens needs each policy call's token IDs, and these results hold no policy calls (the run was "
                f"saved without --save-trace): {TRACE_FIX}."
            )
        return f"sft-tokens needs each policy call's token IDs, and no call of these results recorded any: {TRACE_FIX}."

    def discard(self) -> None:
        """Drop the file being written (``path`` is left as it was)."""
        self._closed = True
        if self._groups is not None:
            self._groups.close()
        self._sink.discard()

    def _description(self) -> dict[str, Any]:
        from importlib.metadata import PackageNotFoundError, version

        try:
            producer = f"verifiers-nemo {version('verifiers-nemo')}"
        except PackageNotFoundError:  # pragma: no cover - a checkout run without installing
            producer = "verifiers-nemo"
        return {
            "format": self.format,
            "format_version": FORMAT_VERSION,
            "producer": producer,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "source": self._source,
            "options": self.options,
            "counts": {
                "rows": self._sink.rows,
                "rollouts": self.rollouts,
                "skipped": dict(self.skipped),
                **self.details,
            },
            "columns": [column.to_dict() for column in COLUMNS[self.format]],
            "messages": MESSAGES_DOC,
        }

    def __enter__(self) -> TrainingDataWriter:
        return self

    def __exit__(self, kind: Any, *_: Any) -> None:
        if kind is not None:
            self.discard()
        elif not self._closed:
            self.close()


def _check_options(
    format: str,
    pairs: str,
    min_gap: float,
    max_reward: float | None,
    include_masked: bool,
    include_errors: bool,
    max_pairs: int | None,
) -> None:
    if format not in FORMATS:
        raise ConfigurationError(f"unknown training-data format {format!r}; choose one of {', '.join(FORMATS)}.")
    if pairs not in PAIRINGS:
        raise ConfigurationError(f"unknown pairing {pairs!r}; choose one of {', '.join(PAIRINGS)}.")
    if min_gap < 0 or (max_pairs is not None and max_pairs < 1):
        raise ConfigurationError("min_gap (--min-gap) is at least 0 and max_pairs_per_task (--max-pairs) at least 1.")
    if format == "preferences":
        for name, given in (("max_reward (--max-reward)", max_reward is not None), ("include_masked (--include-masked)",
                            include_masked), ("include_errors (--include-errors)", include_errors)):  # fmt: skip
            if given:
                raise ConfigurationError(
                    f"{name} does not apply to preferences: pairs are made of scored rollouts (min_reward bounds the "
                    "chosen one, min_gap the gap)."
                )
    elif pairs != DEFAULT_PAIRING or min_gap != DEFAULT_MIN_GAP or max_pairs is not None:
        raise ConfigurationError(
            "pairs, min_gap and max_pairs_per_task (--pairs, --min-gap, --max-pairs) apply to preferences, "
            f"not {format}."
        )


def export_training_data(
    source: str | os.PathLike[str] | SavedRun | Iterable[RolloutResult | Mapping[str, Any]],
    path: str | os.PathLike[str],
    format: str,
    **options: Any,
) -> ExportReport:
    """Write ``source`` to ``path`` as training data of ``format`` and say what was written. ``source``: a saved run
    (its folder, or a ``SavedRun``), or any iterable of ``RolloutResult`` objects or ``results.jsonl`` lines.
    ``options``: ``TrainingDataWriter``'s (a saved run fills ``model``, ``run_id``, ``rollouts_per_task`` and
    ``source`` itself). A run saved without what the format needs is refused before anything is written, naming
    the flag that records it."""
    if isinstance(source, str | os.PathLike):
        source = SavedRun(source)
    if isinstance(source, SavedRun):
        _check_saved(source, format)
        options.setdefault("model", source.model)
        options.setdefault("run_id", source.run_id)
        options.setdefault("rollouts_per_task", source.rollouts_per_task)
        options.setdefault(
            "source", {"run_dir": str(source.path), "run_id": source.run_id, "settings": source.settings}
        )
        records: Iterable[Any] = source.records()
    else:
        records = source
    with TrainingDataWriter(path, format, **options) as writer:
        for record in records:
            writer.add(record)
        report = writer.close()
    if isinstance(source, SavedRun) and source.duplicates:
        report.details["duplicate_rollouts_ignored"] = source.duplicates
    return report


def _check_saved(run: SavedRun, format: str) -> None:
    """Refuse a run whose settings say it lacks what ``format`` needs (the lines are checked again as they come)."""
    settings = run.settings
    if format != "sft-tokens" or not settings:
        return
    if not settings.get("save_trace"):
        raise ConfigurationError(
            f"{run.path} was saved without --save-trace, so its results hold no policy calls and no token IDs; "
            f"sft-tokens needs them: {TRACE_FIX}. (--format sft-messages needs no token IDs.)"
        )
    if not (settings.get("exact_tokens") or (settings.get("sampling_args") or {}).get("return_tokens")):
        raise ConfigurationError(
            f"{run.path} was run without --return-tokens or --exact-tokens, so its policy calls hold no token IDs; "
            f"sft-tokens needs them: {TRACE_FIX}. (--format sft-messages needs no token IDs.)"
        )
