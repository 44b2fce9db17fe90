"""The environment variables a Gym config's resources servers and agents read (``${oc.env:VAR}`` or
``${oc.env:VAR,default}``), found without importing nemo-gym or OmegaConf: what ``envs`` lists, and what a
stack passes to its own Gym processes even when the name looks like a secret (no other stack's processes
get it). Model server definitions are left out: those are judges, whose URLs and keys never reach Gym."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import RESPONSES_API_MODELS, merged_configs, server_entries

_OC_ENV = re.compile(r"\$\{\s*oc\.env\s*:\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?:,([^{}]*))?\}")
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
        for where, text in _strings(definition)
    )
    for where, text in texts:
        for match in _OC_ENV.finditer(text):
            name, default = match.group(1), match.group(2)
            found.setdefault(name, ConfigVariable(name, default.strip() if default is not None else None, where))
    return tuple(found.values())


def config_variable_names(config_paths: Sequence[Path]) -> tuple[str, ...]:
    """The environment variables the configs in ``config_paths`` read."""
    return tuple(v.name for v in config_variables(merged_configs([Path(p) for p in config_paths])))


def _strings(value: Any, path: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _strings(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _strings(item, f"{path}[{index}]")
