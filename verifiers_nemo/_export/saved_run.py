"""``SavedRun``: a run folder of ``verifiers-nemo eval -s`` read back a rollout at a time, as ``RolloutResult`` objects
(their saved calls as ``PolicyCall`` objects) or as the lines themselves."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .._eval.results import METADATA_FILE, RESULTS_FILE, SavedResults
from .._exceptions import ConfigurationError
from .._report.source import _SeenPairs
from .._result import RolloutResult


class SavedRun:
    """A saved eval run: ``path`` is its folder (or its ``results.jsonl``). Iterating yields its rollouts as
    ``RolloutResult`` objects, read one line at a time (the file is never held whole); a (task, rollout) pair saved
    twice (a resumed run) counts once, its first line. ``training_samples(result.trace)`` rebuilds the training samples
    of a run saved with ``--save-trace``.

    ``metadata`` is its ``metadata.json`` (empty when the folder has none), ``settings`` the run's settings in it,
    ``model`` and ``rollouts_per_task`` what they say."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        path = Path(path)
        folder = path.parent if path.name == RESULTS_FILE else path
        if not folder.exists():
            raise ConfigurationError(
                f"{path} does not exist: pass the run folder `verifiers-nemo eval -s` wrote (it holds {RESULTS_FILE})."
            )
        if not (folder / RESULTS_FILE).is_file():
            runs = sorted(p.parent.name for p in folder.glob(f"*/{RESULTS_FILE}")) if folder.is_dir() else []
            hint = f" It holds runs: {', '.join(runs[-5:])}; pass one of them." if runs else ""
            raise ConfigurationError(
                f"{folder} holds no {RESULTS_FILE}, so it is no saved eval run (`verifiers-nemo eval -s` writes one)."
                f"{hint}"
            )
        self.path = folder
        self.results_path = folder / RESULTS_FILE
        self.metadata: dict[str, Any] = _read_json(folder / METADATA_FILE)
        self.settings: dict[str, Any] = dict(self.metadata.get("settings") or {})
        self.duplicates = 0
        """Lines of a (task, rollout) pair read before, skipped (counted by the last read)."""
        self._saved = SavedResults(self.results_path)

    @property
    def run_id(self) -> str:
        return str(self.metadata.get("run_id") or self.path.name)

    @property
    def model(self) -> str | None:
        model = self.metadata.get("model") or self.settings.get("model")
        return str(model) if model else None

    @property
    def rollouts_per_task(self) -> int | None:
        value = self.settings.get("rollouts_per_example")
        return int(value) if isinstance(value, int) and value > 0 else None

    @property
    def truncated(self) -> bool:
        """Whether the last read found the file's last line cut off (the run was stopped writing it): left out."""
        return self._saved.truncated

    def records(self) -> Iterator[dict[str, Any]]:
        """The saved lines as dicts, in file order (the first line of each (task, rollout) pair)."""
        seen = _SeenPairs(self.rollouts_per_task)
        self.duplicates = 0
        for record in self._saved:
            if not seen.add(record.get("env"), record["task_index"], record["rollout_index"]):
                self.duplicates += 1
                continue
            yield record

    def __iter__(self) -> Iterator[RolloutResult]:
        for record in self.records():
            yield RolloutResult.from_dict(record)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ConfigurationError(f"cannot read {path}: {exc}") from None
    return data if isinstance(data, dict) else {}
