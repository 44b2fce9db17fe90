"""The policy versions a rollout's turns were sampled under, as the engine reported them.

An engine that labels its samples (vLLM 0.33's ``weight_versions``, read by renderers 0.1.13.dev17 and recorded by
verifiers' pre-release on each sampled node of the trace) says which weights sampled which completion tokens. Under
an asynchronous trainer the weights move while rollouts run, so one rollout's turns may come from several versions:
its off-policy turns. Nothing is said where the engine said nothing (no labelled turn: no record)."""

from __future__ import annotations

from typing import Any


def policy_versions(trace: Any) -> dict[str, Any] | None:
    """``{"oldest", "newest", "versions", "by_turn"}`` of a trace's sampled turns in call order (``by_turn``: each
    turn's versions, ``[]`` where the engine labelled none); None when no turn was labelled."""
    by_turn: list[list[str]] = []
    for call in getattr(trace, "calls", None) or ():
        node = trace.nodes[call.node] if call.node is not None else None
        spans = getattr(node, "weight_versions", None) or ()
        versions: list[str] = []
        for span in spans:
            version = str(span.version if hasattr(span, "version") else span["version"])
            if version not in versions:
                versions.append(version)
        by_turn.append(versions)
    seen = ordered([v for turn in by_turn for v in turn])
    if not seen:
        return None
    return {"oldest": seen[0], "newest": seen[-1], "versions": len(seen), "by_turn": by_turn}


def ordered(versions: list[str]) -> list[str]:
    """Distinct versions oldest first: as numbers where every one is an integer (a trainer's steps), else in the
    order the turns met them (a rollout's turns are sampled one after another)."""
    distinct = list(dict.fromkeys(versions))
    if all(v.lstrip("-").isdigit() for v in distinct):
        return sorted(distinct, key=int)
    return distinct


class PolicyVersionTally:
    """Over rollouts' ``policy_versions`` records: how many carry one, the oldest and newest version met, and how
    many rollouts' turns came from more than one version."""

    def __init__(self) -> None:
        self.labelled = 0
        self.across = 0
        self._seen: list[str] = []

    def add(self, record: Any) -> None:
        """Count one rollout's ``policy_versions`` record (anything else, e.g. None: a rollout the engine left
        unlabelled, is not counted)."""
        if not isinstance(record, dict) or "oldest" not in record:
            return
        self.labelled += 1
        self.across += int(record.get("versions") or 1) > 1
        for version in (str(record["oldest"]), str(record["newest"])):
            if version not in self._seen:
                self._seen.append(version)

    def summary(self) -> dict[str, Any] | None:
        """``{"labelled", "oldest", "newest", "across_versions"}``; None when no rollout carried a record."""
        if not self.labelled:
            return None
        seen = ordered(self._seen)
        return {"labelled": self.labelled, "oldest": seen[0], "newest": seen[-1], "across_versions": self.across}


def describe(summary: dict[str, Any], rollouts: int) -> str:
    """A tally's summary in words: ``policy versions 3..5 (8/8 rollouts labelled) · 2 across versions``."""
    span = summary["oldest"] if summary["oldest"] == summary["newest"] else f"{summary['oldest']}..{summary['newest']}"
    return (
        f"policy versions {span} ({summary['labelled']:,}/{rollouts:,} rollouts labelled) · "
        f"{summary['across_versions']:,} across versions"
    )
