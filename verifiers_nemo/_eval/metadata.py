"""A run's ``metadata.json``: settings (no secrets), counts, sessions and the summary of its records."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .._exceptions import VerifiersNemoError
from .stats import timing_summary
from .tally import RunTally
from .token_ids import record_token_ids

if TYPE_CHECKING:
    from .results import ResultsFolder
    from .settings import EvalSettings


def slim_record(record: Mapping[str, Any]) -> dict[str, Any]:
    """What the summary needs of a result record (a trace can be large: a line saved before records carried
    ``token_ids`` gets them from its trace)."""
    keep = (
        "task_index",
        "rollout_index",
        "env",
        "reward",
        "metrics",
        "usage",
        "timing",
        "error",
        "recorded_reward",
        "masked",
        "failure_kind",
        "failure_reason",
    )
    slim = {k: record[k] for k in keep if k in record}
    token_ids = record_token_ids(record)
    if token_ids is not None:
        slim["token_ids"] = token_ids
    return slim


def run_metadata(
    base: Mapping[str, Any],
    settings: EvalSettings,
    folder: ResultsFolder | None,
    expected: int,
    records: RunTally | Iterable[Mapping[str, Any]],
    sessions: list[dict[str, Any]],
) -> dict[str, Any]:
    """The ``metadata.json`` of a run: ``base`` (what was saved) updated with these records (a ``RunTally`` of
    them, or the records) and sessions."""
    tally = records if isinstance(records, RunTally) else RunTally.of(records, settings)
    now = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    summary = tally.summary()
    current = sessions[-1] if sessions else {}
    summary["timing"] = timing_summary(sessions, current.get("wall_s") or 0.0)
    judges = _judges_over(sessions)
    if judges:
        summary["judges"] = judges
    outages = [outage for session in sessions for outage in session.get("replica_outages") or ()]
    if outages:
        summary["replicas"] = replicas_over(outages)
    order = ("rollouts", "reward", "reward_by_rollout_index", "pass_threshold", "pass_at_k", "pass_power_k")
    order += ("pass_k_examples", "metrics", "errors_by_type", "error_examples", "masked_by_kind", "masked_examples")
    order += ("usage", "latency", "timing", "replay", "by_env", "judges", "replicas", "token_ids", "training")
    if (base.get("summary") or {}).get("gym_metrics"):  # asked of a stack at the end of a session: kept till the next
        summary["gym_metrics"] = base["summary"]["gym_metrics"]
    order += ("gym_metrics",)
    summary = {key: summary[key] for key in order if key in summary}
    return {
        "run_id": folder.run_id if folder else None,
        "path": str(folder.path) if folder else None,
        "env": settings.nemo_env,
        "model": settings.model,
        "status": base.get("status"),
        "created_at": base.get("created_at") or now,
        "updated_at": now,
        "versions": base.get("versions") or run_versions(settings),
        **({"env_sources": sources} if (sources := base.get("env_sources") or env_sources(settings.env_names)) else {}),
        "settings": settings.to_dict(),
        "counts": {"expected": expected, "done": tally.count, "missing": max(0, expected - tally.count)},
        "sessions": sessions,
        "summary": summary,
    }


def env_sources(names: Iterable[str]) -> dict[str, dict[str, str]]:
    """Where each environment of yours in a run came from: ``{reference: {name, path, fingerprint}}`` (the
    fingerprint of its folder's files: a resume against changed code says so). Packaged ones are left out: the
    nemo-gym version names them."""
    from .._gym import env_label, is_path_reference, locate_environment
    from .._gym.tree import folder_fingerprint

    sources = {}
    for name in names:
        if not is_path_reference(name):
            continue
        try:
            directory, config = locate_environment(name)
        except VerifiersNemoError:  # gone since (a resume elsewhere): the saved entry stays, nothing new to say
            continue
        sources[name] = {
            "name": env_label(name),
            "path": str(config or directory),
            "fingerprint": folder_fingerprint(directory),
        }
    return sources


def sources_with_this_session(saved: Mapping[str, Any], names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """``saved`` (a run's ``env_sources``) with each folder's fingerprint now appended to its ``fingerprints`` when it
    changed: every version of the code a run's rollouts ran on, in order (``fingerprint`` stays the first)."""
    merged = {ref: dict(entry) for ref, entry in (saved or {}).items()}
    for ref, entry in env_sources(names).items():
        if ref not in merged:
            merged[ref] = entry
            continue
        seen = list(merged[ref].get("fingerprints") or [merged[ref].get("fingerprint")])
        if entry["fingerprint"] != seen[-1]:
            seen.append(entry["fingerprint"])
        if len(seen) > 1:
            merged[ref]["fingerprints"] = seen
    return merged


def changed_sources(saved: Mapping[str, Any], names: Iterable[str]) -> list[str]:
    """Notes on the environments of yours whose files changed (or are gone) since a run's first session."""
    notes = []
    now = env_sources(names)
    for ref, before in (saved or {}).items():
        after = now.get(ref)
        last = (before.get("fingerprints") or [before.get("fingerprint")])[-1]
        if after is None:
            notes.append(f"note: {before.get('path', ref)} is not there any more; the run's environment cannot start")
        elif after["fingerprint"] != last:
            notes.append(
                f"note: the files of {after['name']} ({after['path']}) changed since this run began (fingerprint "
                f"{last} → {after['fingerprint']}): the rollouts still to run use the new code, and the run's "
                "summary names every version it ran"
            )
    return notes


def replicas_over(outages: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per ``-b`` replica that was out of the rotation (sessions' ``replica_outages``, in order): how many times,
    for how long in all, whether it was still out when the run ended, and why it last left."""
    by_replica: dict[str, dict[str, Any]] = {}
    for outage in outages:
        entry = by_replica.setdefault(outage["replica"], {"replica": outage["replica"], "outages": 0, "seconds": 0.0})
        entry["outages"] += 1
        entry["seconds"] = round(entry["seconds"] + float(outage.get("seconds") or 0.0), 3)
        entry["still_down"] = not outage.get("rejoined", False)
        entry["reason"] = outage.get("reason")
    return list(by_replica.values())


def _judges_over(sessions: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Judge calls summed over the sessions, by judge name (the latest session's target)."""
    total: dict[str, dict[str, Any]] = {}
    for session in sessions:
        for name, entry in (session.get("judges") or {}).items():
            into = total.setdefault(name, {"target": entry.get("target"), "calls": 0, "failed": 0})
            into["target"] = entry.get("target") or into["target"]
            for key in ("calls", "failed", "input_tokens", "output_tokens"):
                into[key] = into.get(key, 0) + (entry.get(key) or 0)
    return total


def run_versions(settings: EvalSettings) -> dict[str, str | None]:
    """``versions()`` of the Gym runtime the run's settings name (``-a gym_python`` / ``gym_version``, else the
    environment's ``VERIFIERS_NEMO_GYM_PYTHON`` / ``VERIFIERS_NEMO_GYM_VERSION``)."""
    env_args = settings.env_args or {}
    return versions(env_args.get("gym_python"), settings.client_type, env_args.get("gym_version"))


def check_same_release(metadata: Mapping[str, Any], settings: EvalSettings, where: object) -> None:
    """Refuse (``ConfigurationError``) to resume the run saved in ``metadata`` (its folder: ``where``) on another
    nemo-gym release than it was started on: its environments, rows, agents and ``/verify`` are that release's.
    Metadata without ``versions`` (or a runtime not found yet) is not checked."""
    from .._exceptions import ConfigurationError

    saved = (metadata.get("versions") or {}).get("nemo-gym")
    here = run_versions(settings).get("nemo-gym") if saved else None
    if saved and here and here != saved:
        raise ConfigurationError(
            f"-R {where}: the run was started on nemo-gym {saved}, and the Gym runtime found here has nemo-gym "
            f"{here}; a resumed run keeps its nemo-gym release (its environments, rows and rewards are that "
            f"release's). Point VERIFIERS_NEMO_GYM_PYTHON at a Gym runtime with nemo-gym {saved} (or, where the "
            "run named one with -a gym_python, put that runtime at that path), or start a new run."
        )


def check_same_rows(metadata: Mapping[str, Any], expected: int, where: object) -> None:
    """Refuse (``ConfigurationError``) to resume the run saved in ``metadata`` when its data now gives another
    number of rollouts than it expected: the rows are not the ones it started with (another release's packaged
    data, a relative ``-a jsonl_path`` read from another folder, an edited file). Metadata without ``counts`` is
    not checked."""
    from .._exceptions import ConfigurationError

    counts = metadata.get("counts")
    before = counts.get("expected") if isinstance(counts, Mapping) else None
    if isinstance(before, int) and before != expected:
        raise ConfigurationError(
            f"-R {where}: the run expected {before} rollouts and its data now gives {expected}, so the rows it "
            "reads are not the ones it started with (another nemo-gym's packaged data, or a relative -a jsonl_path "
            "read from another folder: resume from the folder the run was started in). Start a new run for other "
            "data."
        )


def versions(
    gym_python: str | None = None, client_type: str = "eval", gym_version: str | None = None
) -> dict[str, str | None]:
    """This package's version and the Gym runtime's nemo-gym (wherever that runtime lives: ``gym_python``, else
    the managed one of ``gym_version``'s series); under the training client also verifiers' and renderers'."""
    from importlib.metadata import PackageNotFoundError, version

    from .._exceptions import GymRuntimeError
    from .._gym import find_gym_runtime

    try:
        ours: str | None = version("verifiers-nemo")
    except PackageNotFoundError:
        ours = None
    try:
        gym: str | None = find_gym_runtime(gym_python, build=False, gym_version=gym_version).nemo_gym_version
    except GymRuntimeError:
        gym = None
    found: dict[str, str | None] = {"verifiers-nemo": ours, "nemo-gym": gym}
    if client_type == "train":
        for name in ("verifiers", "renderers"):
            try:
                found[name] = version(name)
            except PackageNotFoundError:
                found[name] = None
    return found
