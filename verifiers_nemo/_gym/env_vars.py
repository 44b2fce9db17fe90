"""The environment variables a Gym config's resources servers and agents read (``${oc.env:VAR}`` or
``${oc.env:VAR,default}``), found without importing nemo-gym or OmegaConf: what ``envs`` lists, and what a
stack passes to its own Gym processes even when the name looks like a secret (no other stack's processes
get it). Model server definitions are left out: those are judges, whose URLs and keys never reach Gym."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import RESPONSES_API_MODELS, config_strings, interpolations, merged_configs, server_entries

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Defaults that leave a value unset: the variable is then required.
_NO_VALUE = {"MISSING", "???"}


@dataclass(frozen=True)
class ConfigVariable:
    """One environment variable a config reads, and where."""

    name: str
    default: str | None
    """As written after the comma; None when the config gives none."""
    where: str
    """The dotted config path of the first value that reads it."""

    @property
    def required(self) -> bool:
        """The config has no usable value without it."""
        return self.default is None or self.default.strip().strip("'\"") in _NO_VALUE

    @property
    def is_set(self) -> bool:
        return bool(os.environ.get(self.name))


def config_variables(doc: Mapping[str, Any]) -> tuple[ConfigVariable, ...]:
    """Every environment variable the servers and agents of ``doc`` (a Gym config, or several merged) read,
    first use first."""
    found: dict[str, ConfigVariable] = {}
    texts = (
        (f"{entry}.{where}" if where else entry, text)
        for entry, kind, _, definition in server_entries(doc)
        if kind != RESPONSES_API_MODELS
        for where, text in config_strings(definition)
    )
    for where, text in texts:
        for resolver, name, default in interpolations(text):
            if resolver == "oc.env" and _NAME.fullmatch(name):
                found.setdefault(name, ConfigVariable(name, default, where))
    return tuple(found.values())


def config_variable_names(config_paths: Sequence[Path]) -> tuple[str, ...]:
    """The environment variables the configs in ``config_paths`` read."""
    return tuple(v.name for v in config_variables(merged_configs([Path(p) for p in config_paths])))
