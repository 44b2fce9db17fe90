"""Where a Gym config's resources servers call a judge model, and the config rewritten so those calls reach
an address of ours instead.

A resources server names its judge with a ``*_model_server`` reference ``{type: responses_api_models,
name: N}``: ``N`` may be ``policy_model`` (the policy grades itself), a model server the config defines
(an ``openai_model`` or ``vllm_model`` holding the judge's URL and key), or a name nothing defines
(``genrm_model``, ``???``: the user is expected to add it). Gym's server client resolves ``N`` to
``http://host:port`` from the config and POSTs ``/v1/responses`` there; no route key travels with it.

``JudgePlan`` renames every such reference to a placeholder instance ``vnr_judge_<N>`` (whose host and
port the stack points at a judge port of our routing proxy) and drops the model servers defined for
those judges, so no Gym process ever holds a judge's URL or key. The rewritten files are plain copies
of the config YAML (the public seam nemo-gym reads), content-addressed in our cache.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .._gym.config import (
    POLICY_MODEL,
    RESOURCES_SERVERS,
    RESPONSES_API_MODELS,
    interpolations,
    load_config,
    merged_configs,
    server_entries,
)

PLACEHOLDER_PREFIX = "vnr_judge_"
_JUDGE_SWITCHES = ("should_use_judge", "use_judge", "enable_llm_judge")


@dataclass(frozen=True)
class JudgeRef:
    """One judge reference: ``server``'s (implementation ``implementation``) ``key`` names the model
    server ``target``."""

    server: str
    implementation: str
    key: str
    target: str

    @property
    def placeholder(self) -> str:
        """The instance name the reference is renamed to."""
        return placeholder_name(self.target)


def placeholder_name(target: str) -> str:
    return PLACEHOLDER_PREFIX + (re.sub(r"[^A-Za-z0-9_]+", "_", target).strip("_") or "unnamed")


def judge_refs(doc: Mapping[str, Any]) -> list[JudgeRef]:
    """The judge references of a config's resources servers (those switched off with ``should_use_judge``,
    ``use_judge`` or ``enable_llm_judge: false`` excluded, as ``classify_config`` reads them)."""
    refs = []
    for entry_name, kind, implementation, definition in server_entries(doc):
        if kind != RESOURCES_SERVERS or any(definition.get(flag) is False for flag in _JUDGE_SWITCHES):
            continue
        for key, value in definition.items():
            if (
                str(key).endswith("_model_server")
                and isinstance(value, Mapping)
                and value.get("type") == RESPONSES_API_MODELS
            ):
                refs.append(JudgeRef(entry_name, implementation, str(key), str(value.get("name"))))
    return refs


@dataclass(frozen=True)
class JudgePlan:
    """The judges of a stack's configs and the rewritten configs that send their calls to placeholders."""

    refs: tuple[JudgeRef, ...]
    config_paths: tuple[Path, ...]
    """The configs to launch: the originals, except those rewritten (in our cache)."""

    @property
    def targets(self) -> tuple[str, ...]:
        """The judge names, in order of first use (``policy_model`` included when the policy judges)."""
        return tuple(dict.fromkeys(ref.target for ref in self.refs))

    @property
    def placeholders(self) -> dict[str, str]:
        """Judge name → placeholder instance name."""
        return {target: placeholder_name(target) for target in self.targets}


def judge_names(doc: Mapping[str, Any]) -> list[str]:
    """The judges a config's resources servers call while scoring, in order, repeats included: the model
    servers their ``*_model_server`` references name (``policy_model`` included), and ``${VAR}`` for a
    ``judge_*`` key that interpolates a ``*_base_url`` (that server calls the URL itself: no seam).

    This is the one place the judge rule lives (``classify_config`` and the router read it here)."""
    names = [ref.target for ref in judge_refs(doc)]
    for _entry, kind, _implementation, definition in server_entries(doc):
        if kind != RESOURCES_SERVERS:
            continue
        for key, value in definition.items():
            if str(key).startswith("judge_") and isinstance(value, str):
                for resolver, var, _default in interpolations(value):
                    if resolver in ("", "oc.env", "oc.select") and var.endswith("_base_url"):
                        names.append("${" + var + "}")
    return names


def plan_judges(config_paths: Sequence[Path], cache: Path) -> JudgePlan:
    """Rewrite ``config_paths`` so every judge reference names its placeholder (see the module docs)."""
    merged = merged_configs(list(config_paths))
    refs = tuple(judge_refs(merged))
    if not refs:
        return JudgePlan((), tuple(config_paths))
    targets = {ref.target for ref in refs}
    paths = []
    for path in config_paths:
        doc = load_config(path)  # the configs it pulls in inlined: the copy is written elsewhere
        if _rewrite(doc, targets):
            paths.append(_write_cached(doc, path, cache))
        else:
            paths.append(path)
    return JudgePlan(refs, tuple(paths))


def _rewrite(doc: dict[str, Any], targets: set[str]) -> bool:
    """Rename judge references and drop judge model definitions in ``doc``; whether anything changed."""
    changed = False
    for ref in judge_refs(doc):
        definition = doc[ref.server][RESOURCES_SERVERS][ref.implementation]
        definition[ref.key] = {**definition[ref.key], "name": ref.placeholder}
        changed = True
    for name in list(doc):
        value = doc[name]
        if name in targets and name != POLICY_MODEL and isinstance(value, Mapping) and RESPONSES_API_MODELS in value:
            del doc[name]
            changed = True
    return changed


def _write_cached(doc: dict[str, Any], source: Path, cache: Path) -> Path:
    text = f"# {source} with its judge references renamed by verifiers-nemo\n" + yaml.safe_dump(
        doc, sort_keys=False, allow_unicode=True
    )
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    target = cache / f"{source.stem}-{digest}.yaml"
    if not target.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(f".{os.getpid()}.partial")
        partial.write_text(text)
        os.replace(partial, target)  # atomic: another process may be writing the same file
    return target
